package agent

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// siginfoPid returns si_pid of a siginfo_t that waitid(2) filled in;
// unix.Siginfo keeps the union that holds it opaque. In struct siginfo
// (include/uapi/asm-generic/siginfo.h) the union follows si_signo, si_errno
// and si_code and is aligned like a long, so it starts at byte 16 on 64-bit
// and 12 on 32-bit targets; si_pid is its first member.
func siginfoPid(si *unix.Siginfo) int {
	off := 3 * unsafe.Sizeof(int32(0))
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 4 * unsafe.Sizeof(int32(0))
	}
	return int(*(*int32)(unsafe.Add(unsafe.Pointer(si), off)))
}
