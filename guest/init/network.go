package main

import (
	"context"
	"fmt"
	"net"

	"github.com/microvm/microvm/guest/vsocknet"
)

// hostCID is the vsock context ID of the host (VMADDR_CID_HOST).
const hostCID = vsocknet.CIDHost

// Conn is a stream connection that can be half-closed: CloseWrite sends the
// peer EOF (shutdown(SHUT_WR)) while reading goes on.
type Conn interface {
	net.Conn
	CloseWrite() error
}

// Network is what scenarios use to reach the host. The guest implementation
// is vsockNetwork; tests substitute a fake built on Unix sockets, so the
// scenario logic runs on any host.
type Network interface {
	// LocalCID returns this side's CID, or an error when no vsock transport
	// (no virtio-vsock device) is present.
	LocalCID() (uint32, error)
	// Listen listens on a port of the local CID. Accepted connections
	// implement Conn.
	Listen(port uint32) (net.Listener, error)
	// Dial connects to (cid, port). It gives up when ctx ends.
	Dial(ctx context.Context, cid, port uint32) (Conn, error)
	// ListenSeqpacket is Listen for SOCK_SEQPACKET: accepted connections
	// implement MsgConn.
	ListenSeqpacket(port uint32) (net.Listener, error)
	// DialSeqpacket is Dial for SOCK_SEQPACKET.
	DialSeqpacket(ctx context.Context, cid, port uint32) (MsgConn, error)
}

// MsgConn is a SEQPACKET connection: each WriteMsg sends one message, each
// ReadMsg returns one, with its MSG_EOR and MSG_TRUNC flags.
type MsgConn interface {
	Conn
	ReadMsg(b []byte) (n int, eor, trunc bool, err error)
	WriteMsg(b []byte, eor bool) (int, error)
}

// asMsgConn checks that an accepted connection keeps message boundaries.
func asMsgConn(c net.Conn) (MsgConn, error) {
	mc, ok := c.(MsgConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("accepted %T has no message operations", c)
	}
	return mc, nil
}

// asConn checks that an accepted connection can be half-closed.
func asConn(c net.Conn) (Conn, error) {
	hc, ok := c.(Conn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("accepted %T cannot be half-closed", c)
	}
	return hc, nil
}

// VsockAddr is an AF_VSOCK address; it implements net.Addr.
type VsockAddr = vsocknet.Addr
