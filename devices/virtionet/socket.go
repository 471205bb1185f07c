package virtionet

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// socket is a back-end of plain Ethernet frames: an AF_UNIX SOCK_SEQPACKET
// or SOCK_DGRAM socket, one record or datagram per frame, no virtio-net
// header (NewSocket).
type socket struct{ packetFD }

// newSocket checks that fd keeps frame boundaries (SOCK_SEQPACKET or
// SOCK_DGRAM) and makes it non-blocking. On error fd is closed.
func newSocket(fd int) (*socket, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err == nil && typ != unix.SOCK_SEQPACKET && typ != unix.SOCK_DGRAM {
		err = fmt.Errorf("socket type %d, want SOCK_SEQPACKET or SOCK_DGRAM (one frame per record)", typ)
	}
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("virtio-net: frame socket: %w", err)
	}
	return &socket{packetFD{fd}}, nil
}

// VnetHeader is false: frames are plain.
func (s *socket) VnetHeader() bool { return false }

// SetOffload accepts only "none": the device offers no offload here
// (OfferedPlain), so a driver cannot have negotiated one.
func (s *socket) SetOffload(flags uint) error {
	if flags != 0 {
		return fmt.Errorf("virtio-net: offloads %#x on a socket of plain frames", flags)
	}
	return nil
}
