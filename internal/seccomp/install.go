package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// ExitStatus is the process's exit status after a forbidden call: 128 +
// SIGSYS, what a shell shows for a process SIGSYS killed.
const ExitStatus = 128 + int(unix.SIGSYS)

// Options adjust Install.
type Options struct {
	// Prefix starts the report line ("microvm").
	Prefix string
	// Hint ends the report line, in parentheses: how to run without the
	// filter, say.
	Hint string
}

// ErrUnsupported: this kernel (or architecture) has no seccomp filters.
var ErrUnsupported = errors.New("seccomp filters are not supported here")

// Install confines the whole process, every thread it has and every thread
// it will create, to p for the rest of its life: it sets no_new_privs and
// installs p's filter with SECCOMP_FILTER_FLAG_TSYNC (Go runs goroutines on
// any of its threads, so one thread's filter would protect nothing).
//
// A forbidden call does not run: the kernel sends the calling thread a
// SIGSYS (SECCOMP_RET_TRAP), whose handler writes one line to standard
// error and ends the process with ExitStatus:
//
//	microvm: seccomp: forbidden system call openat (257); stopped (HINT)
//
// Call Install once setup is done: from then on opening files, creating
// sockets other than Unix ones, binding, forking and the like end the
// process. Before installing, Install makes the standard library load what
// it would otherwise load lazily from a file (the local time zone, read the
// first time a log line is timestamped). It must not be called twice.
func Install(p Policy, o Options) error {
	if auditArch == 0 {
		return fmt.Errorf("%w: no allow-list for %s", ErrUnsupported, runtime.GOARCH)
	}
	if err := actionAvail(retTrap); err != nil {
		// ENOSYS: no seccomp(2) (CONFIG_SECCOMP off, or Linux < 3.17);
		// EINVAL: seccomp without filters.
		return fmt.Errorf("%w: seccomp(SECCOMP_GET_ACTION_AVAIL): %w", ErrUnsupported, err)
	}
	prog, err := compile(p, auditArch, retTrap)
	if err != nil {
		return err
	}
	_ = time.Local.String() // loads /etc/localtime (or $TZ) now, not at the first log line
	// The handler first: a filter without it would let the Go runtime
	// turn the first SIGSYS into its own crash report.
	if err := installHandler(o); err != nil {
		return err
	}
	runtime.LockOSThread() // no_new_privs and the filter are set on this thread, then synchronised
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	tid, err := setFilter(unix.SECCOMP_FILTER_FLAG_TSYNC, prog)
	if err != nil {
		return fmt.Errorf("seccomp: installing the filter: %w", err)
	}
	if tid != 0 {
		return fmt.Errorf("seccomp: installing the filter: thread %d has another filter and cannot be synchronised", tid)
	}
	return nil
}
