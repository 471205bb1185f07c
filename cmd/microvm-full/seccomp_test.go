package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/seccomp"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/vsock/hybrid"
)

// seccompMode reads the Seccomp field of every thread of pid from /proc:
// 2 (a filter) on all of them, 0 on all of them, or an error saying which
// thread differs.
func seccompMode(pid int) (string, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return "", fmt.Errorf("no threads for pid %d: %v", pid, err)
	}
	mode := ""
	for _, st := range tasks {
		b, err := os.ReadFile(st)
		if err != nil {
			return "", err
		}
		_, rest, ok := strings.Cut(string(b), "\nSeccomp:\t")
		if !ok {
			return "", fmt.Errorf("%s: no Seccomp field", st)
		}
		m, _, _ := strings.Cut(rest, "\n")
		if mode != "" && m != mode {
			return "", fmt.Errorf("%s: Seccomp %s, other threads %s", st, m, mode)
		}
		mode = m
	}
	return mode, nil
}

// echoThrough sends payload to the test guest's echo on port through the
// VM's vsock socket uds and checks that all of it comes back.
func echoThrough(t *testing.T, c *child, uds string, port uint32, payload []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := hybrid.Dial(ctx, uds, port)
	if err != nil {
		t.Fatalf("dial: %v; stderr:\n%s", err, c.stderr.String())
	}
	go func() {
		_, _ = conn.Write(payload)
		_ = conn.CloseWrite()
	}()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || !bytes.Equal(got, payload) {
		t.Errorf("echo: %d of %d bytes back, equal %v, err %v", len(got), len(payload), bytes.Equal(got, payload), err)
	}
}

// waitExit waits up to d for the child and returns its exit status.
func (c *child) waitExit(t *testing.T, d time.Duration) int {
	t.Helper()
	exited := make(chan int, 1)
	go func() { exited <- c.wait() }()
	select {
	case s := <-exited:
		return s
	case <-time.After(d):
		t.Fatalf("microvm still running after %v; stderr:\n%s", d, c.stderr.String())
		return 0
	}
}

// TestSeccompVsock: under the seccomp filter (on by default) the test
// guest runs and moves vsock data both ways: a host client's connection
// echoed by the guest (accept, readv/writev on the device's socket), and a
// guest connection to <uds>_<port> (socket and connect at run time) that
// the host echoes. Every thread of microvm shows the filter in /proc while
// the guest runs; with --seccomp=off none does.
func TestSeccompVsock(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	payload := make([]byte, 1<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		mode string
	}{
		{"default", nil, "2"},
		{"--seccomp=off", []string{"--seccomp=off"}, "0"},
	} {
		t.Run("host to guest "+tc.name, func(t *testing.T) {
			uds := filepath.Join(t.TempDir(), "v.sock")
			c := startCLI(t, append([]string{"--kernel", guest, "--memory", "64M", "--cpus", "2",
				"--vsock-cid", "3", "--vsock-uds", uds,
				"--cmdline", "testguest.mode=echo testguest.port=1234 testguest.conns=1"}, tc.args...)...)
			c.waitLine(t, "testguest: listening 1234", 30*time.Second)
			if mode, err := seccompMode(c.cmd.Process.Pid); err != nil || mode != tc.mode {
				t.Errorf("Seccomp in /proc/PID/task/*/status: %q, %v; want %s on every thread", mode, err, tc.mode)
			}
			echoThrough(t, c, uds, 1234, payload)
			if s := c.waitExit(t, 30*time.Second); s != 0 {
				t.Errorf("exit status %d, want 0; stderr:\n%s", s, c.stderr.String())
			}
			if c.stderr.Len() != 0 {
				t.Errorf("stderr %q, want nothing", c.stderr.String())
			}
		})
	}

	t.Run("guest to host", func(t *testing.T) {
		uds := filepath.Join(t.TempDir(), "v.sock")
		ln, err := net.Listen("unix", uds+"_5001")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		echoed := make(chan error, 1)
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				echoed <- err
				return
			}
			defer conn.Close()
			_, err = io.Copy(conn, conn)
			echoed <- err
		}()
		c := startCLI(t, "--kernel", guest, "--memory", "64M", "--vsock-cid", "3", "--vsock-uds", uds,
			"--cmdline", fmt.Sprintf("testguest.mode=connect testguest.port=5001 testguest.bytes=%d", len(payload)))
		c.waitConnectEchoed(t, len(payload), echoed)
		if c.stderr.Len() != 0 {
			t.Errorf("stderr %q, want nothing", c.stderr.String())
		}
	})
}

// TestSeccompForbiddenCall: a forbidden system call made once the filter is
// in (the test binary's hook dials TCP, a socket(AF_INET)) ends microvm
// with status 159 and exactly one line naming the call; with --seccomp=off
// the same call goes through and the guest runs to its end.
func TestSeccompForbiddenCall(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	env := []string{envSeccompForbidden + "=1"}
	args := []string{"--kernel", guest, "--memory", "64M", "--cmdline", "testguest.mode=hello"}

	c := startCLIEnv(t, env, args...)
	if s := c.waitExit(t, 30*time.Second); s != seccomp.ExitStatus {
		t.Errorf("exit status %d, want %d", s, seccomp.ExitStatus)
	}
	want := "microvm: seccomp: forbidden system call socket (41); stopped (" + clibase.SeccompHint + ")\n"
	if got := c.stderr.String(); got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}

	c = startCLIEnv(t, env, append(args, "--seccomp=off")...)
	c.waitLine(t, "testguest: hello cpus=1", 30*time.Second)
	if s := c.waitExit(t, 30*time.Second); s != 0 {
		t.Errorf("--seccomp=off: exit status %d, want 0; stderr:\n%s", s, c.stderr.String())
	}
}

// TestRunAsUser: --uid/--gid take effect on every thread once the machine
// is set up (as root here: /dev/kvm, the kernel and the vsock socket were
// opened before), with no supplementary groups and the filter on; the VM
// keeps running and serving its socket.
func TestRunAsUser(t *testing.T) {
	testenv.RequireKVM(t)
	if os.Geteuid() != 0 {
		t.Skip("changing user needs root")
	}
	guest := testenv.TestGuest(t)
	uds := filepath.Join(t.TempDir(), "v.sock")
	c := startCLI(t, "--kernel", guest, "--memory", "64M", "--cpus", "2", "--vsock-cid", "3", "--vsock-uds", uds,
		"--uid", "65534", "--gid", "65533", "--cmdline", "testguest.mode=echo testguest.port=1234 testguest.conns=1")
	c.waitLine(t, "testguest: listening 1234", 30*time.Second)
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", c.cmd.Process.Pid))
	if err != nil || len(tasks) < 2 {
		t.Fatalf("threads: %v, %v", tasks, err)
	}
	for _, st := range tasks {
		b, err := os.ReadFile(st)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"\nUid:\t65534\t65534\t65534\t65534\n", "\nGid:\t65533\t65533\t65533\t65533\n", "\nGroups:\t \n", "\nSeccomp:\t2\n"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s lacks %q", st, strings.TrimSpace(want))
			}
		}
	}
	echoThrough(t, c, uds, 1234, []byte("as nobody"))
	if s := c.waitExit(t, 30*time.Second); s != 0 {
		t.Errorf("exit status %d, want 0; stderr:\n%s", s, c.stderr.String())
	}
}

// TestPrivilegeFlagErrors: --uid and --gid are checked before any VM is
// created.
func TestPrivilegeFlagErrors(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(kernel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantError(t, 2, []string{"run", "--kernel", kernel, "--uid", "1000"}, "--uid and --gid go together")
	wantError(t, 2, []string{"run", "--kernel", kernel, "--gid", "1000"}, "--uid and --gid go together")
	wantError(t, 2, []string{"run", "--kernel", kernel, "--uid", "-1", "--gid", "0"}, "want ids from 0 to 4294967294")
	wantError(t, 2, []string{"run", "--kernel", kernel, "--uid", "0", "--gid", "4294967295"}, "want ids from 0 to 4294967294")
	wantError(t, 2, []string{"run", "--kernel", kernel, "--seccomp=maybe"}, `"maybe": want on or off`)
}

// TestSeccompVhostUser: vhost-user-vsock installs its filter (the
// VhostUserVsock list) before it says it is listening, and still stops
// cleanly on SIGTERM. The conformance suite runs QEMU's Linux guests
// against it.
func TestSeccompVhostUser(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, tc := range []struct{ flag, mode string }{{"--seccomp=on", "2"}, {"--seccomp=off", "0"}} {
		cmd := exec.Command(exe, "vhost-user-vsock", "--socket", filepath.Join(dir, "vhu.sock"),
			"--uds-path", filepath.Join(dir, "v.sock"), tc.flag)
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
			t.Fatalf("%s: first line %q, %v", tc.flag, line, err)
		}
		if mode, err := seccompMode(cmd.Process.Pid); err != nil || mode != tc.mode {
			t.Errorf("%s: Seccomp %q, %v; want %s on every thread", tc.flag, mode, err, tc.mode)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		rest, _ := io.ReadAll(stderr)
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: after SIGTERM: %v; stderr:\n%s", tc.flag, err, rest)
		}
	}
}
