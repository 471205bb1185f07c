package seccomp

import (
	"fmt"

	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The SIGSYS handler (sigsys_amd64.s) reports a forbidden call with one
// writev(2) of four pieces: the head, the call's name from syscallNames (a
// Go string header is laid out as a struct iovec), its number, which the
// handler formats itself into sigsysNum, and the tail. A SIGSYS it cannot
// name a call for gets one prepared line (sigsysOther). prepareReport
// fills these before the filter is installed; after that only the handler
// touches them: a few hundred bytes, where a prepared line per call took
// 90 KiB of every run's memory.
const (
	sigsysEntries  = len(syscallNames) // numbers 0..sigsysEntries-1 have a name (or sigsysNoName)
	sigsysTextSize = 256               // room for a head, a tail or a whole other line
	sigsysNumSize  = 16                // room for " (" + a 32-bit number + ")"
	siCodeSeccomp  = 1                 // SYS_SECCOMP, siginfo.si_code of the filter's SIGSYS
)

// iovec mirrors struct iovec (include/uapi/linux/uio.h): base and length.
// Size checked in layout_unsafe_test.go, with a Go string header's.
type iovec struct {
	base *byte
	len  uint64
}

// The handler's pieces (see above).
var (
	sigsysIov              [4]iovec // head, name, number, tail
	sigsysHead, sigsysTail [sigsysTextSize]byte
	sigsysOther            [2]iovec // a SIGSYS the filter did not send; a call outside the table
	sigsysOtherText        [2][sigsysTextSize]byte
)

// sigsysNum is where the handler formats the call's number.
//
//lint:ignore U1000 written and read by sigsysHandler (sigsys_amd64.s)
var sigsysNum [sigsysNumSize]byte

// sigsysNoName names a call the table has no name for.
//
//lint:ignore U1000 read by sigsysHandler (sigsys_amd64.s)
var sigsysNoName = "syscall"

// sigsysReporting is set (XCHG) by the first thread in the handler: the
// one that reports. installHandler clears it; after that only the handler
// touches it.
var sigsysReporting uint32

// sigsysHandlerPC returns the address of the handler, an assembly function
// the kernel calls with the C calling convention (sigsys_amd64.s).
func sigsysHandlerPC() uintptr

// installHandler prepares the report lines and makes sigsysHandler the
// process's SIGSYS handler.
func installHandler(o Options) error {
	if err := prepareReport(o); err != nil {
		return err
	}
	atomic.StoreUint32(&sigsysReporting, 0) // nobody is reporting yet
	act := kernelSigaction{
		Handler:  sigsysHandlerPC(),
		Flags:    saSiginfo | saOnstack | saRestorer,
		Restorer: sigsysHandlerPC(), // required on x86-64; never used, the handler does not return
		Mask:     ^uint64(0),        // nothing interrupts the report
	}
	if err := setSigaction(unix.SIGSYS, &act); err != nil {
		return fmt.Errorf("seccomp: rt_sigaction(SIGSYS): %w", err)
	}
	return nil
}

// prepareReport writes the handler's pieces: the head and tail of a
// report, and the two lines for a SIGSYS it cannot name a call for.
func prepareReport(o Options) error {
	end := "; stopped\n"
	if o.Hint != "" {
		end = "; stopped (" + o.Hint + ")\n"
	}
	head := "seccomp: "
	if o.Prefix != "" {
		head = o.Prefix + ": seccomp: "
	}
	set := func(buf *[sigsysTextSize]byte, iov *iovec, s string) error {
		if len(s) > len(buf) {
			return fmt.Errorf("seccomp: report text %q longer than %d bytes (shorten Options.Prefix or Hint)", s, len(buf))
		}
		n := copy(buf[:], s)
		*iov = iovec{base: &buf[0], len: uint64(n)}
		return nil
	}
	for _, p := range []struct {
		buf  *[sigsysTextSize]byte
		iov  *iovec
		text string
	}{
		{&sigsysHead, &sigsysIov[0], head + "forbidden system call "},
		{&sigsysTail, &sigsysIov[3], end},
		{&sigsysOtherText[0], &sigsysOther[0], head + "SIGSYS sent by another process" + end},
		{&sigsysOtherText[1], &sigsysOther[1], head + "forbidden system call outside the x86-64 table (an x32 or another architecture's call)" + end},
	} {
		if err := set(p.buf, p.iov, p.text); err != nil {
			return err
		}
	}
	return nil
}
