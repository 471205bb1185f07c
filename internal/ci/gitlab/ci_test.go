package gitlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/guest/agent"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// TestJobEnvironment: a job's scripts get the image's environment (its
// PATH included), a usual PATH when it has none, and root's HOME.
func TestJobEnvironment(t *testing.T) {
	got := jobEnvironment(&vms.Process{Env: []string{"PATH=/usr/local/go/bin:/usr/bin", "GOPATH=/go", "HOME=/home/gopher"}})
	want := []string{"PATH=/usr/local/go/bin:/usr/bin", "GOPATH=/go", "HOME=/root"}
	if !slices.Equal(got, want) {
		t.Errorf("image with an environment: %q, want %q", got, want)
	}
	if got := jobEnvironment(nil); !slices.Equal(got, []string{"PATH=" + ciPath, "HOME=/root"}) {
		t.Errorf("no image defaults: %q", got)
	}
}

// TestWarmPoolOffers: the offer files without VMs behind them. An offer
// whose VM never came up is claimed once (the second claimer finds none),
// removed, and not taken; an offer older than the TTL is swept by the next
// cleanup's refill; a pool that is full boots nothing; drain takes what is
// left.
func TestWarmPoolOffers(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	args := []string{"--image", "x:1"}
	if err := writeJSON(offerPath("s1"), ciOffer{VM: "warm-s1", Args: args, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var msgs strings.Builder
	if got, _ := claimWarm("gitlab-1-1", "s1", args, 100*time.Millisecond, &msgs); got != "" {
		t.Errorf("claimed %q, a VM that never ran", got)
	}
	if !strings.Contains(msgs.String(), "not running after") {
		t.Errorf("claim said %q", msgs.String())
	}
	if got, _ := claimWarm("gitlab-1-2", "s1", args, 100*time.Millisecond, &msgs); got != "" {
		t.Errorf("second claim took %q from a claimed offer", got)
	}
	if left, _ := filepath.Glob(filepath.Join(ciPoolDir(), "*")); len(left) != 0 {
		t.Errorf("files left after the claim: %v", left)
	}

	// An old offer for slot s2 is swept; slot s3 already has one, so a
	// pool of 1 is full and nothing is started for it.
	if err := writeJSON(offerPath("s2"), ciOffer{VM: "warm-s2", Created: time.Now().Add(-2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(offerPath("s3"), ciOffer{VM: "warm-s3", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	msgs.Reset()
	refillPool(&ciJobRecord{VM: "gitlab-1-3", Slot: "s4", Pool: 1, TTL: time.Hour}, &msgs)
	if _, err := os.Stat(offerPath("s2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale offer is still there (%v); refill said %q", err, msgs.String())
	}
	if _, err := os.Stat(offerPath("s4")); !errors.Is(err, fs.ErrNotExist) || strings.Contains(msgs.String(), "booting") {
		t.Errorf("a full pool offered slot s4 a VM (%v); refill said %q", err, msgs.String())
	}
	var out strings.Builder
	if err := Drain(&out, 100*time.Millisecond); err != nil || !strings.Contains(out.String(), "warm-s3") {
		t.Errorf("drain: %v, %q", err, out.String())
	}
	if left, _ := filepath.Glob(filepath.Join(ciPoolDir(), "offer-*")); len(left) != 0 {
		t.Errorf("offers left after drain: %v", left)
	}
}

// ciJobEnv sets a job's variables as GitLab Runner passes them, and a job
// response file (the server's id, token and project) when project > 0.
func ciJobEnv(t *testing.T, token string, jobID, project int64, vars map[string]string) {
	t.Helper()
	for k, v := range vars {
		t.Setenv(envJobPrefix+k, v)
	}
	t.Setenv(envJobPrefix+"CI_JOB_TOKEN", token)
	t.Setenv(envJobPrefix+"CI_JOB_ID", strconv.FormatInt(jobID, 10))
	if project <= 0 {
		t.Setenv(EnvJobResponse, "")
		return
	}
	p := filepath.Join(t.TempDir(), "response.json")
	b, _ := json.Marshal(map[string]any{"id": jobID, "token": token,
		"job_info": map[string]any{"project_id": project}, "variables": []any{}})
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvJobResponse, p)
}

// fakeVMStarter is a Runtime whose prepare's `run` exits 1 at once:
// prepare's checks, records and claims run without a VM.
var fakeVMStarter = Runtime{
	Executable:    func() (string, error) { return "/bin/false", nil },
	Interruptible: func(ctx context.Context) (context.Context, func()) { return context.WithCancel(ctx) },
}

// prepare is `microvm ci gitlab prepare` with its default flags, as set
// changes them, and fakeVMStarter: the job's identity, then Prepare. It
// returns what Prepare said on stderr and its error.
func prepare(t *testing.T, set func(*PrepareOptions)) (string, error) {
	t.Helper()
	o := PrepareOptions{DefaultImage: "debian:12", CPUs: 2, Memory: 2 << 30, CacheSize: 4 << 30,
		BootTimeout: 2 * time.Minute, Net: "user", Slots: 64, WarmTTL: time.Hour}
	set(&o)
	var msgs strings.Builder
	id, err := JobIdentity()
	if err != nil {
		return "", fmt.Errorf("ci gitlab prepare: %w", err)
	}
	err = fakeVMStarter.Prepare(id, o, &msgs)
	return msgs.String(), err
}

// cleanup is `microvm ci gitlab cleanup`: what it said, and its error.
func cleanup() (string, error) {
	var msgs strings.Builder
	err := Cleanup(&msgs)
	return msgs.String(), err
}

// shortStateDir is a state directory whose VM socket paths fit a Unix
// socket address (t.TempDir's names are long).
func shortStateDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "ci")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// makeStoredVM puts a VM that is not running in the store, as another
// job's VM that has ended would be.
func makeStoredVM(t *testing.T, name string) {
	t.Helper()
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.Create(vms.Record{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

func storedVM(name string) bool {
	there, err := vmExists(name)
	return err == nil && there
}

// TestGitLabJobForgedIDRemovesNoOtherVM: a job that sets CI_JOB_ID (and
// CI_RUNNER_ID) to another job's cannot make cleanup, or a failed
// prepare, remove that job's VM: the executor keys the job on its token
// and removes only what the job's own prepare recorded.
func TestGitLabJobForgedIDRemovesNoOtherVM(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	// The victim: job 41's VM, under its name before and after the fix.
	victimID, err := JobIdentityFrom(nil, func(n string) string { return map[string]string{"CI_JOB_TOKEN": "victim-token", "CI_JOB_ID": "41"}[n] })
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gitlab-7-41", victimID.VMName()} {
		makeStoredVM(t, name)
	}
	ciJobEnv(t, "attacker-token", 41, 0, map[string]string{"CI_RUNNER_ID": "7"})
	if msgs, err := cleanup(); err != nil {
		t.Errorf("cleanup of a job that prepared nothing: %v, %q", err, msgs)
	}
	cacheDir := t.TempDir()
	msgs, err := prepare(t, func(o *PrepareOptions) {
		o.CacheKey, o.CacheSize, o.CacheDir, o.BootTimeout = "p", 16<<20, cacheDir, 100*time.Millisecond
	})
	if err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Errorf("prepare with a VM starter that fails: %v, %q", err, msgs)
	}
	cleanup()
	for _, name := range []string{"gitlab-7-41", victimID.VMName()} {
		if !storedVM(name) {
			t.Errorf("VM %s, another job's, was removed by a job that forged its id", name)
		}
	}
}

// TestGitLabPrepareLeavesForeignVM: a VM of the job's own name that the
// job's prepare did not make (here: made by hand) is neither used nor
// removed, by prepare or by cleanup; a second prepare for one token is
// refused and leaves the first one's record.
func TestGitLabPrepareLeavesForeignVM(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	ciJobEnv(t, "tok", 9, 0, nil)
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	makeStoredVM(t, id.VMName())
	cacheDir := t.TempDir()
	flags := func(o *PrepareOptions) { o.CacheKey, o.CacheDir = "p", cacheDir }
	msgs, err := prepare(t, flags)
	if err == nil || !strings.Contains(err.Error(), "was not made by this job's prepare") {
		t.Errorf("prepare over a foreign VM: %v, %q", err, msgs)
	}
	cleanup()
	if !storedVM(id.VMName()) {
		t.Errorf("VM %s, not the job's own, was removed", id.VMName())
	}

	rec := jobRecordPath(vms.StateDir(), id)
	if err := createJobRecord(rec, ciJobRecord{VM: "first"}); err != nil {
		t.Fatal(err)
	}
	// Refused as microvm's own error (status 1, not a build failure), in
	// one line: prepare said nothing else.
	msgs, err = prepare(t, flags)
	var bf BuildFailure
	if err == nil || errors.As(err, &bf) || !strings.Contains(err.Error(), "a prepare already ran for this job token") ||
		strings.Contains(err.Error(), "\n") || msgs != "" {
		t.Errorf("a second prepare: %v, %q", err, msgs)
	}
	var got ciJobRecord
	if err := readJSON(rec, &got); err != nil || got.VM != "first" {
		t.Errorf("the first prepare's record after a second prepare: %+v, %v", got, err)
	}
}

// TestGitLabJobForgedProjectTakesNoOtherCache: a job that sets
// CI_PROJECT_PATH_SLUG to another project's gets neither that project's
// cache (its committed versions, or a disk of the single-file layout
// before them) nor its warm VM: the cache slot is the project id GitLab's
// server put in the job response.
func TestGitLabJobForgedProjectTakesNoOtherCache(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	cacheDir := t.TempDir()
	cacheDiskPath := func(cacheDir, slot string) string { return filepath.Join(cacheDir, slot+".ext4") }
	// The victim project's disk and warm VM offer, keyed by its slug (the
	// old key) and by its id (the new one).
	for _, slot := range []string{"victim-0", "project-1-0"} {
		commitCache(t, cacheDir, slot, "victim's cache", true)
		if err := os.WriteFile(cacheDiskPath(cacheDir, slot), []byte("victim's cache"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := writeJSON(offerPath(slot), ciOffer{VM: WarmVMName(slot), Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	// Our own disk, so that prepare need not make one.
	if err := os.WriteFile(cacheDiskPath(cacheDir, "project-2-0"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ciJobEnv(t, "attacker", 5, 2, map[string]string{"CI_PROJECT_PATH_SLUG": "victim", "CI_PROJECT_ID": "1",
		"CI_CONCURRENT_PROJECT_ID": "0"})
	msgs, err := prepare(t, func(o *PrepareOptions) { o.CacheDir, o.WarmPool, o.BootTimeout = cacheDir, 1, 100*time.Millisecond })
	if err == nil || !strings.Contains(msgs, "cache project-2-0") {
		t.Errorf("prepare: %v, %q; want the job's own project's slot", err, msgs)
	}
	for _, slot := range []string{"victim-0", "project-1-0"} {
		if _, err := os.Stat(offerPath(slot)); err != nil {
			t.Errorf("the victim's warm VM offer %s was taken: %v", slot, err)
		}
		if b, err := os.ReadFile(cacheDiskPath(cacheDir, slot)); err != nil || string(b) != "victim's cache" {
			t.Errorf("the victim's cache %s: %q, %v", slot, b, err)
		}
		if info := cacheInfo(t, cacheDir, slot); info.Versions != 1 || info.Clones != 0 {
			t.Errorf("the victim's cache %s: %+v; want its one version, and no clone of it", slot, info)
		}
	}
	if info := cacheInfo(t, cacheDir, "project-2-0"); info.Clones != 1 {
		t.Errorf("the job's own cache: %+v; want its clone checked out", info)
	}
	cleanup()
}

// TestGitLabJobIdentity: what keys a job, its VM and its cache slot, and
// what is refused.
func TestGitLabJobIdentity(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(n string) string { return m[n] } }
	a, err := JobIdentityFrom(nil, env(map[string]string{"CI_JOB_TOKEN": "t1", "CI_JOB_ID": "12"}))
	if err != nil || a.ID != "12" || len(a.Hash) != 16 || a.Project != "" || a.VMName() != "gitlab-12-"+a.Hash {
		t.Fatalf("token t1, id 12: %+v, %v", a, err)
	}
	// The job's id names nothing: another token, another VM.
	if b, _ := JobIdentityFrom(nil, env(map[string]string{"CI_JOB_TOKEN": "t2", "CI_JOB_ID": "12"})); b.VMName() == a.VMName() {
		t.Errorf("two tokens, one id: both VMs named %s", a.VMName())
	}
	// The server's word wins over the job's variables.
	resp := &JobResponse{ID: 77, Token: "t1"}
	resp.JobInfo.ProjectID = 3
	c, err := JobIdentityFrom(resp, env(map[string]string{"CI_JOB_TOKEN": "forged", "CI_JOB_ID": "1", "CI_PROJECT_ID": "9"}))
	if err != nil || c.Hash != a.Hash || c.ID != "77" || c.Project != "3" {
		t.Errorf("job response: %+v, %v", c, err)
	}
	if d, _ := JobIdentityFrom(nil, env(map[string]string{"CI_JOB_TOKEN": "t", "CI_JOB_ID": "../x"})); d.VMName() != "gitlab-"+d.Hash {
		t.Errorf("a job id that is no number: VM %q", d.VMName())
	}
	if _, err := JobIdentityFrom(nil, env(nil)); err == nil || !strings.Contains(err.Error(), "no job token") {
		t.Errorf("no token: %v", err)
	}
	if _, err := parseJobResponse(strings.NewReader(`{"id": 1}`)); err == nil {
		t.Error("a job response without a token was taken")
	}
	if _, err := parseJobResponse(io.MultiReader(strings.NewReader(`{"x":"`), strings.NewReader(strings.Repeat("a", jobResponseLimit)))); err == nil ||
		!strings.Contains(err.Error(), "over") {
		t.Errorf("an oversized job response: %v", err)
	}

	for _, tc := range []struct {
		name     string
		id       Identity
		cacheKey string
		slot     string
		want     string // the slot, or a part of the error
	}{
		{"proven project", c, "", "2", "project-3-2"},
		{"runner's key wins", c, "web", "", "web-0"},
		{"one project per runner", a, "web", "1", "web-1"},
		{"unproven, no key", a, "", "0", "cannot be proven"},
		{"slot out of range", c, "", "64", "want 0 to 63"},
		{"slot not a number", c, "", "-1", "want 0 to 63"},
		{"slot too long", c, "", "00000", "want 0 to 63"},
		{"bad key", c, "../x", "0", "--cache-key"},
	} {
		got, err := cacheSlot(tc.id, tc.cacheKey, 64, env(map[string]string{"CI_CONCURRENT_PROJECT_ID": tc.slot, "CI_PROJECT_PATH_SLUG": "victim"}))
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// agentSocket stands for a VM's hybrid-vsock socket in front of an agent
// that this process serves: Accept answers a client's "CONNECT <port>\n"
// line with "OK <host port>\n" when port is the agent's and drops the
// connection otherwise, as a VMM with nothing listening there does.
type agentSocket struct {
	net.Listener
	port uint32
}

func (l agentSocket) Accept() (net.Conn, error) {
	want := fmt.Sprintf("CONNECT %d\n", l.port)
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		// Byte by byte: what follows the line is the agent's stream.
		var line []byte
		b := make([]byte, 1)
		for len(line) < len(want) && !strings.HasSuffix(string(line), "\n") {
			if _, err := c.Read(b); err != nil {
				break
			}
			line = append(line, b[0])
		}
		if string(line) != want {
			c.Close()
			continue
		}
		if _, err := io.WriteString(c, "OK 1073741824\n"); err != nil {
			c.Close()
			continue
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
}

// startJobVM puts a running VM of that name in the store whose agent this
// process serves: its commands run on this host, with an image
// environment of env, whose PATH stands in for the image's programs.
func startJobVM(t *testing.T, name string, env []string) {
	t.Helper()
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.Create(vms.Record{Name: name, Agent: true, AgentPort: agentvm.Port, Process: &vms.Process{Env: env}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	ln, err := net.Listen("unix", filepath.Join(store.Dir(name), vms.VsockSocket))
	if err != nil {
		t.Fatal(err)
	}
	srv := agent.New(agent.Options{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(agentSocket{ln, agentvm.Port}) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// TestJobShell: prepare runs a job with bash when the image has it, else
// with sh (busybox's, a link in the image), and refuses an image with
// neither in one line; the shells are looked for by the VM's agent in the
// image's PATH. A bash that is there but fails is an error, and so is a
// VM that is gone: neither passes for a missing bash.
func TestJobShell(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	hostSh, err := exec.LookPath("sh")
	if err != nil {
		testenv.Missing(t, "no sh on this host: %v", err)
	}
	// image makes a PATH directory of programs: name -> a link's target,
	// or a script's body after "#!".
	image := func(t *testing.T, progs map[string]string) []string {
		dir := t.TempDir()
		for name, p := range progs {
			var err error
			if body, ok := strings.CutPrefix(p, "#!"); ok {
				err = os.WriteFile(filepath.Join(dir, name), []byte("#!"+hostSh+"\n"+body+"\n"), 0o755)
			} else {
				err = os.Symlink(p, filepath.Join(dir, name))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		return []string{"PATH=" + dir}
	}
	probe := func(name string) func([]string) error {
		return func(argv []string) error { return fakeVMStarter.runJobCommand(name, argv, nil, io.Discard, io.Discard) }
	}
	for i, tc := range []struct {
		name  string
		progs map[string]string
		want  string // the shell, or the error
	}{
		{"bash and sh", map[string]string{"bash": "#!echo bash ran", "sh": hostSh}, "bash"},
		{"busybox sh only", map[string]string{"busybox": hostSh, "sh": "busybox"}, "sh"},
		{"bash a dangling link", map[string]string{"bash": "/no/such/bash", "sh": hostSh}, "sh"},
		{"neither", map[string]string{"ls": hostSh}, "neither bash nor sh found in the job's image"},
		{"bash fails", map[string]string{"bash": "#!exit 3", "sh": hostSh}, "trying bash: exit status 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := "job" + strconv.Itoa(i)
			startJobVM(t, vm, image(t, tc.progs))
			got, err := jobShell(probe(vm))
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("jobShell: %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("no VM", func(t *testing.T) {
		if got, err := jobShell(probe("gone")); err == nil || strings.Contains(err.Error(), "neither") {
			t.Errorf("jobShell of a VM that is not there: %q, %v; want the VM's error", got, err)
		}
	})
	// The shell that runs the stages: prepare records one other than
	// bash; a record without one (bash, or from before prepare looked)
	// runs them with bash.
	var old ciJobRecord
	if err := json.Unmarshal([]byte(`{"vm":"gitlab-1-ab","slot":"p-0"}`), &old); err != nil || old.shell() != "bash" {
		t.Errorf("a record without a shell: %q, %v; want bash", old.shell(), err)
	}
	if r := (ciJobRecord{Shell: "/bin/evil"}); r.shell() != "bash" {
		t.Errorf("a record naming another program: %q, want bash (only the shells prepare chooses from)", r.shell())
	}
	if r := (ciJobRecord{Shell: "sh"}); r.shell() != "sh" {
		t.Errorf("a record with sh: %q", r.shell())
	}
}
