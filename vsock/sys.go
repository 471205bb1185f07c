package vsock

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// closeFD closes a host socket, ignoring EINTR (the descriptor is gone
// either way on Linux).
func closeFD(fd int) {
	if fd >= 0 {
		_ = unix.Close(fd)
	}
}

// iovecs is a reusable iovec array for readv/writev, owned by one worker.
type iovecs struct {
	v []unix.Iovec
	// views is scratch for a caller that builds the buffers it passes
	// (the flush of a connection's queued bytes).
	views [][]byte
}

// isAgain reports a non-blocking socket that has no data or no room.
func isAgain(err error) bool {
	return errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EWOULDBLOCK)
}

// writeSome writes b to a non-blocking fd, returning how much went out; a
// full socket is not an error.
func writeSome(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		w, err := unix.Write(fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if isAgain(err) {
				return n, nil
			}
			return n, err
		}
		n += w
	}
	return n, nil
}

func virtioGuestErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{virtio.ErrGuest}, args...)...)
}
