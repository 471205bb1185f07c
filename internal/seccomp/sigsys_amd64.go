package seccomp

import (
	"fmt"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The SIGSYS handler (sigsys_amd64.s) reports a forbidden call from this
// table: one line per system call number, prepared by prepareReport before
// the filter is installed and only read after (about 90 KiB). Each entry is
// a length byte and the line's text.
const (
	sigsysLineSize  = 192
	sigsysEntries   = len(syscallNames) // numbers 0..sigsysEntries-1 have their own line
	sigsysUnknown   = sigsysEntries     // a number outside the table, an x32 number or another architecture's call
	sigsysNotFilter = sigsysEntries + 1 // a SIGSYS the filter did not send (kill -SYS)
	siCodeSeccomp   = 1                 // SYS_SECCOMP, siginfo.si_code of the filter's SIGSYS
)

// sigsysLines is the handler's table (see above).
var sigsysLines [sigsysEntries + 2][sigsysLineSize]byte

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

// prepareReport writes the handler's table: for each system call number
// the line reporting it, and the two lines for calls it cannot name.
func prepareReport(o Options) error {
	end := "; stopped\n"
	if o.Hint != "" {
		end = "; stopped (" + o.Hint + ")\n"
	}
	head := "seccomp: "
	if o.Prefix != "" {
		head = o.Prefix + ": seccomp: "
	}
	start := head + "forbidden system call "
	set := func(i int, s string) error {
		if len(s) >= sigsysLineSize {
			return fmt.Errorf("seccomp: report line %q longer than %d bytes (shorten Options.Prefix or Hint)", s, sigsysLineSize-1)
		}
		sigsysLines[i][0] = byte(len(s))
		copy(sigsysLines[i][1:], s)
		return nil
	}
	for nr := range sigsysEntries {
		if err := set(nr, start+Name(nr)+" ("+strconv.Itoa(nr)+")"+end); err != nil {
			return err
		}
	}
	if err := set(sigsysUnknown, start+"outside the x86-64 table (an x32 or another architecture's call)"+end); err != nil {
		return err
	}
	return set(sigsysNotFilter, head+"SIGSYS sent by another process"+end)
}
