package loader

import (
	"errors"
	"fmt"
)

// Sentinel errors, for errors.Is. Every error Load returns wraps one of them
// (or an I/O error from the image's reader) and reads as one line naming the
// file and the problem.
var (
	// ErrUnknownFormat: the kernel is neither a bzImage nor an ELF file.
	ErrUnknownFormat = errors.New("unknown kernel format")
	// ErrUnsupported: a recognised format the loader cannot boot (an old
	// boot protocol, no 64-bit entry point, ELF32 without a PVH note...).
	ErrUnsupported = errors.New("unsupported kernel")
	// ErrMalformed: a header field is out of range, truncated or inconsistent.
	ErrMalformed = errors.New("malformed image")
	// ErrTooBig: the kernel, initrd, command line or memory map does not fit
	// where it must go.
	ErrTooBig = errors.New("does not fit")
	// ErrTooManyCPUs: more vCPUs than the MP table in the EBDA can describe.
	ErrTooManyCPUs = errors.New("too many vCPUs")
	// ErrConfig: the Config itself is unusable (no kernel, zero CPUs...).
	ErrConfig = errors.New("bad loader configuration")
)

// loadError is an error with its own one-line message that still unwraps to
// its sentinel and, when there is one, its cause.
type loadError struct {
	msg  string
	errs []error
}

func (e *loadError) Error() string   { return e.msg }
func (e *loadError) Unwrap() []error { return e.errs }

// bad builds an error of the given kind whose message is the formatted text
// only (the sentinel's text is not appended).
func bad(kind error, format string, args ...any) error {
	return &loadError{msg: fmt.Sprintf(format, args...), errs: []error{kind}}
}

// inFile prefixes err's message with the file it concerns ("kernel foo: "),
// keeping everything it wraps.
func inFile(role, name string, err error) error {
	if err == nil {
		return nil
	}
	return &loadError{msg: fmt.Sprintf("%s %s: %v", role, name, err), errs: []error{err}}
}

// size formats a byte count for messages: "16 MiB", "1.50 MiB", "300 KiB".
func size(n uint64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%d.%02d MiB", n>>20, (n&(1<<20-1))*100>>20) // truncated, never rounded up
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}
