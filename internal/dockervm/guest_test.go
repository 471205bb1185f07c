package dockervm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostRunner runs the guest scripts on this host, as the agent runs them in
// the guest: each command the leader of a process group of its own, which
// is killed once the leader has exited. PATH has dir, with the test's fake
// programs, before the host's own.
type hostRunner struct{ dir string }

func (h hostRunner) Run(ctx context.Context, argv []string) (int, string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + h.dir + ":/usr/bin:/bin"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // as the agent does
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String(), nil
	}
	return 0, out.String(), err
}

// fakeProgram writes an executable shell script named name into dir.
func fakeProgram(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

// needHostTools skips a test on a host without the programs the guest
// scripts run.
func needHostTools(t *testing.T) {
	t.Helper()
	for _, p := range []string{"sh", "setsid", "mount", "tail", "grep", "mv", "sleep"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not on this host", p)
		}
	}
}

func TestProbeScript(t *testing.T) {
	needHostTools(t)
	dir := t.TempDir()
	r := hostRunner{dir}
	fakeProgram(t, dir, "docker", "exit 0\n")
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		if _, err := os.Stat(filepath.Join(d, "dockerd")); err == nil {
			t.Skipf("this host has %s/dockerd", d)
		}
	}
	err := probe(context.Background(), r)
	if de := asError(t, err); !strings.Contains(de.Reason, "the image has no dockerd;") {
		t.Errorf("without dockerd: %v", err)
	}
	fakeProgram(t, dir, "dockerd", "exit 0\n")
	if err := probe(context.Background(), r); err == nil && !hostHas("containerd") {
		t.Errorf("without containerd: %v", err)
	}
	fakeProgram(t, dir, "containerd", "exit 0\n")
	if err := probe(context.Background(), r); err != nil {
		t.Errorf("with every program: %v", err)
	}
}

func TestStartScriptDetaches(t *testing.T) {
	needHostTools(t)
	dir := t.TempDir()
	r := hostRunner{dir}
	// dockerd notes whether containerd listened before it started.
	fakeProgram(t, dir, "dockerd", "s=${1#--containerd=}\ngrep -q listening \"$s\" 2>/dev/null || echo \"dockerd started before containerd listened\"\necho \"dockerd $*\"\nexec sleep 60\n")
	// containerd listens (makes its socket, given as --address, here a
	// file that says so) a moment after it starts; a stale socket from an
	// earlier one is there before.
	sock := filepath.Join(dir, "containerd.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fakeProgram(t, dir, "containerd", "[ \"$1\" = --address ] || exit 9\nsleep 0.3\necho listening >\"$2\"\nexec sleep 60\n")
	pidf, logf := filepath.Join(dir, "dockerd.pid"), filepath.Join(dir, "log", "dockerd.log")
	st, out, err := sh(context.Background(), r, startScript, pidf, logf, sock, "--debug", "--iptables=false")
	if err != nil || st != 0 {
		t.Fatalf("start: status %d, %v: %s", st, err, out)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidf + ".containerd"); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	b, err := os.ReadFile(pidf)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %q: %v", b, err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	// Alive after its launcher's group was killed, in a session of its own.
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Fatalf("dockerd (pid %d) is gone: %v", pid, err)
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	if f[0] == "Z" || f[3] != strconv.Itoa(pid) {
		t.Errorf("dockerd's state %s, session %s: want running, the leader of session %d", f[0], f[3], pid)
	}
	// Its output goes to the log; the script waited until the pid was
	// written, and exec keeps the pid, so the log may still be empty here.
	if st, out, _ := sh(context.Background(), r, pingScript, pidf, filepath.Join(dir, "docker.sock")); st != 1 {
		t.Errorf("ping with dockerd running and no answer: status %d (%s), want 1", st, out)
	}
	// dockerd starts pointed at the socket, once containerd listened there.
	want := "dockerd --containerd=" + sock + " --debug --iptables=false"
	var got []byte
	for deadline := time.Now().Add(10 * time.Second); !bytes.Contains(got, []byte(want)) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		got, _ = os.ReadFile(logf)
	}
	if !bytes.Contains(got, []byte(want)) {
		t.Errorf("dockerd's log %q, want %q", got, want)
	}
	if bytes.Contains(got, []byte("before containerd listened")) {
		t.Errorf("dockerd started before containerd's socket existed (the stale one was not removed?):\n%s", got)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// hostHas reports whether this host has program in the guest scripts'
// sbin directories, where a fake in the test's PATH would not shadow it.
func hostHas(program string) bool {
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		if _, err := os.Stat(filepath.Join(d, program)); err == nil {
			return true
		}
	}
	return false
}

func TestPingScript(t *testing.T) {
	needHostTools(t)
	dir := t.TempDir()
	r := hostRunner{dir}
	pidf, sockf := filepath.Join(dir, "pid"), filepath.Join(dir, "docker.sock")
	fakeProgram(t, dir, "docker", "echo 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
	if st, _, _ := sh(context.Background(), r, pingScript, pidf, sockf); st != 1 {
		t.Errorf("no pid file (never started): status %d, want 1", st)
	}
	if err := os.WriteFile(pidf, []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := sh(context.Background(), r, pingScript, pidf, sockf); st != statusExited {
		t.Errorf("dockerd gone: status %d, want %d", st, statusExited)
	}
	fakeProgram(t, dir, "docker", "[ \"$*\" = \"version --format {{.Server.Version}}\" ] || exit 9\necho 20.10.24\n")
	// No socket yet: the client is not asked (it would answer here).
	if st, out, _ := sh(context.Background(), r, pingScript, pidf, sockf); st != statusExited || out != "" {
		t.Errorf("no socket yet: status %d, output %q; want %d and no client asked", st, out, statusExited)
	}
	ln, err := net.Listen("unix", sockf)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if st, out, _ := sh(context.Background(), r, pingScript, pidf, sockf); st != 0 || strings.TrimSpace(out) != "20.10.24" {
		t.Errorf("daemon answering: status %d, output %q", st, out)
	}
}

func TestTailScript(t *testing.T) {
	needHostTools(t)
	dir := t.TempDir()
	logf := filepath.Join(dir, "dockerd.log")
	if err := os.WriteFile(logf, []byte(longLog(30)), 0o644); err != nil {
		t.Fatal(err)
	}
	st, out, err := sh(context.Background(), hostRunner{dir}, tailScript, logf)
	if err != nil || st != 0 {
		t.Fatalf("status %d, %v: %s", st, err, out)
	}
	if n := strings.Count(out, "\n"); n != 20 || !strings.HasPrefix(out, "time=\"2026-01-01\" level=info msg=\"line 11\"") {
		t.Errorf("%d lines:\n%s", n, out)
	}
}

func TestStopScript(t *testing.T) {
	needHostTools(t)
	dir := t.TempDir()
	pidf := filepath.Join(dir, "dockerd.pid")
	if st, out, err := sh(context.Background(), hostRunner{dir}, stopScript, pidf); err != nil || st != 0 {
		t.Errorf("no pid file (none started): status %d, %v: %s", st, err, out)
	}
	// A stand-in dockerd: a process of this test's that SIGTERM ends.
	d := exec.Command("sleep", "600")
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { d.Wait(); close(ended) }()
	defer d.Process.Kill()
	if err := os.WriteFile(pidf, []byte(strconv.Itoa(d.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The script waits with kill -0, which a zombie passes until it is
	// reaped; the waiter above reaps it.
	if st, out, err := sh(context.Background(), hostRunner{dir}, stopScript, pidf); err != nil || st != 0 {
		t.Errorf("running: status %d, %v: %s", st, err, out)
	}
	// The script saw the pid gone, so the waiter has reaped it and is
	// about to say so; the bound only keeps a broken script from hanging.
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Error("the stand-in dockerd still runs after the stop script returned")
	}
}
