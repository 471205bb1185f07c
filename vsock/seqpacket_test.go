package vsock_test

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// seqEnv is an env whose guest negotiates SEQPACKET.
func seqEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	o.guest.Seqpacket = true
	return newEnv(t, o)
}

// connectSeq opens a guest-initiated SEQPACKET connection and returns both
// ends.
func (e *env) connectSeq(hostPort, guestPort uint32) (*vsocktest.Conn, *vsocktest.HostConn) {
	e.tb.Helper()
	c, err := e.g.ConnectSeqpacket(hostPort, guestPort)
	if err != nil {
		e.tb.Fatal(err)
	}
	h := e.dial.Accept(waitTimeout)
	if h.Port != hostPort || !h.Seqpacket {
		e.tb.Fatalf("dialled port %d (SEQPACKET %v); want %d, SEQPACKET", h.Port, h.Seqpacket, hostPort)
	}
	return c, h
}

// hostRecord reads one record on a host end and checks it against want.
func hostRecord(tb testing.TB, h *net.UnixConn, want []byte) {
	tb.Helper()
	got, err := vsocktest.ReadRecord(h, len(want)+1, waitTimeout)
	if err != nil {
		tb.Fatalf("host read of a %d-byte record: %v", len(want), err)
	}
	vsocktest.CheckEqual(tb, "host record", got, want)
}

// guestMsg reads one message in the guest and checks it, and that it
// carries EOR.
func guestMsg(tb testing.TB, c *vsocktest.Conn, want []byte) vsocktest.Msg {
	tb.Helper()
	m := c.ReadMsg()
	vsocktest.CheckEqual(tb, "guest message", m.Data, want)
	if !m.EOR {
		tb.Errorf("a %d-byte message from a SEQPACKET Unix socket without EOR", len(want))
	}
	return m
}

// The message sizes the boundary tests use: around the 4 KiB packets the
// guest sends and receives, and 64 KiB, the largest message a Linux guest
// sends to a device with the default 64 KiB buffer.
var seqSizes = []int{1, 2, 100, 4095, 4096, 4097, 8192, 12345, 64 << 10, 3, 1}

func TestSeqpacketFeature(t *testing.T) {
	e := newEnv(t, envOpts{})
	if f := e.dev.Features(); f&vsock.FeatureSeqpacket == 0 {
		t.Fatalf("features %#x: SEQPACKET (bit 1) not offered", f)
	}
}

// Guest messages reach the host one record each, whatever the options: no
// option may merge two messages into a record or cut one.
func TestSeqpacketGuestToHost(t *testing.T) {
	for name, o := range map[string]vsock.Options{
		"all-on":     vsock.DefaultOptions,
		"all-off":    {},
		"batch-only": {BatchLock: true},
	} {
		t.Run(name, func(t *testing.T) {
			e := seqEnv(t, envOpts{cfg: vsock.Config{Options: &o}})
			c, h := e.connectSeq(5000, 1025)
			var want [][]byte
			for i, n := range seqSizes {
				m := vsocktest.Pattern(uint64(i), n)
				want = append(want, m)
				c.WriteMsg(m, i%2 == 0)
			}
			for _, m := range want {
				hostRecord(t, h.UnixConn, m)
			}
			// The device counts a record after its sendmsg returns, so
			// the host may read the last one first.
			e.g.WaitFor(fmt.Sprintf("SeqToHost to reach %d", len(want)), func() bool {
				return e.dev.Stats().SeqToHost == uint64(len(want))
			})
		})
	}
}

// While the host does not read, complete messages queue in the device as
// records and go out one sendmsg each once the socket has room again.
func TestSeqpacketGuestToHostQueued(t *testing.T) {
	e := seqEnv(t, envOpts{})
	c, h := e.connectSeq(5000, 1025)
	// Small records fill a Unix socket's buffer long before the credit
	// runs out (each costs its skb's overhead).
	const n = 3000
	for i := 0; i < n; i++ {
		c.WriteMsg([]byte{byte(i), byte(i >> 8), 0xee}, false)
	}
	e.g.Sync()
	if s := e.dev.Stats(); s.HostWriteStalls == 0 {
		t.Fatalf("stats %+v: the host socket never filled; the test does not reach the queue", s)
	}
	for i := 0; i < n; i++ {
		hostRecord(t, h.UnixConn, []byte{byte(i), byte(i >> 8), 0xee})
	}
	// The queue drains and the connection goes on.
	c.WriteMsg([]byte("after"), true)
	hostRecord(t, h.UnixConn, []byte("after"))
}

// Host records reach the guest as one message each, split into RX-buffer
// sized packets, EOM (and EOR) on the last only.
func TestSeqpacketHostToGuest(t *testing.T) {
	all := append(append([]int(nil), seqSizes...), 100<<10, 200<<10)
	for _, rxLen := range []uint32{vsocktest.DefaultRxBufLen, vsock.HeaderSize + 1, vsock.HeaderSize + 64<<10} {
		t.Run(fmt.Sprint(rxLen), func(t *testing.T) {
			sizes := all
			if rxLen == vsock.HeaderSize+1 {
				// One payload byte a packet: records up to 12 KiB show
				// the split as well as 300 KiB would, without the
				// third of a million packets that outlast the wait
				// under -race on a loaded host.
				sizes = []int{1, 2, 100, 4095, 4096, 4097, 12345, 3, 1}
			}
			o := vsocktest.Options{RxBufLen: rxLen}
			if rxLen > 4<<10 {
				o.RxBuffers = 16 // guest memory
			}
			e := seqEnv(t, envOpts{guest: o})
			c, h := e.connectSeq(5000, 1025)
			go func() {
				for i, n := range sizes {
					_ = h.SetWriteDeadline(time.Now().Add(waitTimeout))
					if _, err := h.Write(vsocktest.Pattern(uint64(i), n)); err != nil {
						t.Errorf("host write: %v", err)
						return
					}
				}
			}()
			for i, n := range sizes {
				m := guestMsg(t, c, vsocktest.Pattern(uint64(i), n))
				room := int(rxLen - vsock.HeaderSize)
				if want := (n + room - 1) / room; rxLen <= vsock.HeaderSize+64<<10 && m.Packets != want {
					t.Errorf("a %d-byte record in %d packets; want %d of at most %d bytes", n, m.Packets, want, room)
				}
			}
			if s := e.dev.Stats(); s.SeqToGuest != uint64(len(sizes)) {
				t.Errorf("SeqToGuest %d; want %d", s.SeqToGuest, len(sizes))
			}
		})
	}
}

// A record waits until the guest's credit covers all of it: it is never
// cut by a credit stall. One larger than the guest's whole buffer can never
// be delivered and resets the connection.
func TestSeqpacketHostCredit(t *testing.T) {
	const buf = 16 << 10
	e := seqEnv(t, envOpts{guest: vsocktest.Options{GuestBuf: buf}})
	c, h := e.connectSeq(5000, 1025)
	c.AutoCredit = false
	a, b := vsocktest.Pattern(1, 10<<10), vsocktest.Pattern(2, 10<<10)
	hostWrite(t, h, a)
	hostWrite(t, h, b)
	e.g.WaitFor("the first message", func() bool { return c.Msgs() == 1 })
	e.g.Quiet(5*quietFor, "the second record sent without the credit for it", func() bool { return c.Msgs() > 1 || c.PartialPackets() > 0 })
	guestMsg(t, c, a)
	c.CreditUpdate()
	guestMsg(t, c, b)

	hostWrite(t, h, vsocktest.Pattern(3, buf+1))
	c.WaitRst()
	hostClosed(t, h)
}

// The connect path: the REQUEST is of type SEQPACKET, the OK reply one
// record, then records both ways.
func TestSeqpacketHostInitiated(t *testing.T) {
	e := seqEnv(t, envOpts{})
	h, err := vsocktest.HostConnectSeqpacket(t, e.dev, 52, time.Now().Add(waitTimeout))
	if err != nil {
		t.Fatal(err)
	}
	c := e.g.Accept(52)
	if c.Type != vsock.TypeSeqpacket {
		t.Fatalf("REQUEST of type %d; want SEQPACKET", c.Type)
	}
	ok, err := vsocktest.ReadRecord(h, 64, waitTimeout)
	if want := fmt.Sprintf("OK %d\n", c.HostPort); err != nil || string(ok) != want {
		t.Fatalf("reply %q, %v; want the record %q", ok, err, want)
	}
	for i, n := range []int{1, 64 << 10, 7} {
		m := vsocktest.Pattern(uint64(i), n)
		c.WriteMsg(m, true)
		hostRecord(t, h, m)
		hostWrite(t, h, m)
		guestMsg(t, c, m)
	}
}

// A driver that did not negotiate SEQPACKET is never asked to accept one.
func TestSeqpacketHostInitiatedUnnegotiated(t *testing.T) {
	e := newEnv(t, envOpts{})
	h, err := vsocktest.HostConnectSeqpacket(t, e.dev, 52, time.Now().Add(waitTimeout))
	if err == nil {
		t.Fatal("ConnectSeqpacketFromHost succeeded without SEQPACKET negotiated")
	}
	hostEOF(t, h)
	e.g.Quiet(quietFor, "a packet to the guest", func() bool { return len(e.g.Pending()) > 0 })
}

// A message larger than the device's buffer overruns the credit: the
// connection is reset and the error counted; the device's memory does not
// grow with it.
func TestSeqpacketMessageOverBuffer(t *testing.T) {
	e := seqEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: 16 << 10}})
	e.allowGuestErrs = true
	c, h := e.connectSeq(5000, 1025)
	for i := 0; i < 3; i++ {
		c.Send(vsock.OpRW, 0, make([]byte, 8<<10)) // no EOM: one 24 KiB message
	}
	c.WaitRst()
	hostClosed(t, h)
	if s := e.dev.Stats(); s.GuestErrors != 1 || s.SeqToHost != 0 {
		t.Errorf("stats %+v: want 1 guest error, nothing written", s)
	}
}

// A packet of the other type on an established connection resets it, in
// either direction; the RST carries the connection's type.
func TestSeqpacketTypeMismatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		connTyp uint16
		op      vsock.Op
	}{
		{"stream-rw-on-seqpacket", vsock.TypeSeqpacket, vsock.OpRW},
		{"stream-credit-on-seqpacket", vsock.TypeSeqpacket, vsock.OpCreditUpdate},
		{"seqpacket-rw-on-stream", vsock.TypeStream, vsock.OpRW},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := seqEnv(t, envOpts{})
			e.allowGuestErrs = true
			var c *vsocktest.Conn
			var h *vsocktest.HostConn
			if tc.connTyp == vsock.TypeSeqpacket {
				c, h = e.connectSeq(5000, 1025)
			} else {
				c, h = e.connectGuest(5000, 1025)
			}
			p := e.g.Header(tc.op, 1025, 5000)
			p.Type = vsock.TypeStream + vsock.TypeSeqpacket - tc.connTyp
			p.BufAlloc = c.BufAlloc
			payload := []byte("x")
			if tc.op != vsock.OpRW {
				payload = nil
			}
			p.Len = uint32(len(payload))
			p.Flags = vsock.SeqEOM
			if tc.connTyp == vsock.TypeSeqpacket {
				p.Flags = 0
			}
			e.g.Send(p, payload)
			c.WaitRst()
			if rst := c.Ctl[len(c.Ctl)-1]; rst.Type != tc.connTyp {
				t.Errorf("RST %v; want the connection's type %d", &rst, tc.connTyp)
			}
			hostClosed(t, h)
			if s := e.dev.Stats(); s.GuestErrors != 1 {
				t.Errorf("%d guest errors; want 1", s.GuestErrors)
			}
		})
	}
}

// A Dialer that makes stream sockets only refuses SEQPACKET connections
// with RST, without dialling.
func TestSeqpacketDialerWithoutSeqpacket(t *testing.T) {
	d := streamOnly{vsocktest.NewDialer(t)}
	e := seqEnv(t, envOpts{cfg: vsock.Config{Dialer: d}})
	if _, err := e.g.ConnectSeqpacket(5000, 1025); err == nil {
		t.Fatal("connected through a stream-only dialer")
	}
	if d.d.Dials.Load() != 0 {
		t.Errorf("%d dials", d.d.Dials.Load())
	}
}

type streamOnly struct{ d *vsocktest.Dialer }

func (s streamOnly) Dial(g, p uint32, timeout time.Duration) (int, error) {
	return s.d.Dial(g, p, timeout)
}

// The host ends SEQPACKET connections like stream ones: shutdown(SHUT_WR)
// is SHUTDOWN(SEND) after the records before it; the guest's SHUTDOWN(SEND)
// half-closes the host socket, dropping a message it never finished.
func TestSeqpacketShutdown(t *testing.T) {
	e := seqEnv(t, envOpts{})
	c, h := e.connectSeq(5000, 1025)
	hostWrite(t, h, []byte("last"))
	if _, err := h.Write(nil); err != nil { // an empty record: nothing carries it
		t.Fatal(err)
	}
	if err := h.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	guestMsg(t, c, []byte("last"))
	c.WaitShutdown(vsock.ShutdownSend)
	if c.Msgs() != 0 {
		t.Errorf("%d more messages; the empty record must not become one", c.Msgs())
	}
	c.WriteMsg([]byte("reply"), false)
	c.Send(vsock.OpRW, 0, []byte("unfinished"))
	c.Shutdown(vsock.ShutdownSend)
	hostRecord(t, h.UnixConn, []byte("reply"))
	hostEOF(t, h)
}

// The Firecracker-style host sockets for SEQPACKET: <uds>.seqpacket for
// host-initiated connections, <uds>_<port> dialled with SOCK_SEQPACKET for
// guest-initiated ones (a stream listener there refuses).
func TestSeqpacketUDS(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "v.sock")
	e := seqEnv(t, envOpts{cfg: vsock.Config{Dialer: vsock.UDSDialer{Path: path}}})
	u, err := vsock.ListenUDS(path, e.dev, 200*time.Millisecond, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { u.Serve(); close(served) }()
	defer func() {
		u.Close()
		<-served
	}()
	if u.SeqpacketPath() != path+".seqpacket" {
		t.Fatalf("SeqpacketPath %q", u.SeqpacketPath())
	}

	t.Run("host-to-guest", func(t *testing.T) {
		for _, line := range []string{"CONNECT 52\n", "connect 52"} {
			hc, err := net.Dial("unixpacket", u.SeqpacketPath())
			if err != nil {
				t.Fatal(err)
			}
			defer hc.Close()
			if _, err := hc.Write([]byte(line)); err != nil {
				t.Fatal(err)
			}
			c := e.g.Accept(52)
			if c.Type != vsock.TypeSeqpacket {
				t.Fatalf("REQUEST of type %d", c.Type)
			}
			ok, err := vsocktest.ReadRecord(hc.(*net.UnixConn), 64, waitTimeout)
			if want := fmt.Sprintf("OK %d\n", c.HostPort); err != nil || string(ok) != want {
				t.Fatalf("reply %q, %v; want %q", ok, err, want)
			}
			c.WriteMsg([]byte("ping"), true)
			hostRecord(t, hc.(*net.UnixConn), []byte("ping"))
			hostWrite(t, hc, []byte("pong"))
			guestMsg(t, c, []byte("pong"))
		}
	})
	t.Run("bad-records-closed", func(t *testing.T) {
		for _, rec := range []string{"CONNECT 52\nextra", "CONNECT x\n", "HELLO", string(make([]byte, 100))} {
			hc, err := net.Dial("unixpacket", u.SeqpacketPath())
			if err != nil {
				t.Fatal(err)
			}
			_, _ = hc.Write([]byte(rec))
			if err := vsocktest.WaitEOF(hc, waitTimeout); err != nil {
				t.Errorf("%q: connection not closed: %v", rec, err)
			}
			hc.Close()
		}
	})
	t.Run("guest-to-host", func(t *testing.T) {
		ln, err := net.Listen("unixpacket", path+"_4000")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := e.g.ConnectSeqpacket(4000, 3333)
		if err != nil {
			t.Fatal(err)
		}
		hc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		big := vsocktest.Pattern(9, 64<<10)
		c.WriteMsg(big, true)
		hostRecord(t, hc.(*net.UnixConn), big)
		hostWrite(t, hc, big)
		guestMsg(t, c, big)
	})
	t.Run("stream-listener-refuses", func(t *testing.T) {
		ln, err := net.Listen("unix", path+"_4001")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if _, err := e.g.ConnectSeqpacket(4001, 3334); err == nil {
			t.Fatal("a SEQPACKET connection reached a stream listener")
		}
		// And a stream connection does not reach a SEQPACKET listener.
		pl, err := net.Listen("unixpacket", path+"_4002")
		if err != nil {
			t.Fatal(err)
		}
		defer pl.Close()
		if _, err := e.g.Connect(4002, 3335); err == nil {
			t.Fatal("a stream connection reached a SEQPACKET listener")
		}
	})
}

// The conformance exchange in-process: the guest sends messages without
// waiting for the echoes, the host echoes each record, so credit stalls
// both ways with messages in flight.
func TestSeqpacketEchoPipelined(t *testing.T) {
	e := seqEnv(t, envOpts{})
	c, h := e.connectSeq(5000, 1025)
	go func() {
		buf := make([]byte, 1<<20)
		for {
			n, err := h.Read(buf)
			if err != nil || n == 0 {
				return
			}
			if _, err := h.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	sizes := []int{1, 64 << 10, 4096, 4097, 64<<10 - 1, 100, 60000, 65536, 7, 65536}
	got := 0
	for i, n := range sizes {
		c.WriteMsg(vsocktest.Pattern(uint64(i), n), true)
		for c.Msgs() > 0 {
			guestMsg(t, c, vsocktest.Pattern(uint64(got), sizes[got]))
			got++
		}
	}
	for ; got < len(sizes); got++ {
		guestMsg(t, c, vsocktest.Pattern(uint64(got), sizes[got]))
	}
}
