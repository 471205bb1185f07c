package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needVsock skips unless AF_VSOCK sockets can be created here.
func needVsock(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Skipf("no AF_VSOCK sockets on this machine: %v", err)
	}
	unix.Close(fd)
}

func TestVsockDialOwnCIDFailsPromptly(t *testing.T) {
	needVsock(t)
	cid, err := vsockNetwork{}.LocalCID()
	if err != nil {
		t.Skipf("no vsock transport: %v", err)
	}
	if cid <= hostCID {
		t.Skipf("local CID %d: not a guest", cid)
	}
	// A connection to our own CID never leaves this machine: with the
	// virtio transport it fails with ENODEV, with vsock_loopback it is reset.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := vsockNetwork{}.Dial(ctx, cid, 0x7ffffff0)
	if err == nil {
		c.Close()
		t.Fatal("connected to an unused port on our own CID")
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" {
		t.Errorf("Dial error %#v is not a dial *net.OpError", err)
	}
	t.Logf("dial own CID %d: %v after %v", cid, err, time.Since(start))
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v", d)
	}
}

// needLoopback skips unless the vsock_loopback transport is present, which
// makes CID 1 (VMADDR_CID_LOCAL) reach this machine's own listeners. Without
// it a dial to CID 1 goes to the guest-to-host transport, so the tests below
// must not run: they would talk to whatever hosts this machine.
func needLoopback(t *testing.T) {
	t.Helper()
	needVsock(t)
	if _, err := os.Stat("/sys/module/vsock_loopback"); err != nil {
		t.Skip("vsock_loopback transport not loaded (modprobe vsock_loopback): AF_VSOCK data path not tested here")
	}
}

func TestVsockLoopbackEcho(t *testing.T) {
	needLoopback(t)
	n := vsockNetwork{}
	ln, err := n.Listen(unix.VMADDR_PORT_ANY)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*VsockAddr).Port
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
		c.(Conn).CloseWrite()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.Dial(ctx, unix.VMADDR_CID_LOCAL, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := exchange(c, 1, 1<<20)
	if err != nil || res.sent.Sum() != res.recv.Sum() {
		t.Fatalf("exchange over loopback: %v (sent %d, got %d)", err, res.sent.Len(), res.recv.Len())
	}
}

func TestVsockLoopbackRefused(t *testing.T) {
	needLoopback(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := vsockNetwork{}.Dial(ctx, unix.VMADDR_CID_LOCAL, 0x7ffffff1)
	if !isRefusal(err) {
		t.Fatalf("dial to an unused loopback port = %v, want ECONNRESET", err)
	}
}
