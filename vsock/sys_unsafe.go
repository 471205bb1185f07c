package vsock

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxIov bounds one readv/writev (IOV_MAX is 1024 on Linux).
const maxIov = 1024

func (io *iovecs) fill(bufs [][]byte) {
	io.v = io.v[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if len(io.v) == maxIov {
			break
		}
		io.v = append(io.v, unix.Iovec{Base: unsafe.SliceData(b), Len: uint64(len(b))})
	}
}

// writev writes bufs to fd straight from their memory (guest memory views
// included), without the allocation unix.Writev makes. A full non-blocking
// socket returns 0, nil.
func (io *iovecs) writev(fd int, bufs [][]byte) (int, error) {
	io.fill(bufs)
	if len(io.v) == 0 {
		return 0, nil
	}
	for {
		n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&io.v[0])), uintptr(len(io.v)))
		clear(io.v) // drop the pointers into guest memory
		if errno == unix.EINTR {
			io.fill(bufs)
			continue
		}
		if errno != 0 {
			if errno == unix.EAGAIN {
				return 0, nil
			}
			return 0, errno
		}
		return int(n), nil
	}
}

// readv reads from fd straight into bufs. It returns the unix errors as
// they are (EAGAIN included) and 0, nil at end of stream.
func (io *iovecs) readv(fd int, bufs [][]byte) (int, error) {
	io.fill(bufs)
	if len(io.v) == 0 {
		return 0, unix.EINVAL
	}
	for {
		n, _, errno := unix.Syscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&io.v[0])), uintptr(len(io.v)))
		clear(io.v)
		if errno == unix.EINTR {
			io.fill(bufs)
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
}

// sendmsg sends bufs as one message: on a SOCK_SEQPACKET socket, one record,
// which the kernel takes whole or not at all. flags are added to
// MSG_DONTWAIT|MSG_NOSIGNAL. A full socket returns false, nil.
func (io *iovecs) sendmsg(fd int, bufs [][]byte, flags int) (bool, error) {
	io.fill(bufs)
	var msg unix.Msghdr
	for {
		if len(io.v) > 0 {
			msg.Iov = &io.v[0]
			msg.SetIovlen(len(io.v))
		}
		_, _, errno := unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), uintptr(flags|unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL))
		clear(io.v)
		switch errno {
		case 0:
			return true, nil
		case unix.EINTR:
			io.fill(bufs)
			continue
		case unix.EAGAIN:
			return false, nil
		}
		return false, errno
	}
}

// recvmsg receives one message into bufs (none: only its length, with
// MSG_PEEK|MSG_TRUNC) and returns the length the kernel reports and the
// message flags. MSG_DONTWAIT is added to flags; unix errors are returned
// as they are (EAGAIN included).
func (io *iovecs) recvmsg(fd int, bufs [][]byte, flags int) (int, int, error) {
	io.fill(bufs)
	var msg unix.Msghdr
	for {
		if len(io.v) > 0 {
			msg.Iov = &io.v[0]
			msg.SetIovlen(len(io.v))
		}
		n, _, errno := unix.Syscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), uintptr(flags|unix.MSG_DONTWAIT))
		clear(io.v)
		if errno == unix.EINTR {
			io.fill(bufs)
			continue
		}
		if errno != 0 {
			return 0, 0, errno
		}
		return int(n), int(msg.Flags), nil
	}
}
