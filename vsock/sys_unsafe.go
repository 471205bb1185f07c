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
