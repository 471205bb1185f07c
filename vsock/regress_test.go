package vsock_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// Regression: an RX buffer with room for a header but none for data made
// the RX worker retry it forever when host data was pending (emitData
// undid the buffer and reported "nothing to read", the connection stayed
// ready), spinning a CPU and hanging Reset. Such a buffer now stops the
// device like one too small for a header.
func TestRegressionHeaderOnlyRxBufferSpins(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{RxBuffers: 8}})
	e.allowFail = true
	c, h := e.connectGuest(5000, 1025)
	e.g.AutoRepost = false
	for e.g.RxPosted() > 0 {
		// Use up the normal buffers.
		c.CreditRequest()
		e.g.Sync()
		e.g.Poll()
	}
	e.g.PostRXSized(4, vsock.HeaderSize, 1)
	// Control packets fit.
	c.CreditRequest()
	n := c.CountCtl(vsock.OpCreditUpdate)
	e.g.WaitFor("CREDIT_UPDATE in a header-only buffer", func() bool { return c.CountCtl(vsock.OpCreditUpdate) > n })
	hostWrite(t, h, []byte("data with nowhere to go"))
	e.g.WaitFail()
	reset := make(chan struct{})
	go func() {
		e.dev.Reset()
		close(reset)
	}()
	select {
	case <-reset:
	case <-time.After(waitTimeout):
		t.Fatal("Reset hangs: the RX worker is stuck on a header-only RX buffer")
	}
}

// Regression: connectFromHost added the connection to the table before
// locking it, so a reset (or a guest RESPONSE guessing the new host port)
// could close it in between; connectFromHost then attached the host socket
// to the closed connection and nobody ever closed it. The window is a few
// instructions wide: this is a stress test, not a reproducer.
func TestRegressionConnectFromHostResetLeak(t *testing.T) {
	e := newEnv(t, envOpts{})
	for i := 0; i < 100; i++ {
		fd, h := vsocktest.Socketpair(t)
		done := make(chan error, 1)
		go func() { done <- e.dev.ConnectFromHost(fd, 5, nil, time.Now().Add(5*time.Millisecond)) }()
		if i%2 == 0 {
			// The guest answers for the port the connection will get.
			e.g.SendOp(vsock.OpResponse, 5, 1<<30, 4096)
		}
		e.g.Reset()
		<-done
		// Either the reset or the 5 ms connect deadline closes it.
		if err := vsocktest.WaitEOF(h, waitTimeout); err != nil {
			t.Fatalf("iteration %d: host socket never closed: %v", i, err)
		}
		h.Close()
		e.g.Activate()
	}
}

// Regression: ListenUDS bound its socket first at
// "<dir>/.microvm-sock-<random>/s", up to 26 bytes longer than the final
// path when the name is short, so paths that CheckUDSPath accepts (96
// bytes) failed with "bind: invalid argument".
func TestRegressionListenUDSTempNameTooLong(t *testing.T) {
	e := newEnv(t, envOpts{})
	dir := shortDir(t)
	for _, base := range []int{1, 2, 6, 30} {
		t.Run(fmt.Sprintf("name-%d", base), func(t *testing.T) {
			sub := filepath.Join(dir, strings.Repeat("d", 96-len(dir)-2-base))
			if err := os.MkdirAll(sub, 0o700); err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(sub)
			p := filepath.Join(sub, strings.Repeat("n", base))
			if len(p) != 96 || vsock.CheckUDSPath(p) != nil {
				t.Fatalf("path of %d bytes", len(p))
			}
			u, err := vsock.ListenUDS(p, e.dev, time.Second, quietLog())
			if err != nil {
				t.Fatalf("ListenUDS(%d-byte path): %v", len(p), err)
			}
			u.Close()
		})
	}
}

// Regression: the device used host sockets as it got them, and a Dialer
// (or ConnectFromHost caller) handing over a blocking socket made the RX
// worker block in readv with its locks held: every connection stalled and
// Reset never returned. The device now makes the sockets it owns
// non-blocking.
func TestRegressionBlockingHostSocketDeadlock(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.dial.Script = func(uint32) vsocktest.DialAction { return vsocktest.DialAction{Blocking: true} }
	watchdog := time.AfterFunc(waitTimeout, func() {
		panic("TestRegressionBlockingHostSocketDeadlock: the device is stuck on a blocking host socket")
	})
	defer watchdog.Stop()
	c, h := e.connectGuest(1, 2000)
	c2, h2 := e.connectGuest(2, 2001)
	e.transfer(c, h, []byte("guest"), []byte("host"))
	e.transfer(c2, h2, vsocktest.Pattern(1, 512<<10), vsocktest.Pattern(2, 512<<10))
	// A blocking socket from a host client too.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hc := os.NewFile(uintptr(fds[1]), "host")
	defer hc.Close()
	if err := e.dev.ConnectFromHost(fds[0], 3, nil, time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	c3 := e.g.Accept(3)
	c3.Write([]byte("to host"))
	var b [64]byte
	n, _ := hc.Read(b[:])
	if !strings.HasPrefix(string(b[:n]), "OK ") {
		t.Fatalf("host read %q; want the OK line", b[:n])
	}
	e.g.Reset()
}

// Regression: REQUEST followed by RST frees the connection's table slot at
// once while its dial goes on, so a guest looping on the pair could start any
// number of dial goroutines against a slow host. Dials in flight are now
// bounded by MaxConns: past it REQUESTs get RST.
func TestRegressionDialsInFlightBounded(t *testing.T) {
	const maxConns = 4
	e := newEnv(t, envOpts{cfg: vsock.Config{MaxConns: maxConns}})
	hold := make(chan struct{})
	var flood atomic.Bool
	flood.Store(true)
	e.dial.Script = func(uint32) vsocktest.DialAction {
		if flood.Load() {
			return vsocktest.DialAction{Wait: hold, Refuse: true}
		}
		return vsocktest.DialAction{}
	}
	for i := uint32(0); i < 3*maxConns; i++ {
		e.g.SendOp(vsock.OpRequest, 3000+i, 6000, 4096)
		e.g.SendOp(vsock.OpRst, 3000+i, 6000, 4096)
	}
	e.g.Sync()
	e.g.WaitFor("dials to start", func() bool { return e.dial.Dials.Load() >= maxConns })
	if n := e.dial.Dials.Load(); n != maxConns {
		t.Errorf("%d dials started, want at most %d", n, maxConns)
	}
	flood.Store(false)
	close(hold)
	// Once the dials end, new requests are dialled again.
	e.g.WaitFor("the dials to end", func() bool { return e.dev.Stats().ConnsOpen == 0 })
	time.Sleep(50 * time.Millisecond) // let the dial goroutines return
	c, h := e.connectGuest(4000, 6001)
	e.transfer(c, h, []byte("after"), []byte("the flood"))
}

// Regression: vsock.New took any ConnBuffer, and windows near 2^32 made the
// u32 buffered-bytes check wrap.
func TestRegressionConnBufferBound(t *testing.T) {
	if _, err := vsock.New(vsock.Config{CID: 3, ConnBuffer: vsock.MaxConnBuffer + 1}); err == nil {
		t.Fatal("a per-connection buffer over MaxConnBuffer was accepted")
	}
	if _, err := vsock.New(vsock.Config{CID: 3, ConnBuffer: vsock.MaxConnBuffer}); err != nil {
		t.Fatalf("MaxConnBuffer refused: %v", err)
	}
}

// Regression (found by FuzzHostPeer): a guest CREDIT_REQUEST on a
// connection the device had already closed with SHUTDOWN(BOTH) (the host
// hung up) was answered with a CREDIT_UPDATE, although a closing
// connection sends nothing but RST; one before RESPONSE was answered too,
// on a connection not yet open. Both are now ignored: the guest learns
// the credit from the RESPONSE, and a closing connection has none to give.
func TestRegressionCreditUpdateAfterShutdownBoth(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, h := e.connectGuest(5000, 1025)
	h.Close()
	c.WaitShutdown(vsock.ShutdownBoth)
	c.CreditRequest()
	e.g.Sync()
	e.g.Quiet(quietFor, "CREDIT_UPDATE after SHUTDOWN(BOTH)", func() bool { return c.CountCtl(vsock.OpCreditUpdate) > 0 })
	c.Reset()

	// Before RESPONSE: the dial is held until the guest has asked.
	hold := make(chan struct{})
	e.dial.Script = func(uint32) vsocktest.DialAction { return vsocktest.DialAction{Wait: hold} }
	d := e.g.Dial(5001, 1026)
	d.CreditRequest()
	e.g.Sync()
	close(hold)
	e.g.WaitFor("RESPONSE", func() bool { return d.Established || d.Rst })
	if ctl := d.Ctl; len(ctl) == 0 || ctl[0].Op != vsock.OpResponse {
		t.Fatalf("the device's first packets on a new connection: %v; want RESPONSE first", ctl)
	}
	e.dial.Accept(waitTimeout).Close()
}

// Regression (found by FuzzHostPeer): a packet of an unsupported type on
// the ports of a live connection was answered with an RST but left the
// connection in the table and its host socket open. The guest, told the
// connection was reset, could then reuse the ports and have its new
// REQUEST refused as a duplicate, while the host end waited for ever. Such
// a packet now resets the connection itself: the RST means it is gone.
func TestRegressionUnsupportedTypeRstLeavesConnection(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.allowGuestErrs = true
	c, h := e.connectGuest(5000, 1025)
	bad := e.g.Header(vsock.OpRW, 1025, 5000)
	bad.Type = 3 // datagram, not negotiated
	bad.Len = 1
	e.g.Send(bad, []byte("x"))
	c.WaitRst()
	hostClosed(t, h)
	if n := e.dev.Stats().ConnsOpen; n != 0 {
		t.Fatalf("%d connections open after the RST; want 0", n)
	}
	c.Forget()
	if _, err := e.g.Connect(5000, 1025); err != nil {
		t.Fatalf("the guest reusing the ports after the RST: %v", err)
	}
	e.dial.Accept(waitTimeout).Close()
}
