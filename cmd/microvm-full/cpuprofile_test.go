package main

import (
	"bufio"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// checkProfile: go tool pprof reads path as a CPU profile of the binary.
func checkProfile(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command("go", "tool", "pprof", "-top", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Type: cpu") {
		t.Errorf("go tool pprof -top %s: %v\n%s", path, err, out)
	}
}

// TestCPUProfile: --cpuprofile writes a profile pprof reads, with the
// seccomp filter on (the profiler's per-thread timers are set as threads
// run, after the filter: seccomp.Policy.WithCPUProfiling), while the test
// guest echoes 4 MiB through vsock.
func TestCPUProfile(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	dir := t.TempDir()
	uds, prof := filepath.Join(dir, "v.sock"), filepath.Join(dir, "cpu.prof")
	c := startCLI(t, "--kernel", guest, "--memory", "64M", "--cpus", "2", "--vsock-cid", "3", "--vsock-uds", uds,
		"--cmdline", "testguest.mode=echo testguest.port=1234 testguest.conns=1", "--cpuprofile", prof)
	c.waitLine(t, "testguest: listening 1234", 30*time.Second)
	if mode, err := seccompMode(c.cmd.Process.Pid); err != nil || mode != "2" {
		t.Errorf("Seccomp %q, %v; want the filter on every thread", mode, err)
	}
	payload := make([]byte, 4<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	echoThrough(t, c, uds, 1234, payload)
	if s := c.waitExit(t, 30*time.Second); s != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", s, c.stderr.String())
	}
	checkProfile(t, prof)

	// A profile file that cannot be made is a usage error, before the VM.
	wantError(t, 2, []string{"run", "--kernel", guest, "--cpuprofile", filepath.Join(dir, "no", "such", "dir", "p")}, "--cpuprofile")
}

// TestCPUProfileVhostUser: vhost-user-vsock --cpuprofile, filter on, writes
// its profile when SIGTERM stops it.
func TestCPUProfileVhostUser(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prof := filepath.Join(dir, "cpu.prof")
	cmd := exec.Command(exe, "vhost-user-vsock", "--socket", filepath.Join(dir, "vhu.sock"),
		"--uds-path", filepath.Join(dir, "v.sock"), "--cpuprofile", prof)
	cmd.Env = append(os.Environ(), envAsCLI+"=1", "GORACE=atexit_sleep_ms=50")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "vhost-user-vsock listening on") {
		_ = cmd.Process.Kill()
		t.Fatalf("first line %q, %v", line, err)
	}
	if mode, err := seccompMode(cmd.Process.Pid); err != nil || mode != "2" {
		t.Errorf("Seccomp %q, %v; want the filter on every thread", mode, err)
	}
	time.Sleep(100 * time.Millisecond) // threads run with the profiler on
	_ = cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v; stderr:\n%s", err, rest)
	}
	checkProfile(t, prof)
}
