package seccomp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// setFilter installs prog with seccomp(SECCOMP_SET_MODE_FILTER, flags). With
// SECCOMP_FILTER_FLAG_TSYNC the result is the id of a thread that could not
// be synchronised, 0 when all were.
func setFilter(flags uintptr, prog []unix.SockFilter) (int, error) {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// actionAvail asks whether the kernel knows a filter return action
// (SECCOMP_GET_ACTION_AVAIL): nil if it does, EOPNOTSUPP if not, ENOSYS or
// EINVAL where seccomp filters are missing.
func actionAvail(action uint32) error {
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
	if errno != 0 {
		return errno
	}
	return nil
}

// setSigaction installs act for sig with rt_sigaction(2), directly: not
// through os/signal, which would install the Go runtime's handler.
func setSigaction(sig unix.Signal, act *kernelSigaction) error {
	_, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(act)), 0, sigsetSize, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
