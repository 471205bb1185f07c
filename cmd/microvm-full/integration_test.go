package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestRunTestGuest boots the bundled test guest through Main and checks the
// console and the exit status the CLI returns.
func TestRunTestGuest(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	type tc struct {
		name   string
		args   []string
		status int
		lines  []string
	}
	tests := []tc{
		{"fail", []string{"--cmdline", "testguest.mode=fail"}, 3, []string{"testguest: fail mode: exiting with status 3"}},
		{"default cpus", []string{"--cmdline", "testguest.mode=hello"}, 0, []string{"testguest: hello cpus=1"}},
	}
	for n := 1; n <= 4; n++ {
		tests = append(tests, tc{fmt.Sprintf("hello --cpus %d", n),
			[]string{"--cmdline", "testguest.mode=hello", "--cpus", fmt.Sprint(n), "--memory", "64M"},
			0, []string{fmt.Sprintf("testguest: hello cpus=%d", n)}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, stdout, stderr := runMain(t, append([]string{"run", "--kernel", guest}, tc.args...)...)
			if status != tc.status {
				t.Errorf("exit status %d, want %d; stderr:\n%s", status, tc.status, stderr)
			}
			if diff := cmp.Diff(tc.lines, strings.Split(strings.TrimRight(stdout, "\n"), "\n")); diff != "" {
				t.Errorf("console lines (-want +got):\n%s", diff)
			}
			if stderr != "" {
				t.Errorf("stderr = %q, want nothing at the default log level", stderr)
			}
		})
	}
}

// child is the test binary running as the microvm command.
type child struct {
	cmd    *exec.Cmd
	lines  chan string // stdout, line by line
	stderr bytes.Buffer
	once   sync.Once // waits for the process
}

func startCLI(t *testing.T, args ...string) *child {
	t.Helper()
	return startCLIEnv(t, nil, args...)
}

// startCLIEnv is startCLI with env added to the child's environment.
func startCLIEnv(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(exe, append([]string{"run"}, args...)...), lines: make(chan string, 1024)}
	// GORACE: a race-enabled child would otherwise sleep 1 s before exiting.
	c.cmd.Env = append(append(os.Environ(), envAsCLI+"=1", "GORACE=atexit_sleep_ms=50"), env...)
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			select {
			case c.lines <- s.Text():
			default: // a chatty guest: keep draining, drop lines nobody waits for
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		c.wait()
	})
	return c
}

// waitConnectEchoed waits for the test guest's connect mode to report size
// bytes echoed by the host, for microvm to exit with 0, and for the host's
// echo, whose error arrives on echoed, to end.
func (c *child) waitConnectEchoed(t *testing.T, size int, echoed <-chan error) {
	t.Helper()
	c.waitLine(t, fmt.Sprintf("testguest: connect ok: %d bytes echoed", size), 60*time.Second)
	if s := c.waitExit(t, 30*time.Second); s != 0 {
		t.Errorf("exit status %d, want 0; stderr:\n%s", s, c.stderr.String())
	}
	select {
	case err := <-echoed:
		if err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("host echo: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("host echo still running after the guest exited")
	}
}

// waitLine waits for a stdout line containing s.
func (c *child) waitLine(t *testing.T, s string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	var seen []string
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("microvm exited before printing %q; stdout:\n%s\nstderr:\n%s", s, strings.Join(seen, "\n"), c.stderr.String())
			}
			if strings.Contains(l, s) {
				return
			}
			seen = append(seen, l)
		case <-deadline:
			t.Fatalf("no %q on the console within %v; stdout:\n%s", s, d, strings.Join(seen, "\n"))
		}
	}
}

// wait waits for the child once and returns its exit status (-1 if killed by
// a signal).
func (c *child) wait() int {
	c.once.Do(func() { _ = c.cmd.Wait() })
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || ws.Signaled() {
		return -1
	}
	return ws.ExitStatus()
}

// stopWith sends sig and returns the exit status and how long the child took
// to exit.
func (c *child) stopWith(t *testing.T, sig syscall.Signal) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	exited := make(chan int, 1)
	go func() { exited <- c.wait() }()
	select {
	case s := <-exited:
		return s, time.Since(start)
	case <-time.After(15 * time.Second):
		t.Fatalf("microvm still running 15 s after %v", sig)
		return 0, 0
	}
}

// TestExitStatusFromGuest: the process exit status is the byte the guest
// wrote to port 0xf4; a reset is 0; a triple fault is 125.
func TestExitStatusFromGuest(t *testing.T) {
	testenv.RequireKVM(t)
	tests := []struct {
		name   string
		prog   testenv.Program
		status int
		stderr string
	}{
		{"debug exit 0", testenv.Program{}.Exit(0), 0, ""},
		{"debug exit 42", testenv.Program{}.Exit(42), 42, ""},
		{"debug exit 200", testenv.Program{}.Exit(200), 200, ""},
		{"i8042 reset", testenv.Program{}.Reset().Halt(), 0, ""},
		{"triple fault", testenv.Program{}.UD2(), 125, "guest triple fault (KVM_EXIT_SHUTDOWN): vCPU 0 rip="},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := startCLI(t, "--kernel", testenv.TinyGuest(t, tc.prog), "--memory", "16M")
			exited := make(chan int, 1)
			go func() { exited <- c.wait() }()
			select {
			case s := <-exited:
				if s != tc.status {
					t.Errorf("exit status %d, want %d; stderr:\n%s", s, tc.status, c.stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("microvm did not exit")
			}
			if tc.stderr == "" && c.stderr.Len() != 0 {
				t.Errorf("stderr = %q, want nothing", c.stderr.String())
			}
			if !strings.Contains(c.stderr.String(), tc.stderr) {
				t.Errorf("stderr %q does not contain %q", c.stderr.String(), tc.stderr)
			}
		})
	}
}

// TestSignalStopsGuest: SIGINT and SIGTERM stop a running guest cleanly with
// status 128+signal and a log line saying so.
func TestSignalStopsGuest(t *testing.T) {
	testenv.RequireKVM(t)
	kernel := testenv.TinyGuest(t, testenv.Program{}.Print("running\n").Halt())
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			c := startCLI(t, "--kernel", kernel, "--memory", "16M", "--cpus", "2")
			c.waitLine(t, "running", 30*time.Second)
			status, took := c.stopWith(t, sig)
			if want := 128 + int(sig); status != want {
				t.Errorf("exit status %d, want %d; stderr:\n%s", status, want, c.stderr.String())
			}
			if want := "stopped by " + sig.String(); !strings.Contains(c.stderr.String(), want) {
				t.Errorf("stderr %q does not say %q", c.stderr.String(), want)
			}
			t.Logf("exited %v after %v", took.Round(time.Millisecond), sig)
		})
	}
}

// TestSignalStopsTestGuest stops the bundled test guest in a listener mode,
// which runs until killed.
func TestSignalStopsTestGuest(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	uds := filepath.Join(t.TempDir(), "v.sock")
	c := startCLI(t, "--kernel", guest, "--memory", "64M", "--vsock-cid", "3", "--vsock-uds", uds,
		"--cmdline", "testguest.mode=sink testguest.port=1234 testguest.timeout=0")
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("microvm exited with %d before the guest listened; stderr:\n%s", c.wait(), c.stderr.String())
			}
			if !strings.Contains(l, "testguest: listening 1234") {
				continue
			}
		case <-deadline:
			t.Fatal("guest not listening within 30 s")
		}
		break
	}
	status, took := c.stopWith(t, syscall.SIGTERM)
	if status != 128+int(syscall.SIGTERM) {
		t.Errorf("exit status %d, want %d; stderr:\n%s", status, 128+int(syscall.SIGTERM), c.stderr.String())
	}
	t.Logf("exited %v after SIGTERM", took.Round(time.Millisecond))
}

// TestLinuxToInit is what a user types: `microvm run --kernel bzImage
// --initrd initramfs` boots the Linux test kernel to its Go /init, which
// restarts the machine when done (reboot=k), and microvm exits 0 with the
// console on stdout and nothing on stderr. It needs a KVM that can run Linux
// (hardware KVM, natively or in the nested-KVM box).
func TestLinuxToInit(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	kernel := testenv.BzImage(t)
	initrd := testenv.Initrd(t)
	start := time.Now()
	c := startCLI(t, "--kernel", kernel, "--initrd", initrd, "--cpus", "2",
		"--cmdline", "console=ttyS0 reboot=k panic=-1")
	c.waitLine(t, "init: ready", 3*time.Minute)
	t.Logf("/init started %v after microvm", time.Since(start).Round(time.Millisecond))
	c.waitLine(t, "init: done ok", time.Minute)
	exited := make(chan int, 1)
	go func() { exited <- c.wait() }()
	select {
	case status := <-exited:
		if status != 0 {
			t.Errorf("exit status %d, want 0 (the guest restarted the machine); stderr:\n%s", status, c.stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("microvm still running a minute after /init finished")
	}
	if c.stderr.Len() != 0 {
		t.Errorf("stderr = %q, want nothing at the default log level", c.stderr.String())
	}
}

// TestMetricsSocket: `microvm run --metrics-socket PATH` serves GET
// /metrics on PATH while the guest runs (an HTTP client on the Unix socket,
// as curl --unix-socket), removes the socket when it exits, and a path it
// cannot listen on fails the run with one line and status 1.
func TestMetricsSocket(t *testing.T) {
	testenv.RequireKVM(t)
	kernel := testenv.TinyGuest(t, testenv.Program{}.Print("running\n").Halt())
	dir, err := os.MkdirTemp("", "mvm")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "m.sock")

	t.Run("serves while running", func(t *testing.T) {
		c := startCLI(t, "--kernel", kernel, "--memory", "16M", "--metrics-socket", sock)
		c.waitLine(t, "running", 30*time.Second)
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			}}}
		resp, err := client.Get("http://localhost/metrics")
		if err != nil {
			t.Fatalf("GET /metrics: %v; stderr:\n%s", err, c.stderr.String())
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics: %s, %v", resp.Status, err)
		}
		// "running\n" is 8 console bytes, 8 port writes.
		m := regexp.MustCompile(`(?m)^microvm_vcpu_exits_total\{vcpu="0",reason="io"\} (\d+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("no io exit counter for vCPU 0 in:\n%s", body)
		}
		if n, _ := strconv.Atoi(string(m[1])); n < 8 {
			t.Errorf("%d io exits, want at least the 8 console bytes", n)
		}
		client.CloseIdleConnections()
		if status, _ := c.stopWith(t, syscall.SIGTERM); status != 143 {
			t.Errorf("exit status %d, want 143; stderr:\n%s", status, c.stderr.String())
		}
		if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("metrics socket after exit: %v, want it removed", err)
		}
	})

	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct{ name, path, want string }{
		{"missing directory", filepath.Join(dir, "nope", "m.sock"), "metrics socket " + filepath.Join(dir, "nope", "m.sock") + ": directory " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{"live socket", live, "metrics socket: " + live + " is in use by another process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, 1, []string{"run", "--kernel", kernel, "--memory", "16M", "--metrics-socket", tc.path}, tc.want)
		})
	}
}
