package vsock_test

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// Guest SHUTDOWN(SEND): the host reads everything, then EOF, and can still
// write to the guest.
func TestHalfCloseGuestSend(t *testing.T) {
	for _, host := range []bool{false, true} {
		t.Run(fmt.Sprintf("host-initiated=%v", host), func(t *testing.T) {
			e := newEnv(t, envOpts{})
			var c *vsocktest.Conn
			var h net.Conn
			if host {
				c, h = e.connectHost(700, nil)
			} else {
				c, h = e.connectGuest(700, 1700)
			}
			data := vsocktest.Pattern(1, 200<<10)
			rd := make(chan []byte, 1)
			go func() {
				b, _ := vsocktest.ReadFull(h, len(data), waitTimeout)
				rd <- b
			}()
			c.Write(data)
			c.Shutdown(vsock.ShutdownSend)
			vsocktest.CheckEqual(t, "host read", <-rd, data)
			hostEOF(t, h)
			back := vsocktest.Pattern(2, 300<<10)
			go func() { _, _ = h.Write(back) }()
			vsocktest.CheckEqual(t, "guest read after its SHUTDOWN(SEND)", c.Read(len(back)), back)
			if c.Shut != 0 || c.Rst {
				t.Fatalf("device sent SHUTDOWN(%d) rst=%v while the host still writes", c.Shut, c.Rst)
			}
		})
	}
}

// Host shutdown(SHUT_WR): the guest gets SHUTDOWN with SEND only, after all
// the data, and can still send to the host.
func TestHalfCloseHostWrite(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, h := e.connectGuest(701, 1701)
	data := vsocktest.Pattern(3, 100<<10)
	hostWrite(t, h, data)
	if err := h.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got := c.ReadUntilShutdown()
	vsocktest.CheckEqual(t, "guest read", got, data)
	if c.Shut != vsock.ShutdownSend || c.Rst {
		t.Fatalf("SHUTDOWN flags %d rst=%v; want SEND (%d) only", c.Shut, c.Rst, vsock.ShutdownSend)
	}
	back := vsocktest.Pattern(4, 300<<10)
	rd := make(chan []byte, 1)
	go func() {
		b, _ := vsocktest.ReadFull(h, len(back), waitTimeout)
		rd <- b
	}()
	c.Write(back)
	vsocktest.CheckEqual(t, "host read after its SHUT_WR", <-rd, back)
	// Then the guest closes its side too: both halves are shut, the
	// device says so (SHUTDOWN BOTH), the guest's RST ends it.
	c.Shutdown(vsock.ShutdownSend)
	hostEOF(t, h)
	c.WaitShutdown(vsock.ShutdownBoth)
	c.Reset()
	e.g.Sync()
	if s := e.dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open after the guest's RST", s.ConnsOpen)
	}
}

// The host closes: the guest gets its data, then SHUTDOWN(BOTH), and its
// RST removes the connection.
func TestCloseFromHost(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, h := e.connectGuest(702, 1702)
	data := vsocktest.Pattern(5, 64<<10)
	go func() {
		_, _ = h.Write(data)
		h.Close()
	}()
	vsocktest.CheckEqual(t, "guest read", c.ReadUntilShutdown(), data)
	c.WaitShutdown(vsock.ShutdownBoth)
	if c.Rst {
		t.Fatal("device sent RST before the guest answered SHUTDOWN(BOTH)")
	}
	c.Reset()
	e.g.Sync()
	e.g.Quiet(quietFor, "the device answered the guest's RST", func() bool { return len(e.g.Pending()) > 0 })
	if s := e.dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open", s.ConnsOpen)
	}
}

// Data the guest sent before it saw the device's SHUTDOWN(BOTH) (the host
// closed its socket) crosses it in flight: it is dropped and counted, not
// a guest error, and the device still waits for the guest's RST.
func TestRWAfterHostClose(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, h := e.connectGuest(704, 1704)
	h.Close()
	c.WaitShutdown(vsock.ShutdownBoth)
	c.Send(vsock.OpRW, 0, []byte("in flight"))
	e.g.Sync()
	if c.Rst {
		t.Fatal("device reset the connection for data in flight")
	}
	c.Reset()
	e.g.Sync()
	s := e.dev.Stats()
	if s.GuestErrors != 0 || s.LateRWDropped != 1 || s.ConnsOpen != 0 {
		t.Errorf("guest errors %d, late RW dropped %d, open %d; want 0, 1, 0", s.GuestErrors, s.LateRWDropped, s.ConnsOpen)
	}
}

// The guest closes both ways: the device flushes, RSTs, and the host sees
// the socket closed.
func TestCloseFromGuest(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, h := e.connectGuest(703, 1703)
	c.Write([]byte("last words"))
	c.Shutdown(vsock.ShutdownBoth)
	c.WaitRst()
	hostRead(t, h, []byte("last words"))
	hostClosed(t, h)
	if s := e.dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open", s.ConnsOpen)
	}
}

// SHUTDOWN(BOTH) while the host is not reading: the RST waits until every
// buffered guest byte has reached the host.
func TestCloseFromGuestFlushesFirst(t *testing.T) {
	const buf = 32 << 10
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: buf}})
	c, h := e.connectGuest(704, 1704)
	data := vsocktest.Pattern(6, 4<<20)
	sent := e.stallGuest(c, data)
	c.Shutdown(vsock.ShutdownBoth)
	e.g.Sync()
	e.g.Quiet(quietFor, "RST before the buffered data reached the host", func() bool { return c.Rst })
	hostRead(t, h, data[:sent])
	hostClosed(t, h)
	c.WaitRst()
}

// RST for a connection the device does not know is not answered (no RST
// loop); other packets for unknown connections are answered with RST.
func TestUnknownConnection(t *testing.T) {
	for _, tc := range []struct {
		op      vsock.Op
		payload []byte
		rst     bool
	}{
		{vsock.OpRst, nil, false},
		{vsock.OpRW, []byte("data"), true},
		{vsock.OpShutdown, nil, true},
		{vsock.OpCreditUpdate, nil, true},
		{vsock.OpCreditRequest, nil, true},
		{vsock.OpResponse, nil, true},
		{vsock.Op(99), nil, true},
	} {
		t.Run(tc.op.String(), func(t *testing.T) {
			e := newEnv(t, envOpts{})
			h := e.g.Header(tc.op, 1800, 800)
			h.Len = uint32(len(tc.payload))
			h.BufAlloc = 4096
			if tc.op == vsock.OpShutdown {
				h.Flags = vsock.ShutdownBoth
			}
			e.g.Send(h, tc.payload)
			if tc.rst {
				p := e.g.ExpectOp(vsock.OpRst, 800, 1800)
				if p.Hdr.BufAlloc != 0 || p.Hdr.FwdCnt != 0 || p.Hdr.Flags != 0 {
					t.Errorf("RST %v: want zero flags and credit", &p.Hdr)
				}
			} else {
				e.g.Sync()
				e.g.Quiet(quietFor, "RST answered with a packet", func() bool { return len(e.g.Pending()) > 0 })
			}
			if s := e.dev.Stats(); s.ConnsOpen != 0 || s.ConnsOpened != 0 {
				t.Errorf("stats %+v: a connection was created", s)
			}
		})
	}
}

// A REQUEST for a connection that exists resets it.
func TestRequestForExistingConnection(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.allowGuestErrs = true
	c, h := e.connectGuest(705, 1705)
	c.Send(vsock.OpRequest, 0, nil)
	c.WaitRst()
	hostClosed(t, h)
	if s := e.dev.Stats(); s.GuestErrors != 1 || s.ConnsOpen != 0 {
		t.Errorf("stats %+v: want 1 guest error, no connection", s)
	}
}

// Packets that make no sense in the connection's state reset it.
func TestWrongStatePackets(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(c *vsocktest.Conn)
	}{
		{"RESPONSE-when-established", func(c *vsocktest.Conn) { c.Send(vsock.OpResponse, 0, nil) }},
		{"RW-after-SHUTDOWN-SEND", func(c *vsocktest.Conn) {
			c.Shutdown(vsock.ShutdownSend)
			c.Send(vsock.OpRW, 0, []byte("late"))
		}},
		{"unknown-op", func(c *vsocktest.Conn) { c.Send(vsock.Op(42), 0, nil) }},
		{"op-0", func(c *vsocktest.Conn) { c.Send(vsock.OpInvalid, 0, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			e.allowGuestErrs = true
			c, h := e.connectGuest(706, 1706)
			tc.send(c)
			c.WaitRst()
			hostClosed(t, h)
			if s := e.dev.Stats(); s.GuestErrors != 1 {
				t.Errorf("%d guest errors; want 1", s.GuestErrors)
			}
		})
	}
}

// A packet on a connection the guest is still connecting (the dial has not
// finished) resets it; the late dial's socket is closed.
func TestPacketWhileDialing(t *testing.T) {
	e := newEnv(t, envOpts{})
	release := make(chan struct{})
	e.dial.Script = func(uint32) vsocktest.DialAction { return vsocktest.DialAction{Wait: release} }
	c := e.g.Dial(707, 1707)
	e.g.Sync()
	c.Shutdown(vsock.ShutdownBoth)
	c.WaitRst()
	close(release)
	h := e.dial.Accept(waitTimeout)
	hostClosed(t, h)
	if c.Established {
		t.Fatal("RESPONSE after the connection was reset")
	}
}

// A host socket that fails resets the connection: writing to it (the
// device's end was shut down for writing) and reading from it (a pipe's
// write end, which cannot be read).
func TestHostSocketError(t *testing.T) {
	t.Run("write", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		e.dial.Script = func(uint32) vsocktest.DialAction {
			return vsocktest.DialAction{Prep: func(fd int) { _ = unix.Shutdown(fd, unix.SHUT_WR) }}
		}
		c, _ := e.connectGuest(708, 1708)
		c.Send(vsock.OpRW, 0, []byte("nowhere to go"))
		c.WaitRst()
	})
	t.Run("read", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		var keep int
		e.dial.Script = func(uint32) vsocktest.DialAction {
			return vsocktest.DialAction{FD: func() (int, error) {
				var p [2]int
				if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
					return -1, err
				}
				keep = p[0]
				return p[1], nil
			}}
		}
		c := e.g.Dial(709, 1709)
		c.WaitRst()
		unix.Close(keep)
	})
}

// TestRegressionCloseTimeout: a guest that never answers the device's
// SHUTDOWN(BOTH) used to keep the connection, and its table slot, for ever.
// After the close timeout the device resets it.
func TestRegressionCloseTimeout(t *testing.T) {
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnectTimeout: 200 * time.Millisecond}})
	c, h := e.connectGuest(704, 1704)
	h.Close()
	c.WaitShutdown(vsock.ShutdownBoth)
	// The guest stays silent; the device gives up after the timeout.
	c.WaitRst()
	if s := e.dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open after the close timeout", s.ConnsOpen)
	}
}

// Guest SHUTDOWN(RCV) ("will not receive") reaches the host socket as
// shutdown(SHUT_RD): the host's further writes fail with EPIPE (as a Linux
// vsock socket's do once its peer shut down receiving), host data not yet
// delivered is dropped even when the guest later grants credit, the guest
// can still send, and the host's close is reported as SHUTDOWN(BOTH).
func TestGuestShutdownRcv(t *testing.T) {
	for _, kind := range []string{"guest-initiated", "host-initiated", "seqpacket"} {
		t.Run(kind, func(t *testing.T) {
			// A small guest buffer, so that most of what the host writes
			// is still undelivered when the guest shuts down receiving.
			e := newEnv(t, envOpts{guest: vsocktest.Options{GuestBuf: 4096, Seqpacket: kind == "seqpacket"}})
			var c *vsocktest.Conn
			var h *net.UnixConn
			switch kind {
			case "guest-initiated":
				var hc *vsocktest.HostConn
				c, hc = e.connectGuest(720, 1720)
				h = hc.UnixConn
			case "host-initiated":
				c, h = e.connectHost(721, nil)
			case "seqpacket":
				var hc *vsocktest.HostConn
				c, hc = e.connectSeq(722, 1722)
				h = hc.UnixConn
			}
			if kind == "seqpacket" {
				// Two records: the first fits the guest's buffer, the
				// second waits for credit.
				hostWrite(t, h, vsocktest.Pattern(1, 4096))
				hostWrite(t, h, vsocktest.Pattern(2, 4096))
			} else {
				hostWrite(t, h, vsocktest.Pattern(1, 16<<10))
			}
			e.g.WaitFor("the first 4096 bytes", func() bool { return c.RxCnt == 4096 })
			c.Shutdown(vsock.ShutdownRcv)
			e.g.Sync()
			// More credit than everything the host wrote: the device must
			// still send nothing.
			c.BufAlloc = 1 << 20
			c.CreditUpdate()
			e.g.Sync()
			e.g.Quiet(quietFor, "data after the guest's SHUTDOWN(RCV)", func() bool { return c.RxCnt != 4096 })

			_ = h.SetWriteDeadline(time.Now().Add(waitTimeout))
			if _, err := h.Write([]byte("more")); !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("host write after the guest's SHUTDOWN(RCV): %v, want EPIPE", err)
			}
			// The other direction still works.
			back := vsocktest.Pattern(3, 1000)
			if kind == "seqpacket" {
				c.WriteMsg(back, true)
				hostRecord(t, h, back)
			} else {
				c.Write(back)
				hostRead(t, h, back)
			}
			if c.Shut != 0 || c.Rst {
				t.Fatalf("device sent SHUTDOWN(%d) rst=%v before the host closed", c.Shut, c.Rst)
			}
			// The device no longer reads the socket, so only the hang-up
			// tells it the host is gone.
			h.Close()
			c.WaitShutdown(vsock.ShutdownBoth)
			c.Reset()
			e.g.Sync()
			e.g.WaitFor("the connection to close", func() bool { return e.dev.Stats().ConnsOpen == 0 })
		})
	}
}
