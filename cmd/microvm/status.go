package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/microvm/microvm"
)

// usageError marks errors that exit with status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// statusError carries a process exit status chosen by the guest.
type statusError struct{ status int }

func (s statusError) Error() string { return fmt.Sprintf("exit status %d", s.status) }

// statusFailure is what exec and the agent commands exit with when microvm
// or the VM failed rather than the command: a kernel, agent or image file
// that is missing or bad, a VM that did not boot or died, an agent that
// did not answer or was lost, a guest that had to be stopped. The command's
// own status passes through unchanged; commands do not normally exit 125
// (docker run uses it for its own errors too), so a CI driver tells a
// failed job from a failed runner by it. Usage errors stay 2. docs/cli.md,
// "Exit status".
const statusFailure = 125

// failure marks an error of microvm or the VM, not of the guest command:
// Main exits statusFailure.
type failure struct{ err error }

func (f failure) Error() string { return f.err.Error() }
func (f failure) Unwrap() error { return f.err }

// exitStatus is the process exit status for what a command returned, and
// writes its one line to stderr (when not nil) for an error.
func exitStatus(err error, stderr io.Writer) int {
	say := func() {
		if stderr != nil {
			fmt.Fprintf(stderr, "microvm: %v\n", err)
		}
	}
	var se statusError
	var ue usageError
	var fl failure
	switch {
	case err == nil:
		return 0
	case errors.As(err, &se):
		return se.status
	case errors.As(err, &ue), errors.Is(err, microvm.ErrConfig):
		say()
		return microvm.StatusUsage
	case errors.As(err, &fl):
		say()
		return statusFailure
	default:
		say()
		return microvm.StatusError
	}
}
