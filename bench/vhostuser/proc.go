package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/microvm/microvm/bench/internal/vhufront"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every architecture Go runs Linux on, so 10 ms.
const clockTick = 10 * time.Millisecond

// cpuTicks parses utime+stime (fields 14 and 15) from a /proc/<pid>/stat
// line. Field 2, the command name, is in parentheses and may contain
// spaces and parentheses itself, so fields are counted after the last ')'.
func cpuTicks(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no ')' after the command name")
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields", len(f)+2)
	}
	u, err1 := strconv.ParseUint(f[14-3], 10, 64)
	s, err2 := strconv.ParseUint(f[15-3], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return u + s, nil
}

// processCPU is the CPU time (user+system, all threads, exited ones
// included) process pid has used.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	t, err := cpuTicks(string(b))
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(t) * clockTick, nil
}

// processSwitches reads what a process did besides running: syscalls
// (syscr+syscw of /proc/PID/io: the read-like and write-like ones, which
// are the data path's; threads that exited included) and context switches
// (voluntary and not, summed over /proc/PID/task/*/status: a sleep or a
// preemption each).
func processSwitches(pid int) (syscalls, switches uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, err
	}
	io := procFields(string(b))
	syscalls = io["syscr"] + io["syscw"]
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended meanwhile
		}
		st := procFields(string(b))
		switches += st["voluntary_ctxt_switches"] + st["nonvoluntary_ctxt_switches"]
	}
	return syscalls, switches, nil
}

// procFields reads "name: number" lines (/proc/PID/io, .../status); lines
// whose value is not one number are left out.
func procFields(s string) map[string]uint64 {
	m := map[string]uint64{}
	for _, l := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			m[strings.TrimSpace(k)] = n
		}
	}
	return m
}

// tail keeps the last bytes written to it (a back-end's stderr).
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 4096

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailSize:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// backendProc is one running vhost-user-vsock back-end process.
type backendProc struct {
	argv      []string
	dir       string // holds its sockets
	sock, uds string
	cmd       *exec.Cmd
	stderr    tail
	done      chan struct{} // closed when it exited
	exitErr   error
}

// expand replaces {socket}, {uds}, {cid}, {opts} and {bin} in each word of
// a command template.
func expand(template []string, vars map[string]string) []string {
	out := make([]string, len(template))
	for i, w := range template {
		for k, v := range vars {
			w = strings.ReplaceAll(w, "{"+k+"}", v)
		}
		out[i] = w
	}
	return out
}

// startBackend starts a back-end from template and waits until its
// vhost-user socket exists.
func startBackend(template []string, bin, opts string, cid uint64, timeout time.Duration) (*backendProc, error) {
	dir, err := os.MkdirTemp("", "vhub")
	if err != nil {
		return nil, err
	}
	b := &backendProc{dir: dir, sock: filepath.Join(dir, "vhu.sock"), uds: filepath.Join(dir, "v.sock"), done: make(chan struct{})}
	b.argv = expand(template, map[string]string{"socket": b.sock, "uds": b.uds, "cid": fmt.Sprint(cid), "opts": opts, "bin": bin})
	b.cmd = exec.Command(b.argv[0], b.argv[1:]...)
	b.cmd.Stderr = &b.stderr
	b.cmd.Stdout = &b.stderr
	// Its own process group, so that stop reaches whatever a wrapper
	// script started too; and Wait does not wait for ever on output pipes
	// a stray grandchild holds.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	b.cmd.WaitDelay = 2 * time.Second
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %q: %w", b.argv, err)
	}
	go func() {
		b.exitErr = b.cmd.Wait()
		close(b.done)
	}()
	end := time.Now().Add(timeout)
	for {
		if st, err := os.Stat(b.sock); err == nil && st.Mode()&os.ModeSocket != 0 {
			return b, nil
		}
		select {
		case <-b.done:
			err := fmt.Errorf("back-end %q exited before listening: %v; its output: %s", b.argv, b.exitErr, b.stderr.String())
			b.stop()
			return nil, err
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(end) {
			b.stop()
			return nil, fmt.Errorf("back-end %q did not create %s within %v; its output: %s", b.argv, b.sock, timeout, b.stderr.String())
		}
	}
}

// connect starts the guest driver on the back-end, retrying while the
// socket file exists but nobody accepts yet.
func (b *backendProc) connect(cfg vhufront.Config, timeout time.Duration) (*vhufront.Guest, error) {
	end := time.Now().Add(timeout)
	for {
		g, err := vhufront.Start(b.sock, cfg)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(end) {
			return nil, fmt.Errorf("%w; back-end output: %s", err, b.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// exited reports whether the process has ended.
func (b *backendProc) exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// stop ends the back-end with SIGTERM, then SIGKILL after 5 s, and removes
// its directory. It returns an error when the back-end had already failed
// or did not stop on SIGTERM. One that exited with status 0 by itself is
// fine: some back-ends end when their front-end disconnects.
func (b *backendProc) stop() error {
	defer os.RemoveAll(b.dir)
	if b.exited() {
		if b.exitErr == nil {
			return nil
		}
		return fmt.Errorf("back-end failed: %v; its output: %s", b.exitErr, b.stderr.String())
	}
	// The group is the one startBackend made for this process (its id is
	// the process's).
	pgid := b.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-b.done:
		return nil
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-b.done
		return fmt.Errorf("back-end did not stop on SIGTERM within 5 s; killed")
	}
}
