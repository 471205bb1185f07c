package clibase

import (
	"errors"
	"fmt"
	"io"

	"github.com/microvm/microvm"
)

// UsageError marks errors that exit with status 2.
type UsageError struct{ Err error }

func (u UsageError) Error() string { return u.Err.Error() }
func (u UsageError) Unwrap() error { return u.Err }

// Usagef is a UsageError of a formatted message.
func Usagef(format string, args ...any) error { return UsageError{Err: fmt.Errorf(format, args...)} }

// StatusError carries a process exit status chosen by the guest.
type StatusError struct{ Status int }

func (s StatusError) Error() string { return fmt.Sprintf("exit status %d", s.Status) }

// StatusFailure is what exec and the agent commands exit with when microvm
// or the VM failed rather than the command: a kernel, agent or image file
// that is missing or bad, a VM that did not boot or died, an agent that
// did not answer or was lost, a guest that had to be stopped. The command's
// own status passes through unchanged; commands do not normally exit 125
// (docker run uses it for its own errors too), so a CI driver tells a
// failed job from a failed runner by it. Usage errors stay 2. docs/cli.md,
// "Exit status".
const StatusFailure = 125

// Failure marks an error of microvm or the VM, not of the guest command:
// Main exits StatusFailure.
type Failure struct{ Err error }

func (f Failure) Error() string { return f.Err.Error() }
func (f Failure) Unwrap() error { return f.Err }

// ExitStatus is the process exit status for what a command returned, and
// writes its one line to stderr (when not nil) for an error.
func ExitStatus(err error, stderr io.Writer) int {
	say := func() {
		if stderr != nil {
			fmt.Fprintf(stderr, "microvm: %v\n", err)
		}
	}
	var se StatusError
	var ue UsageError
	var fl Failure
	switch {
	case err == nil:
		return 0
	case errors.As(err, &se):
		return se.Status
	case errors.As(err, &ue), errors.Is(err, microvm.ErrConfig):
		say()
		return microvm.StatusUsage
	case errors.As(err, &fl):
		say()
		return StatusFailure
	default:
		say()
		return microvm.StatusError
	}
}
