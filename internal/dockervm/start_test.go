package dockervm

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/agentvm"
)

// step names a guest script, for the fake runner's record.
func step(script string) string {
	if strings.Contains(script, "/sys/block/") { // agentvm.MountDisk's
		return "mount"
	}
	switch script {
	case probeScript:
		return "probe"
	case pingScript:
		return "ping"
	case startScript:
		return "start"
	case tailScript:
		return "tail"
	}
	return "unknown"
}

// reply is one answer of the fake runner.
type reply struct {
	status int
	out    string
	err    error
}

// fakeRunner answers each step from its script of replies (the last one
// repeats) and records the steps and their arguments.
type fakeRunner struct {
	replies map[string][]reply
	steps   []string
	args    map[string][]string
}

func (f *fakeRunner) Run(_ context.Context, argv []string) (int, string, error) {
	if len(argv) < 4 || argv[0] != "sh" || argv[1] != "-c" || argv[3] != "sh" {
		return 0, "", fmt.Errorf("fake runner: unexpected argv %q", argv)
	}
	s := step(argv[2])
	f.steps = append(f.steps, s)
	if f.args == nil {
		f.args = map[string][]string{}
	}
	f.args[s] = argv[4:]
	rs := f.replies[s]
	if len(rs) == 0 {
		return 0, "", fmt.Errorf("fake runner: no reply for %s", s)
	}
	r := rs[0]
	if len(rs) > 1 {
		f.replies[s] = rs[1:]
	}
	return r.status, r.out, r.err
}

// count is how many times the fake ran step s.
func (f *fakeRunner) count(s string) int {
	n := 0
	for _, x := range f.steps {
		if x == s {
			n++
		}
	}
	return n
}

// fakeClock moves only when Start waits: After advances it by d and
// fires at once, so a test never sleeps.
type fakeClock struct {
	now    time.Time
	pauses []time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.pauses = append(c.pauses, d)
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

func newClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

// asError is err's *Error, or fails the test.
func asError(t *testing.T, err error) *Error {
	t.Helper()
	var de *Error
	if !errors.As(err, &de) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	return de
}

func TestStartNoDockerd(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{"probe": {{status: statusMissing, out: "dockerd\n"}}}}
	err := start(context.Background(), f, Options{}, newClock())
	de := asError(t, err)
	want := "docker: the image has no dockerd; use an image with docker.io, e.g. the microvm CI image (docs/ci.md)"
	if err.Error() != want || de.Log != "" {
		t.Errorf("error %q (log %q), want %q and no log", err, de.Log, want)
	}
	if !reflect.DeepEqual(f.steps, []string{"probe"}) {
		t.Errorf("steps %v, want probe alone: nothing mounted or started", f.steps)
	}
}

func TestStartNoShell(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{"probe": {{err: fmt.Errorf("sh: %w", agentvm.ErrNotInImage)}}}}
	err := start(context.Background(), f, Options{}, newClock())
	if de := asError(t, err); !strings.Contains(de.Reason, "the image has no sh;") {
		t.Errorf("reason %q, want the image has no sh", de.Reason)
	}
}

func TestStartUpAfterPolls(t *testing.T) {
	// One ping before mounting, then notYet after starting that find no
	// daemon yet, then the answer.
	const notYet = 4
	pings := []reply{{status: 1, out: "Cannot connect to the Docker daemon"}}
	for range notYet {
		pings = append(pings, reply{status: 1, out: "Cannot connect to the Docker daemon"})
	}
	pings = append(pings, reply{status: 0, out: "20.10.24+dfsg1\n"})
	f := &fakeRunner{replies: map[string][]reply{
		"probe": {{}}, "ping": pings, "mount": {{}}, "start": {{}},
	}}
	c := newClock()
	o := Options{Timeout: 30 * time.Second, DockerdArgs: []string{"--iptables=false", "--debug"}}
	if err := start(context.Background(), f, o, c); err != nil {
		t.Fatal(err)
	}
	want := []string{"probe", "ping", "mount", "start", "ping", "ping", "ping", "ping", "ping"}
	if !reflect.DeepEqual(f.steps, want) {
		t.Errorf("steps %v, want %v", f.steps, want)
	}
	wantPauses := []time.Duration{firstPoll, 2 * firstPoll, 4 * firstPoll, 8 * firstPoll}
	if !reflect.DeepEqual(c.pauses, wantPauses) {
		t.Errorf("pauses %v, want %v (backoff, no pause after the answer)", c.pauses, wantPauses)
	}
	if got, want := f.args["mount"], []string{DiskSerial, DataRoot}; !reflect.DeepEqual(got, want) {
		t.Errorf("mount's arguments %q, want %q", got, want)
	}
	if got, want := f.args["start"], []string{pidPath, LogPath, containerdSocket, "--iptables=false", "--debug"}; !reflect.DeepEqual(got, want) {
		t.Errorf("start's arguments %q, want %q", got, want)
	}
}

func TestStartAlreadyUp(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{"probe": {{}}, "ping": {{status: 0, out: "20.10.24\n"}}}}
	if err := start(context.Background(), f, Options{}, newClock()); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.steps, []string{"probe", "ping"}) {
		t.Errorf("steps %v: a daemon that answers is neither mounted over nor started again", f.steps)
	}
}

// longLog is a dockerd log of n lines, the last one longer than an
// Error keeps.
func longLog(n int) string {
	var b strings.Builder
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, "time=\"2026-01-01\" level=info msg=\"line %d\"\n", i)
	}
	b.WriteString("level=fatal msg=\"failed to start daemon: " + strings.Repeat("x", 1000) + "\"\n")
	return b.String()
}

func TestStartNeverUp(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{
		"probe": {{}}, "ping": {{status: 1}}, "mount": {{}}, "start": {{}},
		"tail": {{out: longLog(100)}},
	}}
	c := newClock()
	const timeout = 5 * time.Second
	err := start(context.Background(), f, Options{Timeout: timeout}, c)
	de := asError(t, err)
	if want := "dockerd did not answer within 5s"; de.Reason != want {
		t.Errorf("reason %q, want %q", de.Reason, want)
	}
	lines := strings.Split(de.Log, "\n")
	if len(lines) != logLines {
		t.Fatalf("log has %d lines, want %d:\n%s", len(lines), logLines, de.Log)
	}
	if want := "  time=\"2026-01-01\" level=info msg=\"line 81\""; lines[0] != want {
		t.Errorf("first log line %q, want %q (the log's end)", lines[0], want)
	}
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "  level=fatal") || len(last) != 2+logLineBytes+len("...") {
		t.Errorf("last log line %q (%d bytes), want the fatal line cut to %d bytes", last, len(last), logLineBytes)
	}
	if !strings.Contains(err.Error(), "; the end of "+LogPath+":\n  time=") {
		t.Errorf("error %q does not carry the log after its line", err)
	}
	var waited time.Duration
	for _, p := range c.pauses {
		if p > maxPoll {
			t.Errorf("pause %v longer than %v", p, maxPoll)
		}
		waited += p
	}
	if waited != timeout {
		t.Errorf("waited %v in all, want the timeout %v", waited, timeout)
	}
	// 20+40+...+320 ms, then 500 ms pauses: a bounded number of pings.
	if n := f.count("ping"); n > 20 {
		t.Errorf("%d pings in %v: the backoff does not bound them", n, timeout)
	}
	if n := f.count("tail"); n != 1 {
		t.Errorf("the log read %d times, want once", n)
	}
}

func TestStartExited(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{
		"probe": {{}}, "ping": {{status: 1}, {status: 1}, {status: statusExited}}, "mount": {{}}, "start": {{}},
		"tail": {{out: "level=error msg=\"failed to create NAT chain DOCKER\"\n"}},
	}}
	c := newClock()
	err := start(context.Background(), f, Options{}, c)
	de := asError(t, err)
	if de.Reason != "dockerd exited before it answered" || de.Log != "  level=error msg=\"failed to create NAT chain DOCKER\"" {
		t.Errorf("error %q", err)
	}
	if len(c.pauses) != 1 {
		t.Errorf("pauses %v: an exited dockerd is not waited for", c.pauses)
	}
}

func TestStartMountFailure(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{
		"probe": {{}}, "ping": {{status: 1}},
		"mount": {{status: 32, out: "mount: /var/lib/docker: wrong fs type, bad option, bad superblock on /dev/vdc.\n"}},
	}}
	err := start(context.Background(), f, Options{}, newClock())
	de := asError(t, err)
	want := "mounting the data disk at /var/lib/docker failed (status 32): mount: /var/lib/docker: wrong fs type, bad option, bad superblock on /dev/vdc."
	if de.Reason != want {
		t.Errorf("reason %q, want %q", de.Reason, want)
	}
	if f.count("start") != 0 {
		t.Errorf("steps %v: dockerd started without its data disk", f.steps)
	}
}

func TestStartFailedStart(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{
		"probe": {{}}, "ping": {{status: 1}}, "mount": {{}},
		"start": {{status: 1, out: "dockerd did not start: no pid in /run/microvm-dockerd.pid after 10s\n"}},
		"tail":  {{status: 1, out: "tail: cannot open '/var/log/dockerd.log' for reading: No such file or directory\n"}},
	}}
	err := start(context.Background(), f, Options{}, newClock())
	de := asError(t, err)
	if !strings.Contains(de.Reason, "no pid in /run/microvm-dockerd.pid") || !strings.Contains(de.Log, "cannot open") {
		t.Errorf("error %q", err)
	}
}

func TestStartAgentFailure(t *testing.T) {
	lost := errors.New("the agent: connection lost")
	f := &fakeRunner{replies: map[string][]reply{"probe": {{}}, "ping": {{err: lost}}}}
	err := start(context.Background(), f, Options{}, newClock())
	var de *Error
	if errors.As(err, &de) || !errors.Is(err, lost) {
		t.Errorf("error %v: the agent's failure is microvm's, wrapped, not Docker's *Error", err)
	}
}

func TestStartCancelled(t *testing.T) {
	f := &fakeRunner{replies: map[string][]reply{"probe": {{}}, "ping": {{status: 1}}, "mount": {{}}, "start": {{}}}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := start(ctx, f, Options{}, blockedClock{newClock()})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want the context's", err)
	}
}

// blockedClock's After never fires: only the context can end the wait.
type blockedClock struct{ *fakeClock }

func (blockedClock) After(time.Duration) <-chan time.Time { return nil }

func TestLogTail(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"\n\n", ""},
		{"a\n\nb\r\n", "  a\n  b"},
		{"one", "  one"},
	} {
		if got := logTail(tc.in); got != tc.want {
			t.Errorf("logTail(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
