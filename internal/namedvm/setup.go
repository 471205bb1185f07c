package namedvm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
)

// setupRun is the run of a VM's Launch.Setup: done is closed once it has
// ended (at once when there is none), and end is how, read only after.
type setupRun struct {
	done chan struct{}
	end  setupEnd
}

// setupEnd is how a Launch.Setup ended.
type setupEnd struct {
	err error
	// failed: the setup (or the wait for the agent before it) failed
	// while the VM was not being stopped, and the VM was stopped for it;
	// inSetup: Setup itself failed, not the wait.
	failed, inSetup bool
}

// run records what f returns as the setup's end and closes done; a
// failed setup then stops the VM with cancel, so that the end is known
// before the VM ends.
func (s *setupRun) run(f func() setupEnd, cancel context.CancelCauseFunc) {
	s.end = f()
	close(s.done)
	if s.end.failed {
		cancel(s.end.err)
	}
}

// failure is the VM's exit status, and the error Run returns, for a setup
// that failed (0, nil when it did not, or has not ended): a SetupError
// when Setup failed, with the status of the step that failed (stepStatus:
// setupStatus for a plain error), a FailedError with failureStatus when
// the agent did not answer.
func (s *setupRun) failure(name string, setupStatus, failureStatus int) (int, error) {
	select {
	case <-s.done:
	default:
		return 0, nil
	}
	switch {
	case !s.end.failed:
		return 0, nil
	case s.end.inSetup:
		status := stepStatus(s.end.err, setupStatus)
		return status, SetupError{Status: status, Err: fmt.Errorf("VM %s: %w", name, s.end.err)}
	}
	return failureStatus, FailedError{fmt.Errorf("VM %s: %w (microvm logs %s)", name, s.end.err, name)}
}

// stepStatus is the VM's status for err, the error of a Launch.Setup that
// failed: the Status of the SetupError that the step which failed made of
// its error (WithCaches' mounts), else setupStatus (Launch.SetupStatus:
// Docker's, for run --docker's start).
func stepStatus(err error, setupStatus int) int {
	var se SetupError
	if errors.As(err, &se) && se.Status > 0 {
		return se.Status
	}
	return setupStatus
}

// withStep is a Launch.Setup that runs step, then next (when set): a
// failed step ends the VM with status, whatever next's status would be
// (a SetupError), and next's errors stay as they are.
func withStep(step func(context.Context, *agentapi.Client) error, status int,
	next func(context.Context, *agentapi.Client) error) func(context.Context, *agentapi.Client) error {
	return func(ctx context.Context, c *agentapi.Client) error {
		if err := step(ctx, c); err != nil {
			return SetupError{Status: status, Err: err}
		}
		if next != nil {
			return next(ctx, c)
		}
		return nil
	}
}

// runSetup waits until the agent answers and runs setup with a client of
// it. A failure stops the VM, unless it is ending anyway.
func (b *backend) runSetup(ctx context.Context, setup func(context.Context, *agentapi.Client) error,
	timeout time.Duration, vmDone <-chan struct{}) setupEnd {
	fail := func(err error, inSetup bool) setupEnd {
		if ctx.Err() != nil || b.stopRequested() {
			return setupEnd{err: err} // the VM is ending anyway: not the cause
		}
		return setupEnd{err: err, failed: true, inSetup: inSetup}
	}
	cc, err := agentvm.Wait(ctx, b.m, timeout, vmDone)
	if err != nil {
		return fail(err, false)
	}
	defer cc.Close()
	if err := setup(ctx, agentapi.NewClient(cc)); err != nil {
		return fail(err, true)
	}
	return setupEnd{}
}
