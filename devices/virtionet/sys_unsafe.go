package virtionet

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxIov bounds one writev (IOV_MAX is 1024 on Linux).
const maxIov = 1024

// iovecs is a reusable iovec array, owned by one worker.
type iovecs struct {
	v []unix.Iovec
}

// writev writes bufs (views of guest memory included) to fd in one
// writev(2), without the allocation unix.Writev makes. Errors are the
// unix.Errno as returned, EAGAIN included; EINTR is retried. At most maxIov
// non-empty buffers are written: callers check.
func (io *iovecs) writev(fd int, bufs [][]byte) (int, error) {
	io.v = io.v[:0]
	for _, b := range bufs {
		if len(b) > 0 && len(io.v) < maxIov {
			io.v = append(io.v, unix.Iovec{Base: unsafe.SliceData(b), Len: uint64(len(b))})
		}
	}
	if len(io.v) == 0 {
		return 0, nil
	}
	defer clear(io.v) // drop the pointers into guest memory
	for {
		n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&io.v[0])), uintptr(len(io.v)))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
}
