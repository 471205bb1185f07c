//go:build amd64

package seccomp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envChild makes the test binary run one child scenario (childScenarios)
// instead of the tests: installing a filter is for the life of the
// process, so every test that installs one does it in a child.
const envChild = "SECCOMP_TEST_CHILD"

const testHint = "test hint"

func TestMain(m *testing.M) {
	if name := os.Getenv(envChild); name != "" {
		runChild(name)
	}
	os.Exit(m.Run())
}

// childScenarios run in a child process. Each installs a filter and makes
// calls; what it prints and how it exits is checked by the parent test.
var childScenarios = map[string]func() error{
	// workload: what a VMM does at run time, under the VMM policy: the
	// filter must let all of it through.
	"workload": func() error {
		dir := os.Getenv("SECCOMP_TEST_DIR")
		ln, err := net.Listen("unix", filepath.Join(dir, "s")) // bind and listen before Install
		if err != nil {
			return err
		}
		if err := install(); err != nil {
			return err
		}
		fmt.Println("installed")
		// Wait for the parent to have looked at /proc.
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return err
		}
		return workload(ln, filepath.Join(dir, "s"))
	},
	// Each of these makes one forbidden call after Install.
	"open": func() error {
		if err := install(); err != nil {
			return err
		}
		f, err := os.Open("/etc/hostname")
		return fmt.Errorf("open: allowed (%v, %v)", f, err)
	},
	"socket-inet": func() error {
		if err := install(); err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		return fmt.Errorf("socket(AF_INET): allowed (%d, %v)", fd, err)
	},
	"ioctl-create-vm": func() error {
		if err := install(); err != nil {
			return err
		}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, 1234, 0xae01, 0) // KVM_CREATE_VM on a bad fd
		return fmt.Errorf("ioctl KVM_CREATE_VM: allowed (%v)", errno)
	},
	"mmap-exec": func() error {
		if err := install(); err != nil {
			return err
		}
		b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_ANON|unix.MAP_PRIVATE)
		return fmt.Errorf("mmap PROT_EXEC: allowed (%d bytes, %v)", len(b), err)
	},
	"exec": func() error {
		if err := install(); err != nil {
			return err
		}
		// Descriptors given, so os/exec opens no /dev/null first.
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}})
		return fmt.Errorf("exec: allowed (%d, %v)", pid, err)
	},
	"socket-from-many-threads": func() error {
		// Forbidden calls from several threads at once, through
		// RawSyscall (the thread keeps its P): one report, one
		// exit, no hang.
		if err := install(); err != nil {
			return err
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				_, _ = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
			}()
		}
		wg.Wait()
		return errors.New("socket from 8 threads: allowed")
	},
	"kill-sigsys": func() error {
		// A SIGSYS from outside is not a forbidden call.
		if err := install(); err != nil {
			return err
		}
		_ = unix.Kill(os.Getpid(), unix.SIGSYS)
		time.Sleep(10 * time.Second)
		return errors.New("survived SIGSYS")
	},
}

// install installs the VMM policy as the child scenarios use it.
func install() error {
	return Install(VMM(), Options{Prefix: "seccomp-test", Hint: testHint})
}

// runChild runs a scenario and exits: 0 if it returned nil, 1 with the
// error on stderr otherwise.
func runChild(name string) {
	f, ok := childScenarios[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "no scenario %q\n", name)
		os.Exit(3)
	}
	if err := f(); err != nil {
		fmt.Fprintf(os.Stderr, "scenario %s: %v\n", name, err)
		os.Exit(1)
	}
	fmt.Println("done")
	os.Exit(0)
}

// workload exercises the calls the VMM makes at run time: threads and
// goroutines, GC, timers, the netpoller, Unix socket dial/accept/IO and
// half-close, eventfds and poll, getrandom, signals to itself.
func workload(ln net.Listener, path string) error {
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c) // echo until the client half-closes
		errc <- err
	}()
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	msg := bytes.Repeat([]byte("microvm"), 100000)
	go func() {
		_, _ = c.Write(msg)
		_ = c.(*net.UnixConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, msg) {
		return fmt.Errorf("echo: %d of %d bytes, %v", len(got), len(msg), err)
	}
	c.Close()
	if err := <-errc; err != nil {
		return fmt.Errorf("echo server: %w", err)
	}
	// Many goroutines, some locked to new threads, allocating, with GC.
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%8 == 0 {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			b := make([][]byte, 0, 64)
			for j := range 64 {
				b = append(b, make([]byte, 1<<(j%16)))
			}
			time.Sleep(time.Millisecond)
			_ = b
		}()
	}
	wg.Wait()
	runtime.GC()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		return fmt.Errorf("eventfd write: %w", err)
	}
	p := []unix.PollFd{{Fd: int32(efd), Events: unix.POLLIN}}
	if n, err := unix.Poll(p, 1000); n != 1 || err != nil {
		return fmt.Errorf("poll: %d, %v", n, err)
	}
	unix.Close(efd)
	var rnd [16]byte
	if _, err := unix.Getrandom(rnd[:], 0); err != nil {
		return fmt.Errorf("getrandom: %w", err)
	}
	// A signal to itself, as vCPU kicks send them.
	if err := unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGURG); err != nil {
		return fmt.Errorf("tgkill: %w", err)
	}
	fmt.Println(time.Now().Format(time.RFC3339)) // the local time zone, loaded before Install
	return nil
}

// child is a running scenario.
type child struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr bytes.Buffer
	out            *bufio.Reader
}

func startChild(t *testing.T, name string, env ...string) *child {
	env = slices.DeleteFunc(env, func(e string) bool { return e == "" })
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.cmd.Env = append(append(os.Environ(), envChild+"="+name, "GORACE=atexit_sleep_ms=0"), env...)
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	pr, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.out = bufio.NewReader(io.TeeReader(pr, &c.stdout))
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
	return c
}

// wait waits (at most a minute: a forbidden call must not hang the
// process) and returns the exit status, -1 for a signal.
func (c *child) wait(t *testing.T) int {
	t.Helper()
	_, _ = io.Copy(io.Discard, c.out)
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = c.cmd.Process.Kill()
		t.Fatalf("child still running after a minute; stderr:\n%s", c.stderr.String())
	}
	ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return -1
	}
	return ws.ExitStatus()
}

// requireSeccomp skips where the kernel has no seccomp filters (the
// subprocess tests would only see Install fail).
func requireSeccomp(t *testing.T) {
	t.Helper()
	if err := actionAvail(retAllow); err != nil {
		t.Skipf("no seccomp filters here: %v", err)
	}
}

// TestWorkloadUnderFilter: a child under the VMM policy runs a VMM-like
// workload to the end, and the kernel shows the filter on every thread
// with no_new_privs.
func TestWorkloadUnderFilter(t *testing.T) {
	requireSeccomp(t)
	c := startChild(t, "workload", "SECCOMP_TEST_DIR="+t.TempDir())
	line, err := c.out.ReadString('\n')
	if err != nil || line != "installed\n" {
		t.Fatalf("child: %q, %v; stderr:\n%s", line, err, c.stderr.String())
	}
	checkFiltered(t, c.cmd.Process.Pid)
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if status := c.wait(t); status != 0 {
		t.Fatalf("workload under the filter: exit status %d; stderr:\n%s", status, c.stderr.String())
	}
	if !strings.Contains(c.stdout.String(), "done") {
		t.Errorf("stdout %q lacks done", c.stdout.String())
	}
	if c.stderr.Len() != 0 {
		t.Errorf("stderr %q, want nothing", c.stderr.String())
	}
}

// checkFiltered checks /proc/PID/task/*/status: every thread has a seccomp
// filter (Seccomp: 2) and no_new_privs.
func checkFiltered(t *testing.T, pid int) {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no tasks for pid %d: %v", pid, err)
	}
	for _, st := range tasks {
		b, err := os.ReadFile(st)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"\nSeccomp:\t2\n", "\nNoNewPrivs:\t1\n"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s lacks %q", st, strings.TrimSpace(want))
			}
		}
	}
	t.Logf("%d threads filtered", len(tasks))
}

// TestForbiddenCallReported: each forbidden call ends the child with
// ExitStatus and exactly one line naming the call (and nothing after the
// call ran: its "allowed" error never prints).
func TestForbiddenCallReported(t *testing.T) {
	requireSeccomp(t)
	tests := []struct {
		scenario string
		env      string
		line     string // a regexp for the report
	}{
		{"socket-inet", "", `forbidden system call socket \(41\)`},
		{"socket-inet", "GOMAXPROCS=1", `forbidden system call socket \(41\)`},
		{"ioctl-create-vm", "", `forbidden system call ioctl \(16\)`},
		{"mmap-exec", "", `forbidden system call mmap \(9\)`},
		{"exec", "", `forbidden system call [a-z0-9_]+ \(\d+\)`}, // whichever call ForkExec makes first
		{"socket-from-many-threads", "", `forbidden system call socket \(41\)`},
		{"kill-sigsys", "", `SIGSYS sent by another process`},
	}
	if len(cgoThreadFlags) == 0 {
		// cgo builds: openat fails with EACCES (TestOpenCgo).
		tests = append(tests, struct{ scenario, env, line string }{"open", "", `forbidden system call openat \(257\)`})
	}
	for _, tc := range tests {
		t.Run(strings.TrimSpace(tc.scenario+" "+tc.env), func(t *testing.T) {
			c := startChild(t, tc.scenario, tc.env)
			status := c.wait(t)
			if status != ExitStatus {
				t.Errorf("exit status %d, want %d", status, ExitStatus)
			}
			re := regexp.MustCompile(`^seccomp-test: seccomp: ` + tc.line + `; stopped \(` + testHint + `\)\n$`)
			if !re.MatchString(c.stderr.String()) {
				t.Errorf("stderr:\n%s\nwant it to match %s", c.stderr.String(), re)
			}
			if c.stdout.Len() != 0 {
				t.Errorf("stdout %q: the scenario went on after the call", c.stdout.String())
			}
			t.Logf("%s", strings.TrimSpace(c.stderr.String()))
		})
	}
}

// TestOpenCgo: in a cgo build an open fails with EACCES and the process
// goes on (glibc opens a file from threads that block SIGSYS: cgo_on.go).
func TestOpenCgo(t *testing.T) {
	requireSeccomp(t)
	if len(cgoThreadFlags) == 0 {
		t.Skip("static build: an open is reported (TestForbiddenCallReported)")
	}
	c := startChild(t, "open")
	if status := c.wait(t); status != 1 {
		t.Errorf("exit status %d, want 1", status)
	}
	if want := "scenario open: open: allowed (<nil>, open /etc/hostname: permission denied)\n"; c.stderr.String() != want {
		t.Errorf("stderr %q, want %q", c.stderr.String(), want)
	}
}
