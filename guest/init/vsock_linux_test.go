package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// connPair returns two connected vsockConns over a Unix socketpair: the
// wrapper's poller integration, deadlines, half-close and error mapping are
// the same for any stream socket, so they are tested here without vsock.
func connPair(t *testing.T) (*vsockConn, *vsockConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, err := wrapConn(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := wrapConn(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestConnHalfClose(t *testing.T) {
	a, b := connPair(t)
	data := bytes.Repeat([]byte("0123456789"), 100000) // more than a socket buffer
	go func() {
		a.Write(data)
		a.CloseWrite()
	}()
	got, err := io.ReadAll(b)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want %d", len(got), err, len(data))
	}
	// a shut down its sending side only: b can still reply, a still reads.
	if _, err := b.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	b.CloseWrite()
	got, err = io.ReadAll(a)
	if err != nil || string(got) != "reply" {
		t.Fatalf("reply after CloseWrite: %q, %v", got, err)
	}
	// EOF is returned bare, as io.ReadAll and io.Copy expect.
	if n, err := b.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("Read after EOF = %d, %v; want 0, io.EOF", n, err)
	}
}

func TestConnDeadline(t *testing.T) {
	a, _ := connPair(t)
	a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	_, err := a.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past deadline = %v, want a timeout net.Error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("deadline fired after %v", d)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" || oe.Net != "vsock" {
		t.Errorf("error %#v is not a vsock read *net.OpError", err)
	}
}

func TestConnCloseUnblocksRead(t *testing.T) {
	a, _ := connPair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 1))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read on closed conn = %v, want net.ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not wake a blocked Read")
	}
	if err := a.CloseWrite(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("CloseWrite on closed conn = %v, want net.ErrClosed", err)
	}
}

func TestConnPeerResetIsErrno(t *testing.T) {
	a, b := connPair(t)
	b.Write([]byte("unread")) // closing a with unread data resets the peer
	a.Close()
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = b.Write(make([]byte, 4096))
	}
	if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("Write to a closed peer = %v, want EPIPE or ECONNRESET reachable with errors.Is", err)
	}
}

// needVsock skips unless AF_VSOCK sockets can be created here.
func needVsock(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Skipf("no AF_VSOCK sockets on this machine: %v", err)
	}
	unix.Close(fd)
}

func TestVsockListenerDeadlineAndClose(t *testing.T) {
	needVsock(t)
	ln, err := vsockNetwork{}.Listen(unix.VMADDR_PORT_ANY)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	vl := ln.(*vsockListener)
	if a := ln.Addr().(*VsockAddr); a.Port == unix.VMADDR_PORT_ANY || !strings.HasPrefix(a.String(), "vsock(any:") {
		t.Errorf("listener address %v: want a bound port on any CID", a)
	}
	vl.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := ln.Accept(); !os.IsTimeout(err) {
		t.Errorf("Accept past deadline = %v, want a timeout", err)
	}
	vl.SetDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ln.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept on closed listener = %v, want net.ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not wake a blocked Accept")
	}
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
