package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/agentguest"
	"github.com/microvm/microvm/internal/testing/consoletest"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// vm is one machine in this process, booted (microvm.New) or restored
// (microvm.Restore), with Run on a goroutine of its own. The goroutine
// that made it drives it and calls shutdown; Run's goroutine only sets res
// and err before closing done.
type vm struct {
	m       *microvm.Machine
	uds     string // the vsock device's host socket
	console *consoletest.Console
	log     *testenv.SyncBuffer

	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	res    microvm.Result
	err    error // Run's error; read after done is closed
}

// newVM returns a vm with its console and log, not yet built.
func newVM(uds string) *vm {
	return &vm{uds: uds, console: consoletest.New(), log: &testenv.SyncBuffer{}, done: make(chan struct{})}
}

// logger is the VMM's log for v: warnings and errors, kept for messages.
func (v *vm) logger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(v.log)
	l.SetLevel(logrus.WarnLevel)
	return l
}

// boot creates a machine from cfg (its console, log and vsock socket are
// the vm's; cid its vsock CID) and runs it.
func boot(cfg microvm.Config, uds string, cid uint64) (*vm, error) {
	v := newVM(uds)
	cfg.Console, cfg.Log = v.console, v.logger()
	cfg.Vsock = &microvm.VsockConfig{CID: cid, UDSPath: uds}
	m, err := microvm.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("microvm.New: %w", err)
	}
	v.m = m
	v.start()
	return v, nil
}

// restore builds the machine of the snapshot in dir with its own vsock
// socket uds and CID (reading its memory in at once with prefault,
// Config.PrefaultMemory), and returns it with the time Restore took; Run
// has not started (start does that).
func restore(dir, uds string, cid uint64, prefault bool) (*vm, time.Duration, error) {
	v := newVM(uds)
	host := microvm.Config{Console: v.console, Log: v.logger(), Vsock: &microvm.VsockConfig{CID: cid, UDSPath: uds},
		PrefaultMemory: prefault}
	start := time.Now()
	m, err := microvm.Restore(dir, host)
	took := time.Since(start)
	if err != nil {
		return nil, took, fmt.Errorf("microvm.Restore: %w%s", err, tail("log", v.log.String()))
	}
	v.m = m
	return v, took, nil
}

// start runs the machine on a goroutine of its own.
func (v *vm) start() {
	ctx, cancel := context.WithCancel(context.Background())
	v.cancel = cancel
	go func() {
		defer close(v.done)
		v.res, v.err = v.m.Run(ctx)
	}()
}

// ended reports whether Run has returned.
func (v *vm) ended() bool {
	return agentguest.Ended(v.done)
}

// shutdown stops the machine, waits for Run and releases the machine.
func (v *vm) shutdown() {
	if v.cancel != nil {
		v.cancel()
		<-v.done
	}
	v.m.Close()
}

// waitSnapshotStop waits up to d for Run to return after a Snapshot with
// Stop, which ends it with ExitSnapshot.
func (v *vm) waitSnapshotStop(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-v.done:
	case <-t.C:
		return v.describe(fmt.Errorf("the machine still runs %v after a snapshot with Stop", d))
	}
	if v.res.Kind != microvm.ExitSnapshot {
		return v.describe(fmt.Errorf("the machine ended with %v (%v) after a snapshot with Stop, want %v", v.res.Kind, v.err, microvm.ExitSnapshot))
	}
	return nil
}

// describe adds to err how Run ended, if it has, and the tails of the
// guest's console and the VMM's log.
func (v *vm) describe(err error) error {
	if v.ended() {
		err = fmt.Errorf("%w (the VM ended: %v, status %d, %v)", err, v.res.Kind, v.res.Status, v.err)
	}
	return fmt.Errorf("%w%s%s", err, tail("console", v.console.String()), tail("log", v.log.String()))
}

// tail is the last KiB of s, labelled, for an error message; nothing when
// s is empty.
func tail(what, s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	if len(s) > 1024 {
		s = "..." + s[len(s)-1024:]
	}
	return fmt.Sprintf("; %s: %q", what, s)
}

// firstLine is an error message up to its console or log tail, for the
// table (the JSON keeps all of it).
func firstLine(s string) string {
	for _, sep := range []string{"; console: ", "; log: "} {
		s, _, _ = strings.Cut(s, sep)
	}
	return s
}

// snapshotLive makes a snapshot of the running machine into dir (replacing
// one there) with a single Snapshot call, which pauses the vCPUs and lets
// them go on after; it returns the call's time.
func snapshotLive(ctx context.Context, m *microvm.Machine, dir string) (time.Duration, error) {
	start := time.Now()
	err := m.Snapshot(ctx, dir, microvm.SnapshotOptions{Overwrite: true})
	return time.Since(start), err
}

// pausedTimes are the steps of a snapshot made with the vCPUs paused by
// the caller: Pause, Snapshot, Resume. Their sum is how long the guest
// was paused, as near as the host can tell: the vCPUs leave KVM_RUN
// during Pause and enter it again during Resume.
type pausedTimes struct{ pause, write, resume time.Duration }

func (p pausedTimes) window() time.Duration { return p.pause + p.write + p.resume }

// snapshotPaused pauses m, snapshots it into dir (replacing one there) and
// resumes it, timing each step.
func snapshotPaused(ctx context.Context, m *microvm.Machine, dir string) (pausedTimes, error) {
	var p pausedTimes
	start := time.Now()
	if err := m.Pause(ctx); err != nil {
		return p, fmt.Errorf("pause: %w", err)
	}
	p.pause = time.Since(start)
	start = time.Now()
	err := m.Snapshot(ctx, dir, microvm.SnapshotOptions{Overwrite: true})
	p.write = time.Since(start)
	start = time.Now()
	rerr := m.Resume()
	p.resume = time.Since(start)
	if err != nil {
		return p, fmt.Errorf("snapshot: %w", err)
	}
	if rerr != nil {
		return p, fmt.Errorf("resume: %w", rerr)
	}
	return p, nil
}

// snapshotStop snapshots v's machine into dir with Stop and waits for its
// Run to end; it returns the Snapshot call's time.
func snapshotStop(ctx context.Context, v *vm, dir string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	err := v.m.Snapshot(ctx, dir, microvm.SnapshotOptions{Stop: true})
	took := time.Since(start)
	if err != nil {
		return took, v.describe(fmt.Errorf("snapshot (stop): %w", err))
	}
	return took, v.waitSnapshotStop(timeout)
}

// sockPath is the vsock socket of machine name in dir. sun_path holds 107
// bytes and the device adds "_<port>" for guest-initiated connections, so
// dir should be short (os.MkdirTemp's default is).
func sockPath(dir, name string) string { return filepath.Join(dir, name+".sock") }
