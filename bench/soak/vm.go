package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testing/consoletest"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// guestPort is the vsock port the test guest listens on.
const guestPort = 1024

// vm is one in-process machine running the test guest with a vsock device,
// started through the Go API (microvm.New, Run on a goroutine, Close). The
// soak goroutine drives it; Run's goroutine only sets res and err before
// closing done.
type vm struct {
	m       *microvm.Machine
	uds     string
	console *consoletest.Console
	log     *testenv.SyncBuffer
	cancel  context.CancelFunc
	done    chan struct{}
	res     microvm.Result
	err     error
}

// startVM creates a machine booting guest with cmdline, its vsock Unix
// socket at uds, and runs it in the background.
func startVM(guest, cmdline, uds string, memory uint64) (*vm, error) {
	v := &vm{uds: uds, console: consoletest.New(), log: &testenv.SyncBuffer{}, done: make(chan struct{})}
	log := logrus.New()
	log.SetOutput(v.log)
	log.SetLevel(logrus.WarnLevel)
	m, err := microvm.New(microvm.Config{
		Kernel: guest, Cmdline: cmdline, MemoryBytes: memory,
		Console: v.console, Log: log,
		Vsock: &microvm.VsockConfig{CID: 3, UDSPath: uds},
	})
	if err != nil {
		return nil, fmt.Errorf("microvm.New: %w", err)
	}
	v.m = m
	ctx, cancel := context.WithCancel(context.Background())
	v.cancel = cancel
	go func() {
		defer close(v.done)
		v.res, v.err = m.Run(ctx)
	}()
	return v, nil
}

// waitListening waits for the guest's "listening" line: before it, host
// connections would reach a device the driver has not set up.
func (v *vm) waitListening(port int, d time.Duration) error {
	if !v.console.WaitFor(fmt.Sprintf("testguest: listening %d\n", port), d, v.done) {
		return fmt.Errorf("guest not listening on %d after %v%s", port, d, v.output())
	}
	return nil
}

// wait waits up to d for Run to return by itself and checks the guest ended
// through the debug-exit port with status.
func (v *vm) wait(status int, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-v.done:
	case <-t.C:
		return fmt.Errorf("guest still running after %v%s", d, v.output())
	}
	if v.err != nil {
		return fmt.Errorf("machine Run: %w%s", v.err, v.output())
	}
	if v.res.Kind != microvm.ExitDebugPort || v.res.Status != status {
		return fmt.Errorf("guest ended with %v status %d, want debug-exit status %d%s", v.res.Kind, v.res.Status, status, v.output())
	}
	return nil
}

// stop cancels Run and waits up to d for it to return with ExitCanceled.
func (v *vm) stop(d time.Duration) error {
	v.cancel()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-v.done:
	case <-t.C:
		return fmt.Errorf("machine Run did not return %v after cancel%s", d, v.output())
	}
	if v.res.Kind != microvm.ExitCanceled || !errors.Is(v.res.Err, context.Canceled) {
		return fmt.Errorf("machine Run after cancel: %v (%v), want canceled%s", v.res.Kind, v.res.Err, v.output())
	}
	return nil
}

// close releases the machine (Run must have returned) and checks that the
// vsock socket file went with it.
func (v *vm) close() error {
	v.cancel()
	if err := v.m.Close(); err != nil {
		return fmt.Errorf("machine Close: %w", err)
	}
	if _, err := os.Stat(v.uds); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("vsock socket %s still there after Close (%v)", v.uds, err)
	}
	return nil
}

// output is the console and the VMM's log so far, for error messages.
func (v *vm) output() string {
	return "\nconsole:\n" + tail(v.console.String(), 4096) + "\nlog:\n" + tail(v.log.String(), 4096)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// socketDir makes a short private directory for vsock sockets: sun_path
// holds 107 bytes, and the device adds "_<port>" to the path.
func socketDir() (string, error) {
	return os.MkdirTemp("", "soak")
}

func socketPath(dir, name string) string { return filepath.Join(dir, name) }

// readAll reads c to end of stream (or error) and returns how many bytes
// came.
func readAll(c io.Reader) (int64, error) {
	return io.Copy(io.Discard, c)
}
