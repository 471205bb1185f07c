package kvm

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl issues a request whose argument is a plain integer. It is a blocking
// system call from the Go scheduler's point of view (KVM_RUN can take long).
func ioctl(fd uintptr, req uintptr, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// ioctlPtr issues a request whose argument points at a kernel-layout struct.
func ioctlPtr[T any](fd uintptr, req uintptr, arg *T) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(arg)))
	if errno != 0 {
		return r, errno
	}
	return r, nil
}
