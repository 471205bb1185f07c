package main

import (
	"context"
	"net"

	"github.com/microvm/microvm/guest/vsocknet"
)

// vsockNetwork reaches the host over AF_VSOCK sockets (virtio-vsock in a
// guest) through package vsocknet, which parks blocked calls on the Go
// runtime's poller so that deadlines and Close from another goroutine work.
type vsockNetwork struct{}

// LocalCID asks /dev/vsock for the CID of the guest-to-host transport.
func (vsockNetwork) LocalCID() (uint32, error) { return vsocknet.LocalCID() }

// Listen listens on port of any local CID.
func (vsockNetwork) Listen(port uint32) (net.Listener, error) {
	ln, err := vsocknet.Listen(port)
	if err != nil {
		return nil, err // not a nil *Listener in a non-nil interface
	}
	return ln, nil
}

// Dial connects to (cid, port); see vsocknet.Dial.
func (vsockNetwork) Dial(ctx context.Context, cid, port uint32) (Conn, error) {
	c, err := vsocknet.Dial(ctx, cid, port)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ListenSeqpacket listens on port of any local CID with SOCK_SEQPACKET.
func (vsockNetwork) ListenSeqpacket(port uint32) (net.Listener, error) {
	ln, err := vsocknet.ListenSeqpacket(port)
	if err != nil {
		return nil, err
	}
	return ln, nil
}

// DialSeqpacket connects to (cid, port) with SOCK_SEQPACKET.
func (vsockNetwork) DialSeqpacket(ctx context.Context, cid, port uint32) (MsgConn, error) {
	c, err := vsocknet.DialSeqpacket(ctx, cid, port)
	if err != nil {
		return nil, err
	}
	return c, nil
}
