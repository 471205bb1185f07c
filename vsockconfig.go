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
	// ConnBuffer is the per-connection buffer in bytes (default 64 KiB).
	ConnBuffer int
	// ConnectTimeout bounds the CONNECT handshake (default 2 s).
	ConnectTimeout time.Duration
	// Options selects data-path optimisations (nil: vsock.DefaultOptions).
	Options *vsock.Options
}

func (v *VsockConfig) validate() error {
	if v.CID < 3 || v.CID > 0xffffffff-1 {
		return fmt.Errorf("%w: vsock CID %d: must be at least 3 (0-2 are reserved) and below 2^32-1", ErrConfig, v.CID)
	}
	if v.UDSPath == "" {
		return fmt.Errorf("%w: vsock needs a Unix socket path (--vsock-uds)", ErrConfig)
	}
	return nil
}
