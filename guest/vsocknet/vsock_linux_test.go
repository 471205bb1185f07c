package vsocknet

import (
	"bytes"
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

// connPair returns two connected Conns over a Unix socketpair: the
// wrapper's poller integration, deadlines, half-close and error mapping are
// the same for any stream socket, so they are tested here without vsock.
func connPair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	return connPairType(t, unix.SOCK_STREAM)
}

func connPairType(t *testing.T, typ int) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
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
	ln, err := Listen(unix.VMADDR_PORT_ANY)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	vl := ln
	if a := ln.Addr().(*Addr); a.Port == unix.VMADDR_PORT_ANY || !strings.HasPrefix(a.String(), "vsock(any:") {
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

// ReadMsg and WriteMsg keep message boundaries, report truncation, wait on
// the poller (a blocked ReadMsg is woken by a later WriteMsg) and end with
// io.EOF; shown on a Unix SOCK_SEQPACKET pair (which drops MSG_EOR).
func TestConnMessages(t *testing.T) {
	a, b := connPairType(t, unix.SOCK_SEQPACKET)
	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 100)
		n, _, trunc, err := b.ReadMsg(buf)
		if err != nil || trunc {
			t.Errorf("ReadMsg: %d bytes, trunc %v, %v", n, trunc, err)
		}
		got <- buf[:n]
	}()
	time.Sleep(10 * time.Millisecond)
	for _, m := range []string{"first", "second message", strings.Repeat("x", 200)} {
		if n, err := a.WriteMsg([]byte(m), true); err != nil || n != len(m) {
			t.Fatalf("WriteMsg(%q) = %d, %v", m, n, err)
		}
	}
	if g := <-got; string(g) != "first" {
		t.Fatalf("first message %q", g)
	}
	buf := make([]byte, 100)
	if n, _, trunc, err := b.ReadMsg(buf); err != nil || trunc || string(buf[:n]) != "second message" {
		t.Fatalf("second message %q, trunc %v, %v", buf[:n], trunc, err)
	}
	if n, _, trunc, err := b.ReadMsg(buf); err != nil || !trunc || n != 100 {
		t.Fatalf("long message: %d bytes, trunc %v, %v; want 100 and truncated", n, trunc, err)
	}
	a.CloseWrite()
	if _, _, _, err := b.ReadMsg(buf); err != io.EOF {
		t.Fatalf("after the peer's shutdown: %v, want io.EOF", err)
	}
}

// TestConnSetLinger checks what SetLinger asks the kernel for (read back
// with getsockopt), and that a closed Conn refuses it.
func TestConnSetLinger(t *testing.T) {
	a, _ := connPair(t)
	for _, tc := range []struct {
		sec        int
		on, linger int32
	}{{10, 1, 10}, {0, 1, 0}, {-1, 0, 0}} {
		if err := a.SetLinger(tc.sec); err != nil {
			t.Fatalf("SetLinger(%d): %v", tc.sec, err)
		}
		var got *unix.Linger
		var gerr error
		if err := a.rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER) }); err != nil || gerr != nil {
			t.Fatalf("getsockopt: %v, %v", err, gerr)
		}
		if got.Onoff != tc.on || tc.on != 0 && got.Linger != tc.linger {
			t.Errorf("SetLinger(%d): SO_LINGER = %+v, want onoff=%d linger=%d", tc.sec, *got, tc.on, tc.linger)
		}
	}
	a.Close()
	if err := a.SetLinger(1); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetLinger on a closed Conn: %v, want net.ErrClosed", err)
	}
}
