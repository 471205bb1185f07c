package microvm

import (
	"fmt"
	"time"

	"github.com/microvm/microvm/vsock"
)

// VsockConfig adds a virtio-vsock device reached from the host through
// Firecracker-compatible Unix sockets.
type VsockConfig struct {
	// CID is the guest's context id (>= 3).
	CID uint64
	// UDSPath is the host socket: clients connect to it and send
	// "CONNECT <port>\n"; guest connections to port P go to UDSPath_P.
	UDSPath string
	// MaxConnections bounds open connections (default 1023).
	MaxConnections int
	// ConnBuffer is the per-connection buffer in bytes (default 256 KiB, at
	// most MaxVsockConnBuffer).
	ConnBuffer int
	// BufferTotal bounds the guest->host bytes all connections together
	// may make the device buffer (vsock.Config.MaxBuffered; 0: 64 MiB, or
	// MaxConnections x 4 KiB when more). At least vsock.MinMaxBuffered:
	// every connection is sure of a 4 KiB window.
	BufferTotal uint64
	// ConnectTimeout bounds the CONNECT handshake (default 2 s).
	ConnectTimeout time.Duration
	// Options selects data-path optimisations (nil: vsock.DefaultOptions).
	Options *vsock.Options
	// Dgram offers experimental vsock datagrams (vsock.Config.Dgram): host
	// applications send to UDSPath.dgram, guest datagrams to port P go to
	// UDSPath_P.dgram.
	Dgram bool
}

// MaxVsockConnBuffer bounds VsockConfig.ConnBuffer, as the vhost-user
// back-end's --conn-buffer: the buffer is host memory each connection may
// hold, and the credit arithmetic is 32-bit.
const MaxVsockConnBuffer = 1 << 30

func (v *VsockConfig) validate() error {
	if v.CID < 3 || v.CID > 0xffffffff-1 {
		return fmt.Errorf("%w: vsock CID %d: must be at least 3 (0-2 are reserved) and below 2^32-1", ErrConfig, v.CID)
	}
	if v.UDSPath == "" {
		return fmt.Errorf("%w: vsock needs a Unix socket path (--vsock-uds)", ErrConfig)
	}
	if v.ConnBuffer < 0 || v.ConnBuffer > MaxVsockConnBuffer {
		return fmt.Errorf("%w: vsock connection buffer %d: want 1..%d bytes (0: the default)", ErrConfig, v.ConnBuffer, MaxVsockConnBuffer)
	}
	if v.MaxConnections < 0 {
		return fmt.Errorf("%w: vsock connection limit %d: want at least 1 (0: the default)", ErrConfig, v.MaxConnections)
	}
	return nil
}
