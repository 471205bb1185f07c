package agentvm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// UnresponsiveError: the guest did not report the command's end within
// its timeout plus Grace (After, the two together).
type UnresponsiveError struct{ After, Grace time.Duration }

func (e UnresponsiveError) Error() string {
	return fmt.Sprintf("the guest did not report the command's end within --timeout plus %v (%v)", e.Grace, e.After)
}

// vmEndGrace is how long a failed call waits to see whether the VM is
// ending, to report that rather than the broken connection.
const vmEndGrace = 2 * time.Second

// Supervise calls call, an agent call running a command in the VM, with a
// context derived from ctx that also ends when the VM does (vmDone
// closes) and, when timeout > 0, once timeout plus grace passes. A VM
// that ends while the command runs (a guest crash, a triple fault) takes
// the agent with it, but the host side of its vsock connection stays open
// until closed: the call ends instead of waiting on it for ever. The
// command's timeout is the guest's to enforce; a guest that cannot (its
// kernel hung or panicked without a reboot) gets grace more, and then the
// call ends.
//
// failed says whether call's error is a failure of the call rather than
// the command's own end; the call may fail first (the guest reset its
// connections on the way down) and the VM end a moment later, so
// Supervise then waits up to vmEndGrace for the VM's end, to name it.
//
// It returns call's error and why the call was cut short: nil,
// UnresponsiveError (the caller then stops the VM), or ErrVMEnded (vmDone
// is then closed).
func Supervise(ctx context.Context, vmDone <-chan struct{}, timeout, grace time.Duration,
	call func(context.Context) error, failed func(error) bool) (err, cut error) {
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-vmDone:
			cancel(ErrVMEnded)
		case <-callCtx.Done():
		}
	}()
	if timeout > 0 {
		limit := timeout + grace
		t := time.AfterFunc(limit, func() { cancel(UnresponsiveError{After: limit, Grace: grace}) })
		defer t.Stop()
	}
	err = call(callCtx)
	var ue UnresponsiveError
	if errors.As(context.Cause(callCtx), &ue) {
		return err, ue
	}
	if err != nil && failed(err) && !errors.Is(context.Cause(callCtx), ErrVMEnded) {
		select {
		case <-vmDone:
			cancel(ErrVMEnded)
		case <-time.After(vmEndGrace):
		}
	}
	if errors.Is(context.Cause(callCtx), ErrVMEnded) {
		<-vmDone
		return err, ErrVMEnded
	}
	return err, nil
}
