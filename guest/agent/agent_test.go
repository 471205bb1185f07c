package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/dirtar"
)

// TestMain makes the test process a child subreaper, as the agent is when
// it is PID 1: processes orphaned by an Exec are reparented here, and the
// tests' Reaper reaps them, so "no process of the group remains" can be
// checked with kill(-pgid, 0) whatever reaps orphans on this machine.
//
// Run as ContainerInitArg0 (Exec with a container starts /proc/self/exe,
// this test binary, so) it is a container process's set-up step.
func TestMain(m *testing.M) {
	if os.Args[0] == ContainerInitArg0 {
		ContainerInit()
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "agent test: PR_SET_CHILD_SUBREAPER: %v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

type harness struct {
	srv    *Server
	client *agentapi.Client
	conn   *grpc.ClientConn
}

// newHarness serves a Server on a Unix socket and dials it. Unless direct
// is set the server uses a Reaper, which is closed after the server stops.
// Tests that use it must not run in parallel: one Reaper per process.
func newHarness(t testing.TB, opts Options, direct bool) *harness {
	t.Helper()
	if !direct {
		r := NewReaper()
		t.Cleanup(r.Close)
		opts.Reaper = r
	}
	dir, err := os.MkdirTemp("", "agent") // short: sun_path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(opts)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &harness{srv: srv, client: agentapi.NewClient(conn), conn: conn}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type result struct {
	stdout, stderr bytes.Buffer
	exit           *agentapi.ExitStatus
	err            error
}

func run(ctx context.Context, c *agentapi.Client, cmd *agentapi.Cmd) *result {
	r := &result{}
	cmd.Stdout, cmd.Stderr = &r.stdout, &r.stderr
	r.exit, r.err = c.Exec(ctx, cmd)
	return r
}

func sh(script string, args ...string) []string {
	return append([]string{"sh", "-c", script, "sh"}, args...)
}

func TestExecOutputAndStatus(t *testing.T) {
	h := newHarness(t, Options{}, false)
	r := run(testCtx(t), h.client, &agentapi.Cmd{Argv: sh("echo out; echo err >&2; exit 7")})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.stdout.String() != "out\n" || r.stderr.String() != "err\n" {
		t.Errorf("stdout %q stderr %q; want \"out\\n\" and \"err\\n\"", r.stdout.String(), r.stderr.String())
	}
	want := &agentapi.ExitStatus{Code: 7}
	if diff := cmp.Diff(want, r.exit, protocmp.Transform()); diff != "" {
		t.Errorf("exit status (-want +got):\n%s", diff)
	}
}

func TestExecEnvDirAndPath(t *testing.T) {
	h := newHarness(t, Options{}, false)
	dir := t.TempDir()
	r := run(testCtx(t), h.client, &agentapi.Cmd{
		Argv: sh(`printf '%s|%s|%s' "$FOO" "$(pwd)" "$PATH"`),
		Env:  []string{"FOO=bar"},
		Dir:  dir,
	})
	if r.err != nil || r.exit.Code != 0 {
		t.Fatalf("exec: %v, %v (stderr %q)", r.exit, r.err, r.stderr.String())
	}
	if want := "bar|" + dir + "|" + DefaultPath; r.stdout.String() != want {
		t.Errorf("output %q, want %q", r.stdout.String(), want)
	}
}

func TestExecStdinThroughCat(t *testing.T) {
	h := newHarness(t, Options{}, false)
	data := make([]byte, 3<<20+12345)
	rand.Read(data)
	out := sha256.New()
	var n int64
	cmd := &agentapi.Cmd{Argv: []string{"cat"}, Stdin: bytes.NewReader(data), Stdout: io.MultiWriter(out, countWriter{&n})}
	exit, err := h.client.Exec(testCtx(t), cmd)
	if err != nil || exit.Code != 0 {
		t.Fatalf("cat: %v, %v", exit, err)
	}
	if want := sha256.Sum256(data); !bytes.Equal(out.Sum(nil), want[:]) {
		t.Errorf("cat returned %d bytes with a different SHA-256; sent %d", n, len(data))
	}
}

type countWriter struct{ n *int64 }

func (w countWriter) Write(b []byte) (int, error) { *w.n += int64(len(b)); return len(b), nil }

func TestExecSignalled(t *testing.T) {
	h := newHarness(t, Options{}, false)
	r := run(testCtx(t), h.client, &agentapi.Cmd{Argv: sh("kill -TERM $$")})
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := &agentapi.ExitStatus{Code: -1, Signal: int32(unix.SIGTERM)}
	if diff := cmp.Diff(want, r.exit, protocmp.Transform()); diff != "" {
		t.Errorf("exit status (-want +got):\n%s", diff)
	}
}

// waitGroupGone waits until no process is left in process group pgid.
func waitGroupGone(t *testing.T, pgid int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Kill(-pgid, 0)
		if err == unix.ESRCH {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has processes (kill: %v)", pgid, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	h := newHarness(t, Options{}, false)
	start := time.Now()
	r := run(testCtx(t), h.client, &agentapi.Cmd{
		Argv:    sh("echo $$; sleep 100 & sleep 100"),
		Timeout: 300 * time.Millisecond,
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("timed-out exec took %v", d)
	}
	want := &agentapi.ExitStatus{Code: -1, Signal: int32(unix.SIGKILL), TimedOut: true}
	if diff := cmp.Diff(want, r.exit, protocmp.Transform()); diff != "" {
		t.Errorf("exit status (-want +got):\n%s", diff)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(r.stdout.String()))
	if err != nil {
		t.Fatalf("pid line %q: %v", r.stdout.String(), err)
	}
	waitGroupGone(t, pgid)
}

func TestExecLeaderExitKillsGroup(t *testing.T) {
	h := newHarness(t, Options{}, false)
	start := time.Now()
	r := run(testCtx(t), h.client, &agentapi.Cmd{Argv: sh("echo $$; sleep 100 & exit 3")})
	if r.err != nil || r.exit.Code != 3 {
		t.Fatalf("exec: %v, %v", r.exit, r.err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("exec whose background child holds stdout took %v", d)
	}
	pgid, _ := strconv.Atoi(strings.TrimSpace(r.stdout.String()))
	waitGroupGone(t, pgid)
}

func TestExecCancelKillsGroup(t *testing.T) {
	h := newHarness(t, Options{}, false)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	stream, err := h.client.Agent.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := &agentapi.ExecStart{Argv: sh("echo $$; sleep 100 & sleep 100")}
	if err := stream.Send(&agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Start{Start: start}}); err != nil {
		t.Fatal(err)
	}
	// The first message says the process started, with its pid, which
	// is the group's id and what $$ prints.
	resp, err := stream.Recv()
	if err != nil || resp.GetStarted() == nil {
		t.Fatalf("first message %v, %v; want started", resp, err)
	}
	started := int(resp.GetStarted().Pid)
	if resp, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(resp.GetStdout())))
	if err != nil || pgid != started {
		t.Fatalf("second message %v: %v; want the pid %d", resp, err, started)
	}
	cancel()
	waitGroupGone(t, pgid)
}

func TestExecSignalMessage(t *testing.T) {
	h := newHarness(t, Options{}, false)
	stream, err := h.client.Agent.Exec(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	start := &agentapi.ExecStart{Argv: sh("trap 'echo got; exit 5' INT; echo ready; while :; do sleep 0.05; done")}
	stream.Send(&agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Start{Start: start}})
	if resp, err := stream.Recv(); err != nil || resp.GetStarted() == nil {
		t.Fatalf("first message %v, %v; want started", resp, err)
	}
	if resp, err := stream.Recv(); err != nil || string(resp.GetStdout()) != "ready\n" {
		t.Fatalf("first message %v, %v", resp, err)
	}
	stream.Send(&agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Signal{Signal: int32(unix.SIGINT)}})
	var out []byte
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resp.GetStdout()...)
		if e := resp.GetExit(); e != nil {
			if e.Code != 5 || string(out) != "got\n" {
				t.Errorf("after SIGINT: output %q, exit %v; want \"got\\n\", 5", out, e)
			}
			return
		}
	}
}

func TestExecBadRequests(t *testing.T) {
	h := newHarness(t, Options{}, false)
	tests := []struct {
		name string
		cmd  agentapi.Cmd
		want codes.Code
	}{
		{"empty argv", agentapi.Cmd{}, codes.InvalidArgument},
		{"empty argv0", agentapi.Cmd{Argv: []string{""}}, codes.InvalidArgument},
		{"NUL in arg", agentapi.Cmd{Argv: []string{"echo", "a\x00b"}}, codes.InvalidArgument},
		{"env not KEY=VALUE", agentapi.Cmd{Argv: []string{"true"}, Env: []string{"FOO"}}, codes.InvalidArgument},
		{"huge env", agentapi.Cmd{Argv: []string{"true"}, Env: []string{"A=" + strings.Repeat("x", MaxEnvBytes)}}, codes.InvalidArgument},
		{"unknown binary", agentapi.Cmd{Argv: []string{"no-such-binary-9f2c"}}, codes.NotFound},
		{"missing path", agentapi.Cmd{Argv: []string{"/no/such/binary"}}, codes.NotFound},
		{"not executable", agentapi.Cmd{Argv: []string{"/etc/passwd"}}, codes.PermissionDenied},
		{"missing dir", agentapi.Cmd{Argv: []string{"true"}, Dir: "/no/such/dir"}, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(testCtx(t), h.client, &tt.cmd)
			if got := status.Code(r.err); got != tt.want {
				t.Errorf("Exec = %v, %v; want code %v", r.exit, r.err, tt.want)
			}
		})
	}
	t.Run("first message not start", func(t *testing.T) {
		stream, err := h.client.Agent.Exec(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Stdin{Stdin: []byte("x")}})
		if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Recv = %v, want InvalidArgument", err)
		}
	})
}

func TestExecConcurrent(t *testing.T) {
	var idle atomic.Int32
	h := newHarness(t, Options{Idle: func() { idle.Add(1) }}, false)
	const n = 20
	var wg sync.WaitGroup
	results := make([]*result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(testCtx(t), h.client, &agentapi.Cmd{
				Argv: sh(`sleep 0.1; echo "out $1"; echo "err $1" >&2; exit "$1"`, strconv.Itoa(i)),
			})
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil || r.exit.Code != int32(i) || r.stdout.String() != fmt.Sprintf("out %d\n", i) || r.stderr.String() != fmt.Sprintf("err %d\n", i) {
			t.Errorf("exec %d: exit %v, err %v, stdout %q, stderr %q", i, r.exit, r.err, r.stdout.String(), r.stderr.String())
		}
	}
	if idle.Load() == 0 {
		t.Error("Idle was not called after the last exec ended")
	}
}

func TestExecDirectStarter(t *testing.T) {
	h := newHarness(t, Options{}, true)
	r := run(testCtx(t), h.client, &agentapi.Cmd{Argv: sh("echo hi; exit 3")})
	if r.err != nil || r.exit.Code != 3 || r.stdout.String() != "hi\n" {
		t.Fatalf("exec: %v, %v, %q", r.exit, r.err, r.stdout.String())
	}
	r = run(testCtx(t), h.client, &agentapi.Cmd{Argv: sh("sleep 100"), Timeout: 100 * time.Millisecond})
	if r.err != nil || !r.exit.TimedOut || r.exit.Signal != int32(unix.SIGKILL) {
		t.Fatalf("timed-out exec: %v, %v", r.exit, r.err)
	}
}

func TestExecPty(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx")
	}
	if _, err := exec.LookPath("stty"); err != nil {
		t.Skip("no stty")
	}
	h := newHarness(t, Options{}, false)
	r := run(testCtx(t), h.client, &agentapi.Cmd{
		Argv: sh("tty; stty size; read line; echo \"line=$line\""),
		Pty:  &agentapi.PtySize{Rows: 30, Cols: 100},
		// The terminal echoes input: send it after the prompt is out.
		Stdin: strings.NewReader("hello\n"),
	})
	if r.err != nil || r.exit.Code != 0 {
		t.Fatalf("exec: %v, %v, output %q", r.exit, r.err, r.stdout.String())
	}
	out := r.stdout.String()
	for _, want := range []string{"/dev/pts/", "30 100\r\n", "line=hello\r\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("pty output %q lacks %q", out, want)
		}
	}
}

// TestExecPtyResize: a size sent on Cmd.Resize reaches the terminal, in
// order with stdin.
func TestExecPtyResize(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx")
	}
	if _, err := exec.LookPath("stty"); err != nil {
		t.Skip("no stty")
	}
	h := newHarness(t, Options{}, false)
	pr, pw := io.Pipe()
	resize := make(chan *agentapi.PtySize)
	go func() {
		resize <- &agentapi.PtySize{Rows: 41, Cols: 123}
		pw.Write([]byte("go\n"))
		pw.Close()
		close(resize)
	}()
	r := run(testCtx(t), h.client, &agentapi.Cmd{
		Argv:   sh("read line; stty size"),
		Pty:    &agentapi.PtySize{Rows: 30, Cols: 100},
		Stdin:  pr,
		Resize: resize,
	})
	if r.err != nil || r.exit.Code != 0 {
		t.Fatalf("exec: %v, %v, output %q", r.exit, r.err, r.stdout.String())
	}
	if out := r.stdout.String(); !strings.Contains(out, "41 123\r\n") {
		t.Errorf("pty output %q: want the new size 41 123", out)
	}
}

func TestPutGetFile(t *testing.T) {
	h := newHarness(t, Options{}, false)
	ctx := testCtx(t)
	data := make([]byte, 5<<20+7)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "a", "b", "file")
	n, err := h.client.PutFile(ctx, path, 0o640, true, bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("PutFile = %d, %v; want %d", n, err, len(data))
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("stat: %v, %v; want mode 0640", fi, err)
	}
	var got bytes.Buffer
	mode, err := h.client.GetFile(ctx, path, &got)
	if err != nil || mode != 0o640 || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("GetFile = %v, %v, %d bytes (equal %v)", mode, err, got.Len(), bytes.Equal(got.Bytes(), data))
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want the file only", len(ents))
	}
}

// TestPutGetTree: a directory goes in as a tar stream and comes back the
// same; a tar entry that climbs out is refused with InvalidArgument.
func TestPutGetTree(t *testing.T) {
	h := newHarness(t, Options{}, false)
	ctx := testCtx(t)
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3*agentapi.ChunkSize+11)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(src, "sub", "big"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/big", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if _, err := dirtar.Write(&archive, src); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "made", "here")
	resp, err := h.client.PutTree(ctx, dst, &archive)
	if err != nil || resp.Entries != 4 || resp.Bytes != uint64(len(big)) {
		t.Fatalf("PutTree = %v, %v; want 4 entries, %d bytes", resp, err, len(big))
	}
	if b, err := os.ReadFile(filepath.Join(dst, "link")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("through the link: %d bytes, %v", len(b), err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "sub")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("sub: %v, %v; want 0750", fi, err)
	}

	var back bytes.Buffer
	if err := h.client.GetTree(ctx, dst, &back); err != nil {
		t.Fatal(err)
	}
	again := t.TempDir()
	if _, err := dirtar.Extract(&back, again, dirtar.Options{KeepSpecial: true}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(again, "sub", "big")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("GetTree round trip: %d bytes, %v", len(b), err)
	}
	if err := h.client.GetTree(ctx, filepath.Join(dst, "nothing"), io.Discard); status.Code(err) != codes.NotFound {
		t.Errorf("GetTree of a missing path: %v, want NotFound", err)
	}

	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	if _, err := h.client.PutTree(ctx, filepath.Join(t.TempDir(), "in"), &evil); status.Code(err) != codes.InvalidArgument {
		t.Errorf("PutTree of ../escape: %v, want InvalidArgument", err)
	}
}

func TestFileErrors(t *testing.T) {
	h := newHarness(t, Options{}, false)
	ctx := testCtx(t)
	dir := t.TempDir()
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"put relative", func() error {
			_, err := h.client.PutFile(ctx, "rel/file", 0o644, false, strings.NewReader("x"))
			return err
		}, codes.InvalidArgument},
		{"put no parent", func() error {
			_, err := h.client.PutFile(ctx, filepath.Join(dir, "no", "file"), 0o644, false, strings.NewReader("x"))
			return err
		}, codes.NotFound},
		{"get missing", func() error {
			_, err := h.client.GetFile(ctx, filepath.Join(dir, "missing"), io.Discard)
			return err
		}, codes.NotFound},
		{"get directory", func() error {
			_, err := h.client.GetFile(ctx, dir, io.Discard)
			return err
		}, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := status.Code(tt.call()); got != tt.want {
				t.Errorf("code %v, want %v", got, tt.want)
			}
		})
	}
}

func TestInfo(t *testing.T) {
	h := newHarness(t, Options{}, false)
	info, err := h.client.Agent.Info(testCtx(t), &agentapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.KernelRelease == "" || info.AgentVersion != Version || info.NumCpu == 0 || info.UptimeMs == 0 ||
		info.MemTotalBytes == 0 || info.MemAvailableBytes == 0 || info.MemAvailableBytes > info.MemTotalBytes {
		t.Errorf("Info = %v: a field is missing", info)
	}
}

func TestParseMeminfo(t *testing.T) {
	in := "MemTotal:       16384 kB\nMemFree:  1024 kB\nHugePages_Total:       4\nbroken line\nBad: x kB\n"
	want := map[string]uint64{"MemTotal": 16 << 20, "MemFree": 1 << 20, "HugePages_Total": 4}
	if diff := cmp.Diff(want, parseMeminfo(strings.NewReader(in))); diff != "" {
		t.Errorf("parseMeminfo (-want +got):\n%s", diff)
	}
	if got := parseUptime("12.345 99.0\n"); got != 12345 {
		t.Errorf("parseUptime = %d, want 12345", got)
	}
}

func TestHealth(t *testing.T) {
	h := newHarness(t, Options{}, false)
	hc := healthpb.NewHealthClient(h.conn)
	for _, svc := range []string{"", agentapi.Agent_ServiceDesc.ServiceName} {
		resp, err := hc.Check(testCtx(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}
}

func TestShutdown(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, Options{Shutdown: func() { calls.Add(1) }}, false)
	for range 2 {
		if _, err := h.client.Agent.Shutdown(testCtx(t), &agentapi.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("Shutdown callback called %d times, want 1", n)
	}
	h2 := newHarness(t, Options{}, true)
	if _, err := h2.client.Agent.Shutdown(testCtx(t), &agentapi.ShutdownRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("Shutdown without a callback = %v, want Unimplemented", err)
	}
}

// TestExecAgentLost: when the agent's connection breaks mid-stream (the
// agent killed, its VM gone), Exec fails at once with ErrAgentLost rather
// than hanging, and the command it ran is killed with its group.
func TestExecAgentLost(t *testing.T) {
	h := newHarness(t, Options{}, false)
	// The client reaches the agent through a relay the test cuts.
	dir, err := os.MkdirTemp("", "relay") // short: sun_path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	relaySock := filepath.Join(dir, "relay.sock")
	ln, err := net.Listen("unix", relaySock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	target := strings.TrimPrefix(h.conn.Target(), "unix://")
	cut := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("unix", target)
		if err != nil {
			c.Close()
			return
		}
		go io.Copy(s, c)
		go io.Copy(c, s)
		<-cut
		c.Close()
		s.Close()
	}()
	conn, err := grpc.NewClient("unix://"+relaySock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := agentapi.NewClient(conn)

	pidFile := filepath.Join(dir, "pid")
	out := &signalWriter{at: 1, ch: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(testCtx(t), &agentapi.Cmd{Argv: sh(`echo $$ > "$1"; while :; do echo streaming; done`, pidFile), Stdout: out})
		errc <- err
	}()
	select {
	case <-out.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no output")
	}
	close(cut)
	select {
	case err := <-errc:
		if !errors.Is(err, agentapi.ErrAgentLost) || status.Code(err) != codes.Unavailable {
			t.Errorf("Exec: %v; want ErrAgentLost with code Unavailable", err)
		}
		t.Logf("Exec: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Exec still running 10 s after the connection broke")
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The agent sees the call end and kills the group.
	deadline := time.Now().Add(10 * time.Second)
	for unix.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the command (pid %d) still runs after its call broke", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// signalWriter closes ch once at bytes have been written.
type signalWriter struct {
	mu   sync.Mutex
	n    int
	at   int
	ch   chan struct{}
	done bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += len(p)
	if !w.done && w.n >= w.at {
		w.done = true
		close(w.ch)
	}
	return len(p), nil
}
