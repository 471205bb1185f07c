package kvm

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl issues a request whose argument is a plain integer, again when a
// signal interrupted it: the Go runtime preempts threads with signals, and
// slow requests (KVM_CREATE_VM on a nested KVM takes milliseconds) then
// fail with EINTR although nothing happened. KVM_RUN, where EINTR means
// "exit to the VMM", goes through ioctlOnce instead.
func ioctl(fd uintptr, req uintptr, arg uintptr) (uintptr, error) {
	for {
		r, err := ioctlOnce(fd, req, arg)
		if err != unix.EINTR {
			return r, err
		}
	}
}

// ioctlOnce issues a request once. It is a blocking system call from the
// Go scheduler's point of view (KVM_RUN can take long).
func ioctlOnce(fd uintptr, req uintptr, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// ioctlPtr issues a request whose argument points at a kernel-layout
// struct, again after EINTR (see ioctl).
func ioctlPtr[T any](fd uintptr, req uintptr, arg *T) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(arg)))
		if errno != unix.EINTR {
			if errno != 0 {
				return r, errno
			}
			return r, nil
		}
	}
}
