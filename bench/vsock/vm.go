package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// guestPort is the vsock port the test guest listens on.
const guestPort = 1024

// vm is one microvm process running the test guest in a listener mode.
// The benchmark goroutine drives it; a reader goroutine owns stdout and
// appends to console under mu.
type vm struct {
	cmd    *exec.Cmd
	dir    string
	uds    string
	stderr testenv.SyncBuffer

	mu        sync.Mutex
	console   strings.Builder
	listening chan struct{} // closed at "testguest: listening"
	exited    chan struct{} // closed when the process has been waited for
	waitErr   error
}

// target is what runs: the binaries and the knobs passed to them.
type target struct {
	microvm, guest string
	connBuffer     string // --vsock-conn-buffer, "" for the default
	vsockOpt       string // --vsock-opt, "" for the defaults
	bufsize        int    // testguest.bufsize, 0 for the default
	nowait         bool   // testguest.wait=0: the guest polls, never sleeping on the wait port
}

// startVM runs microvm with the test guest and cmdline, and waits until the
// guest listens.
func startVM(tgt target, cmdline string) (*vm, error) {
	dir, err := os.MkdirTemp("", "mvbench")
	if err != nil {
		return nil, err
	}
	v := &vm{dir: dir, uds: filepath.Join(dir, "v.sock"), listening: make(chan struct{}), exited: make(chan struct{})}
	if tgt.bufsize != 0 {
		cmdline += fmt.Sprintf(" testguest.bufsize=%d", tgt.bufsize)
	}
	if tgt.nowait {
		cmdline += " testguest.wait=0"
	}
	args := []string{"run", "--kernel", tgt.guest, "--memory", "64M", "--cmdline", cmdline, "--vsock-cid", "3", "--vsock-uds", v.uds}
	if tgt.vsockOpt != "" {
		args = append(args, "--vsock-opt", tgt.vsockOpt)
	}
	if tgt.connBuffer != "" {
		args = append(args, "--vsock-conn-buffer", tgt.connBuffer)
	}
	v.cmd = exec.Command(tgt.microvm, args...)
	v.cmd.Stderr = &v.stderr
	out, err := v.cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := v.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			l := sc.Text()
			v.mu.Lock()
			v.console.WriteString(l + "\n")
			v.mu.Unlock()
			if strings.HasPrefix(l, "testguest: listening ") {
				once.Do(func() { close(v.listening) })
			}
		}
		v.waitErr = v.cmd.Wait()
		close(v.exited)
	}()
	select {
	case <-v.listening:
		return v, nil
	case <-v.exited:
		err = fmt.Errorf("microvm exited before the guest listened: %v\n%s", v.waitErr, v.output())
	case <-time.After(20 * time.Second):
		err = fmt.Errorf("guest not listening after 20 s:\n%s", v.output())
	}
	v.kill()
	return nil, err
}

// output is the console and stderr so far, for error messages.
func (v *vm) output() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return "console:\n" + v.console.String() + "stderr:\n" + v.stderr.String()
}

func (v *vm) pid() int { return v.cmd.Process.Pid }

// wait waits for microvm to exit and checks it exited 0.
func (v *vm) wait(timeout time.Duration) error {
	defer os.RemoveAll(v.dir)
	select {
	case <-v.exited:
	case <-time.After(timeout):
		v.kill()
		return fmt.Errorf("microvm still running %v after the transfer:\n%s", timeout, v.output())
	}
	if v.waitErr != nil {
		return fmt.Errorf("microvm: %v\n%s", v.waitErr, v.output())
	}
	return nil
}

// kill ends microvm (SIGTERM, then SIGKILL) and removes its directory.
func (v *vm) kill() {
	_ = v.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-v.exited:
	case <-time.After(5 * time.Second):
		_ = v.cmd.Process.Kill()
		<-v.exited
	}
	os.RemoveAll(v.dir)
}

// connect opens a host connection to the guest's port through the
// Firecracker handshake (testenv.VsockConnect); no stream data is consumed
// with the answer.
func (v *vm) connect(port int) (*net.UnixConn, error) {
	c, _, err := testenv.VsockConnect(v.uds, uint32(port), 20*time.Second)
	return c, err
}

// stats is the guest's stats line (docs/testguest.md), once it has printed
// it.
func (v *vm) stats() (testenv.GuestStats, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return testenv.ParseGuestStats(v.console.String())
}
