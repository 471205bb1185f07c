package microvm

// Unit tests of the in-process vsock API that need no KVM: the routing
// dialer behind ListenVsock (delivery over a socket pair, the full accept
// queue, closing, the fallback for other ports) and the errors of a machine
// without a vsock device.

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/vsock"
)

// fakeDialer records the fallback dials and answers with err, or with one
// end of a fresh socket pair (the other end is kept in peers).
type fakeDialer struct {
	mu    sync.Mutex
	ports []uint32
	peers []*net.UnixConn
	err   error
}

func (f *fakeDialer) Dial(_, port uint32, timeout time.Duration) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ports = append(f.ports, port)
	if f.err != nil {
		return -1, f.err
	}
	fd, peer, err := vsockSocketpair()
	if err != nil {
		return -1, err
	}
	f.peers = append(f.peers, peer)
	return fd, nil
}

func (f *fakeDialer) dialed() []uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint32(nil), f.ports...)
}

// fdConn turns the descriptor the router gave the device into a net.Conn
// (taking ownership of fd).
func fdConn(t *testing.T, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "device-end")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newTestRouter(t *testing.T) (*vsockRouter, *fakeDialer) {
	t.Helper()
	fb := &fakeDialer{}
	r := newVsockRouter(3, fb)
	t.Cleanup(func() {
		r.closeAll()
		for _, p := range fb.peers {
			p.Close()
		}
	})
	return r, fb
}

// TestVsockRouterDelivers: a guest connection to a listened port arrives at
// Accept as a VsockConn with vsock addresses; the device's end is a
// non-blocking socket connected to it; the fallback is not called.
func TestVsockRouterDelivers(t *testing.T) {
	r, fb := newTestRouter(t)
	l, err := r.listen(5000)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Addr().String(), "2:5000"; got != want || l.Addr().Network() != "vsock" {
		t.Errorf("Addr = %s %q, want vsock %q", l.Addr().Network(), got, want)
	}
	fd, err := r.Dial(1234, 5000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Errorf("device end flags %#x (%v): want O_NONBLOCK", fl, err)
	}
	dev := fdConn(t, fd)
	c, err := testenv.AcceptWithin(t, l, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	vc, ok := c.(*VsockConn)
	if !ok {
		t.Fatalf("Accept returned a %T, want *VsockConn", c)
	}
	if got := vc.LocalAddr().String(); got != "2:5000" {
		t.Errorf("LocalAddr = %q, want 2:5000", got)
	}
	if got := vc.RemoteAddr().String(); got != "3:1234" || vc.RemoteAddr().Network() != "vsock" {
		t.Errorf("RemoteAddr = %s %q, want vsock 3:1234", vc.RemoteAddr().Network(), got)
	}
	// Both ways, with half-close.
	if _, err := dev.Write([]byte("from guest")); err != nil {
		t.Fatal(err)
	}
	if err := dev.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = vc.SetDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(vc); err != nil || string(b) != "from guest" {
		t.Errorf("host read %q, %v", b, err)
	}
	if _, err := vc.Write([]byte("from host")); err != nil {
		t.Fatal(err)
	}
	vc.Close()
	_ = dev.SetDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(dev); err != nil || string(b) != "from host" {
		t.Errorf("device read %q, %v", b, err)
	}
	if got := fb.dialed(); len(got) != 0 {
		t.Errorf("fallback dialed %v for a listened port", got)
	}
}

// TestVsockRouterFallback: ports without a listener, and a listener's port
// after its Close, go to the fallback dialer with its error passed through.
func TestVsockRouterFallback(t *testing.T) {
	r, fb := newTestRouter(t)
	l, err := r.listen(5000)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := r.Dial(1024, 6000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = unix.Close(fd)
	l.Close()
	fd, err = r.Dial(1024, 5000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = unix.Close(fd)
	if got := fb.dialed(); len(got) != 2 || got[0] != 6000 || got[1] != 5000 {
		t.Errorf("fallback dialed %v, want [6000 5000]", got)
	}
	fb.err = syscall.ECONNREFUSED
	if _, err := r.Dial(1024, 7000, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial with a failing fallback: %v, want ECONNREFUSED", err)
	}
	noFallback := newVsockRouter(3, nil)
	if _, err := noFallback.Dial(1024, 7000, time.Second); err == nil {
		t.Error("Dial without a listener or fallback succeeded")
	}
}

// TestVsockRouterQueueFull: with the accept queue full, a delivery waits
// for the timeout and fails; the device's end is not handed out. Accepting
// one makes room again.
func TestVsockRouterQueueFull(t *testing.T) {
	r, _ := newTestRouter(t)
	l, err := r.listen(5000)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}()
	for i := 0; i < vsockAcceptBacklog; i++ {
		fd, err := r.Dial(uint32(2000+i), 5000, time.Second)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		fds = append(fds, fd)
	}
	const timeout = 50 * time.Millisecond
	start := time.Now()
	fd, err := r.Dial(9, 5000, timeout)
	d := time.Since(start)
	if err == nil {
		fds = append(fds, fd)
		t.Fatal("delivery to a full queue succeeded")
	}
	if !errors.Is(err, errAcceptQueueFull) {
		t.Errorf("delivery to a full queue: %v, want errAcceptQueueFull", err)
	}
	if d < timeout || d > timeout+2*time.Second {
		t.Errorf("delivery to a full queue failed after %v, want about %v", d, timeout)
	}
	c, err := testenv.AcceptWithin(t, l, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	fd, err = r.Dial(10, 5000, timeout)
	if err != nil {
		t.Fatalf("delivery after an Accept made room: %v", err)
	}
	fds = append(fds, fd)
}

// TestVsockListenerClose: Close wakes a blocked Accept and a delivery
// waiting for room with net.ErrClosed, closes the queued connections (the
// device's ends see end of stream), and frees the port for a new listener;
// a second listener on an open port is refused.
func TestVsockListenerClose(t *testing.T) {
	r, _ := newTestRouter(t)
	l, err := r.listen(5000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.listen(5000); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("second listen on an open port: %v, want EADDRINUSE", err)
	}
	// A blocked Accept on another listener wakes on Close.
	l2, err := r.listen(5001)
	if err != nil {
		t.Fatal(err)
	}
	acceptErr := make(chan error, 1)
	go func() {
		c, err := l2.Accept()
		if c != nil {
			c.Close()
		}
		acceptErr <- err
	}()
	time.Sleep(20 * time.Millisecond)
	l2.Close()
	select {
	case err := <-acceptErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close")
	}

	var devs []net.Conn
	for i := 0; i < vsockAcceptBacklog; i++ {
		fd, err := r.Dial(uint32(2000+i), 5000, time.Second)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		devs = append(devs, fdConn(t, fd))
	}
	waiting := make(chan error, 1)
	go func() {
		fd, err := r.Dial(9, 5000, time.Minute)
		if err == nil {
			_ = unix.Close(fd)
		}
		waiting <- err
	}()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("delivery waiting for room when the listener closed: %v, want net.ErrClosed", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("delivery returned %v after Close", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("delivery still waiting after Close")
	}
	for i, dev := range devs {
		_ = dev.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		if n, err := dev.Read(b[:]); n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("queued connection %d after Close: read %d, %v; want EOF", i, n, err)
			break
		}
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	l3, err := r.listen(5000)
	if err != nil {
		t.Fatalf("listen after Close: %v", err)
	}
	l3.Close()
}

// TestVsockRouterCloseAll: Machine.Close's closeAll closes open listeners
// and refuses new ones.
func TestVsockRouterCloseAll(t *testing.T) {
	r, _ := newTestRouter(t)
	l, err := r.listen(5000)
	if err != nil {
		t.Fatal(err)
	}
	r.closeAll()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after closeAll: %v, want net.ErrClosed", err)
	}
	if _, err := r.listen(5001); !errors.Is(err, net.ErrClosed) {
		t.Errorf("listen after closeAll: %v, want net.ErrClosed", err)
	}
}

// TestVsockRouterConcurrent: deliveries, Accepts and Closes at once (for
// the race detector): every delivered connection is either accepted or
// closed by the listener.
func TestVsockRouterConcurrent(t *testing.T) {
	r, _ := newTestRouter(t)
	for round := 0; round < 20; round++ {
		l, err := r.listen(5000)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Go(func() {
				fd, err := r.Dial(uint32(i), 5000, 10*time.Millisecond)
				if err == nil {
					_ = unix.Close(fd)
				}
			})
		}
		wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		})
		time.Sleep(time.Millisecond)
		l.Close()
		wg.Wait()
		if n := len(l.queue); n != 0 {
			t.Fatalf("round %d: %d connections left queued on a closed listener", round, n)
		}
	}
}

// TestVsockNoDevice: a machine without a vsock device refuses both calls
// with ErrNoVsock.
func TestVsockNoDevice(t *testing.T) {
	m := &Machine{}
	if _, err := m.DialVsock(context.Background(), 1024); !errors.Is(err, ErrNoVsock) {
		t.Errorf("DialVsock: %v, want ErrNoVsock", err)
	}
	if _, err := m.ListenVsock(1024); !errors.Is(err, ErrNoVsock) {
		t.Errorf("ListenVsock: %v, want ErrNoVsock", err)
	}
}

// TestVsockAddr checks the address format.
func TestVsockAddr(t *testing.T) {
	a := &VsockAddr{CID: 2, Port: 4294967295}
	if a.Network() != "vsock" || a.String() != "2:4294967295" {
		t.Errorf("VsockAddr = %s %s", a.Network(), a)
	}
}

// TestVsockRouterSeqpacket: ListenVsock ports take stream connections only,
// so a SEQPACKET one to them is refused like a stream Unix listener refuses
// it (EPROTOTYPE); other ports go to a fallback that can dial SEQPACKET
// (vsock.UDSDialer), and are refused without one.
func TestVsockRouterSeqpacket(t *testing.T) {
	dir := t.TempDir()
	uds := filepath.Join(dir, "v")
	r := newVsockRouter(3, vsock.UDSDialer{Path: uds})
	t.Cleanup(r.closeAll)
	l, err := r.listen(5000)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := r.DialSeqpacket(1024, 5000, time.Second); !errors.Is(err, unix.EPROTOTYPE) {
		t.Errorf("SEQPACKET to a ListenVsock port: %v, want EPROTOTYPE", err)
	}
	ln, err := net.Listen("unixpacket", uds+"_6000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, err := r.DialSeqpacket(1024, 6000, time.Second)
	if err != nil {
		t.Fatalf("SEQPACKET through the fallback: %v", err)
	}
	if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_SEQPACKET {
		t.Errorf("socket type %d, %v; want SOCK_SEQPACKET", typ, err)
	}
	_ = unix.Close(fd)
	streamOnly := newVsockRouter(3, &fakeDialer{})
	if _, err := streamOnly.DialSeqpacket(1024, 6000, time.Second); !errors.Is(err, unix.EPROTOTYPE) {
		t.Errorf("SEQPACKET with a stream-only fallback: %v, want EPROTOTYPE", err)
	}
}
