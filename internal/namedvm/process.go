package namedvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/vmctl"
	"github.com/microvm/microvm/internal/vms"
)

// Launch is what a named VM's process starts: its record, and how its
// machine is made once the process holds the name.
type Launch struct {
	Record vms.Record
	// Build makes the machine, given what the VM's process owns: the
	// vsock socket in the state directory, the console, its input and
	// the log (host's other fields zero).
	Build func(host microvm.Config) (*microvm.Machine, error)
	// Main, for an image VM, is its main process.
	Main *Process
	// Setup, when set, runs once the agent answers, before the main
	// process runs and before a detached VM reports ready (run --docker
	// starts Docker with it). Its error stops the VM, which then ends
	// with the status of the step that failed: Run returns a SetupError.
	// A step gives its own status by returning a SetupError (WithCaches'
	// mounts: the generic failure status); any other error is
	// SetupStatus's.
	Setup func(ctx context.Context, c *agentapi.Client) error
	// SetupStatus is the exit status of a VM whose Setup failed with an
	// error that carries no status of its own (run --docker's 122 for
	// Docker's start).
	SetupStatus int
	// AfterMain, when set, runs through the agent once the main process
	// has ended with status 0 and before the VM is shut down (run --cache
	// unmounts its caches with it, so that they are whole once the VM is
	// gone). Its error is logged; the VM's status stays the main
	// process's.
	AfterMain func(ctx context.Context, c *agentapi.Client) error
}

// Process is an image VM's main process (its Entrypoint and Cmd, or the
// command line's arguments), run through the agent once it answers: the
// VM ends when it does, with its status.
type Process struct {
	Argv     []string
	Env      []string
	Workdir  string
	UID, GID *uint32
}

// Options are the choices of a named VM's process.
type Options struct {
	// Ready, for a detached VM's process (TakeReady), is where it tells
	// the StartDetached that started it how the start went: "ready\n"
	// once the VM runs (and its agent answers and Launch.Setup ran, when
	// it has them), "error STATUS: MESSAGE\n" when Setup failed (a
	// SetupError), or "error: MESSAGE\n" (ReadyError). Run closes it.
	// nil: the VM runs in the foreground, its console on Stdout and its
	// input (or its main process's) from Stdin.
	Ready  *os.File
	Stdin  io.Reader
	Stdout io.Writer
	Log    logrus.FieldLogger
	// BootTimeout bounds the wait for the agent.
	BootTimeout time.Duration
	// Interruptible, when set, derives the context the VM runs under
	// once its machine is built (the CLI's: SIGINT and SIGTERM cancel it
	// with a cause that has a Signal method, which sets the VM's status
	// to 128+N), and returns what stops it.
	Interruptible func(context.Context) (context.Context, func())
	// Inspect, when set, is called with that context and the machine
	// before the control API serves (the CLI's SIGUSR1 report).
	Inspect func(context.Context, *microvm.Machine)
	// Confine, when set, is called with the machine's configuration once
	// the control API serves and before the VM runs (the seccomp filter).
	Confine func(microvm.Config) error
	// FailureStatus is the exit status recorded when the VM's main
	// process could not be run.
	FailureStatus int
}

// ExitError is Run's error for a VM that ended with a status other than 0.
type ExitError struct{ Status int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Status) }

// FailedError is Run's error for a VM that microvm could not start or
// whose main process could not be run (rather than one that ended badly).
type FailedError struct{ Err error }

func (e FailedError) Error() string { return e.Err.Error() }
func (e FailedError) Unwrap() error { return e.Err }

// SetupError is Run's error for a VM whose Launch.Setup failed: the VM
// was stopped, and ends with Status (the failed step's, else
// Launch.SetupStatus). A step of Launch.Setup returns one to give its
// failure a status of its own.
type SetupError struct {
	Status int
	Err    error
}

func (e SetupError) Error() string { return e.Err.Error() }
func (e SetupError) Unwrap() error { return e.Err }

// Run is the process of a named VM: it takes the name, builds the
// machine, serves the control API and runs the VM until it ends, and
// records how it ended.
func Run(l Launch, o Options) (err error) {
	name, withAgent := l.Record.Name, l.Record.Agent
	ready, detached := o.Ready, o.Ready != nil
	if detached {
		defer func() {
			if err != nil && ready != nil {
				fmt.Fprintln(ready, ReadyError(err))
			}
			if ready != nil {
				ready.Close()
			}
		}()
	}
	log := o.Log
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	lease, err := store.Create(l.Record)
	if err != nil {
		return FailedError{err}
	}
	defer lease.Release()
	if detached {
		// The detached process's own diagnostics (logrus, a seccomp
		// report) go to microvm.log in its directory.
		if f, err := os.OpenFile(lease.Path(vms.LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
			_ = unix.Dup3(int(f.Fd()), 2, 0)
			f.Close()
		}
	}
	exitStatus, exitReason := microvm.StatusError, "microvm failed to start it"
	defer func() {
		_ = lease.Update(func(r *vms.Record) {
			r.State, r.Ended, r.ExitStatus, r.ExitReason = vms.StateExited, time.Now().UTC(), exitStatus, exitReason
		})
	}()
	clog, err := vms.OpenConsoleLog(lease.Dir(), vms.ConsoleMax)
	if err != nil {
		return err
	}
	defer clog.Close()
	host := microvm.Config{Log: log, Console: clog, Vsock: &microvm.VsockConfig{UDSPath: lease.Path(vms.VsockSocket)}}
	if !detached {
		host.Console = io.MultiWriter(o.Stdout, clog)
		if l.Main == nil { // else stdin is the main process's
			host.ConsoleInput = o.Stdin
		}
	}
	m, err := l.Build(host)
	if err != nil {
		return err
	}
	defer m.Close()
	cfg := m.Config()

	sigCtx := context.Background()
	if o.Interruptible != nil {
		var stopSignals func()
		sigCtx, stopSignals = o.Interruptible(sigCtx)
		defer stopSignals()
	}
	if o.Inspect != nil {
		o.Inspect(sigCtx, m)
	}
	runCtx, cancelRun := context.WithCancelCause(sigCtx)
	defer cancelRun(nil)
	be := &backend{m: m, lease: lease, cancel: cancelRun, started: time.Now(), log: log}
	srv, err := vmctl.Serve(lease.Path(vms.APISocket), be, log)
	if err != nil {
		return err
	}
	defer srv.Close()
	if o.Confine != nil {
		if err := o.Confine(cfg); err != nil {
			return err
		}
	}

	vmDone := make(chan struct{})
	var res microvm.Result
	var runErr error
	go func() {
		defer close(vmDone)
		res, runErr = m.Run(runCtx)
	}()
	_ = lease.Update(func(r *vms.Record) { r.State = vms.StateRunning })
	setup := &setupRun{done: make(chan struct{})}
	if l.Setup != nil {
		go setup.run(func() setupEnd { return be.runSetup(runCtx, l.Setup, o.BootTimeout, vmDone) }, cancelRun)
	} else {
		close(setup.done)
	}
	var mainDone chan mainEnd
	if l.Main != nil {
		mainDone = make(chan mainEnd, 1)
		var in io.Reader
		if !detached {
			in = o.Stdin
		}
		go func() {
			// The main process runs once the setup has.
			select {
			case <-setup.done:
			case <-vmDone:
				return
			}
			if setup.end.err != nil {
				return
			}
			mainDone <- be.runMain(runCtx, *l.Main, l.AfterMain, o.BootTimeout, vmDone, in, host.Console)
		}()
	}
	if ready == nil && withAgent && len(m.MACChanges()) > 0 {
		// In the foreground nothing waits for the agent: the clone's
		// MACs are set once it answers, meanwhile.
		go func() {
			if err := be.waitAgent(runCtx, o.BootTimeout, vmDone); err != nil {
				log.WithError(err).Warn("the restored guest keeps the snapshot's MAC addresses")
			}
		}()
	}
	if ready != nil {
		if withAgent {
			if err := be.waitAgent(runCtx, o.BootTimeout, vmDone); err != nil {
				cancelRun(err)
				<-vmDone
				return FailedError{fmt.Errorf("VM %s: %w (microvm logs %s)", name, err, name)}
			}
		}
		select {
		case <-setup.done:
		case <-vmDone:
		}
		if status, err := setup.failure(name, l.SetupStatus, o.FailureStatus); err != nil {
			<-vmDone
			exitStatus, exitReason = status, "its setup failed: "+err.Error()
			return err
		}
		fmt.Fprintln(ready, "ready")
		ready.Close()
		ready = nil
	}
	<-vmDone
	exitStatus, exitReason = end(res, runErr, be.stopRequested(), sigCtx)
	if status, err := setup.failure(name, l.SetupStatus, o.FailureStatus); err != nil && runErr == nil {
		exitStatus, exitReason = status, "its setup failed: "+err.Error()
		return err
	}
	select {
	case me := <-mainDone:
		switch {
		case runErr != nil:
		case me.failed:
			exitStatus, exitReason = o.FailureStatus, fmt.Sprintf("its main process %s could not run: %v", l.Main.Argv[0], me.err)
			return FailedError{fmt.Errorf("VM %s: main process %s: %w", name, l.Main.Argv[0], me.err)}
		case me.err == nil:
			exitStatus, exitReason = me.status, fmt.Sprintf("its main process %s ended with status %d", l.Main.Argv[0], me.status)
		}
	default:
	}
	if runErr != nil {
		return runErr
	}
	if exitStatus != 0 {
		return ExitError{exitStatus}
	}
	return nil
}

// end is a named VM's exit status and what ended it, for its record and
// the process's status.
func end(res microvm.Result, err error, stopped bool, sigCtx context.Context) (int, string) {
	var sig interface{ Signal() syscall.Signal }
	switch {
	case err != nil:
		return microvm.StatusError, err.Error()
	case stopped && res.Kind == microvm.ExitCanceled:
		return 0, "stopped through the control API"
	case errors.As(context.Cause(sigCtx), &sig):
		return 128 + int(sig.Signal()), "stopped by " + sig.Signal().String()
	}
	return res.Status, agentvm.End(res, nil)
}
