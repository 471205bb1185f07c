package vsocktest

import (
	"fmt"

	"github.com/microvm/microvm/vsock"
)

// DefaultGuestBuf is the receive buffer a guest connection advertises
// (Linux's default).
const DefaultGuestBuf = 256 << 10

// Conn is the guest side of one stream connection. Its counters follow the
// virtio spec (5.10.6.3): every packet it sends carries BufAlloc and the
// bytes the guest application consumed (fwd_cnt); the device's credit is
// PeerBufAlloc - (TxCnt - PeerFwdCnt).
type Conn struct {
	g                   *Guest
	HostPort, GuestPort uint32
	// Type is vsock.TypeStream or vsock.TypeSeqpacket: the type of every
	// packet the connection sends, and the one it expects.
	Type uint16

	// BufAlloc is the guest's receive buffer, advertised in every packet.
	BufAlloc uint32
	// AutoCredit sends a CREDIT_UPDATE after a Read once the guest has
	// consumed half its buffer since it last advertised (default true).
	AutoCredit bool
	// MaxPacket is the largest RW payload Write sends (default 4096).
	MaxPacket int

	// Guest -> device.
	PeerBufAlloc, PeerFwdCnt, TxCnt uint32
	// Device -> guest: bytes received, bytes consumed, fwd_cnt last sent.
	RxCnt, FwdCnt, sentFwd uint32
	data                   []byte

	// Established: RESPONSE exchanged. Shut: SHUTDOWN flags received.
	// Rst: RST received. Ctl: every control packet received, in order.
	Established bool
	Shut        uint32
	Rst         bool
	Ctl         []vsock.Header
	// TransportReset: a TRANSPORT_RESET event reset the connection (as
	// Linux does with ECONNRESET) and the guest forgot it.
	TransportReset bool
	closed         bool // forgotten by the guest (reset)

	// SEQPACKET: cur gathers the message being received, msgs holds the
	// complete ones not read yet.
	cur  Msg
	msgs []Msg
}

// Msg is a SEQPACKET message the guest received.
type Msg struct {
	Data    []byte
	EOR     bool // its last packet carried SeqEOR
	Packets int  // how many RW packets carried it
}

func (g *Guest) newConn(hostPort, guestPort uint32) *Conn {
	k := connKey{hostPort, guestPort}
	if g.conns[k] != nil {
		g.TB.Fatalf("vsocktest: connection %d<->%d exists", hostPort, guestPort)
	}
	c := &Conn{g: g, HostPort: hostPort, GuestPort: guestPort, Type: vsock.TypeStream, BufAlloc: g.Opts.GuestBuf, AutoCredit: true, MaxPacket: 4096}
	g.conns[k] = c
	return c
}

// Forget drops the connection from the guest's table: later packets for it
// land in the pending list.
func (c *Conn) Forget() {
	if c.g.conns[connKey{c.HostPort, c.GuestPort}] == c {
		delete(c.g.conns, connKey{c.HostPort, c.GuestPort})
	}
	c.closed = true
}

// Dial sends a REQUEST from guestPort to hostPort and returns the connection
// without waiting for the answer.
func (g *Guest) Dial(hostPort, guestPort uint32) *Conn {
	c := g.newConn(hostPort, guestPort)
	c.Send(vsock.OpRequest, 0, nil)
	return c
}

// Connect dials and waits for RESPONSE; it returns an error if the device
// answers with RST.
func (g *Guest) Connect(hostPort, guestPort uint32) (*Conn, error) {
	g.TB.Helper()
	c := g.Dial(hostPort, guestPort)
	g.WaitFor(fmt.Sprintf("RESPONSE or RST for %d->%d", guestPort, hostPort), func() bool { return c.Established || c.Rst })
	if c.Rst {
		c.Forget()
		return nil, fmt.Errorf("vsocktest: connection to host port %d reset", hostPort)
	}
	return c, nil
}

// WaitRequest waits for the device's REQUEST to guestPort and returns it
// (unanswered).
func (g *Guest) WaitRequest(guestPort uint32) Packet {
	g.TB.Helper()
	return g.ExpectOp(vsock.OpRequest, 0, guestPort)
}

// DialSeqpacket is Dial for a SEQPACKET connection.
func (g *Guest) DialSeqpacket(hostPort, guestPort uint32) *Conn {
	c := g.newConn(hostPort, guestPort)
	c.Type = vsock.TypeSeqpacket
	c.Send(vsock.OpRequest, 0, nil)
	return c
}

// ConnectSeqpacket is Connect for a SEQPACKET connection.
func (g *Guest) ConnectSeqpacket(hostPort, guestPort uint32) (*Conn, error) {
	g.TB.Helper()
	c := g.DialSeqpacket(hostPort, guestPort)
	g.WaitFor(fmt.Sprintf("RESPONSE or RST for SEQPACKET %d->%d", guestPort, hostPort), func() bool { return c.Established || c.Rst })
	if c.Rst {
		c.Forget()
		return nil, fmt.Errorf("vsocktest: SEQPACKET connection to host port %d reset", hostPort)
	}
	return c, nil
}

// Accept waits for a REQUEST to guestPort and answers it with RESPONSE; the
// connection takes the REQUEST's type.
func (g *Guest) Accept(guestPort uint32) *Conn {
	g.TB.Helper()
	return g.AcceptPacket(g.WaitRequest(guestPort))
}

// AcceptPacket answers the device's REQUEST p (already taken from the
// pending list, e.g. by Expect) with RESPONSE and returns the connection.
func (g *Guest) AcceptPacket(p Packet) *Conn {
	g.TB.Helper()
	if p.Hdr.Op != vsock.OpRequest {
		g.TB.Fatalf("vsocktest: AcceptPacket(%v): not a REQUEST", p.Hdr)
	}
	c := g.newConn(p.Hdr.SrcPort, p.Hdr.DstPort)
	c.Type = p.Hdr.Type
	c.PeerBufAlloc, c.PeerFwdCnt = p.Hdr.BufAlloc, p.Hdr.FwdCnt
	c.Established = true
	c.Send(vsock.OpResponse, 0, nil)
	return c
}

// receive takes a packet the device sent on this connection.
func (c *Conn) receive(p Packet) {
	h := &p.Hdr
	if h.Type != c.Type {
		c.g.TB.Errorf("vsocktest: %d<->%d: packet %v on a connection of type %d", c.HostPort, c.GuestPort, h, c.Type)
	}
	c.PeerBufAlloc, c.PeerFwdCnt = h.BufAlloc, h.FwdCnt
	if h.Op != vsock.OpRW {
		c.Ctl = append(c.Ctl, *h)
	}
	switch h.Op {
	case vsock.OpResponse:
		c.Established = true
	case vsock.OpRW:
		c.RxCnt += h.Len
		if c.RxCnt-c.sentFwd > c.BufAlloc {
			c.g.TB.Errorf("vsocktest: %d<->%d: the device sent %d bytes past the guest's credit (buf_alloc %d, fwd_cnt %d, received %d)",
				c.HostPort, c.GuestPort, c.RxCnt-c.sentFwd-c.BufAlloc, c.BufAlloc, c.sentFwd, c.RxCnt)
		}
		if c.Shut&vsock.ShutdownSend != 0 {
			c.g.TB.Errorf("vsocktest: %d<->%d: data after SHUTDOWN(SEND)", c.HostPort, c.GuestPort)
		}
		if c.Type == vsock.TypeSeqpacket {
			c.receiveFragment(h, p.Data)
			return
		}
		c.data = append(c.data, p.Data...)
	case vsock.OpShutdown:
		c.Shut |= h.Flags
	case vsock.OpRst:
		c.Rst = true
	}
}

// receiveFragment adds a SEQPACKET RW packet to the message being received.
func (c *Conn) receiveFragment(h *vsock.Header, data []byte) {
	if h.Flags&^(vsock.SeqEOM|vsock.SeqEOR) != 0 || h.Flags == vsock.SeqEOR {
		c.g.TB.Errorf("vsocktest: %d<->%d: RW packet %v: flags", c.HostPort, c.GuestPort, h)
	}
	c.cur.Data = append(c.cur.Data, data...)
	c.cur.Packets++
	if h.Flags&vsock.SeqEOM != 0 {
		c.cur.EOR = h.Flags&vsock.SeqEOR != 0
		c.msgs = append(c.msgs, c.cur)
		c.cur = Msg{}
	}
}

// PartialPackets is how many packets of a SEQPACKET message not yet
// complete (no EOM) the guest holds.
func (c *Conn) PartialPackets() int { return c.cur.Packets }

// Msgs is how many complete SEQPACKET messages wait to be read.
func (c *Conn) Msgs() int { return len(c.msgs) }

// ReadMsg waits for the next SEQPACKET message and consumes it (its bytes
// count as read for the credit, as in Consume).
func (c *Conn) ReadMsg() Msg {
	c.g.TB.Helper()
	c.g.WaitFor(fmt.Sprintf("a message on %d<->%d", c.HostPort, c.GuestPort), func() bool { return len(c.msgs) > 0 || c.Rst })
	if len(c.msgs) == 0 {
		c.g.TB.Fatalf("vsocktest: %d<->%d reset while waiting for a message", c.HostPort, c.GuestPort)
	}
	m := c.msgs[0]
	c.msgs = c.msgs[1:]
	c.FwdCnt += uint32(len(m.Data))
	if c.AutoCredit && !c.closed && c.FwdCnt-c.sentFwd >= c.BufAlloc/2 {
		c.Send(vsock.OpCreditUpdate, 0, nil)
	}
	return m
}

// WriteMsg sends b as one SEQPACKET message, as Linux does: RW packets of
// at most MaxPacket bytes, each waiting for credit, SeqEOM (and SeqEOR
// with eor) on the last.
func (c *Conn) WriteMsg(b []byte, eor bool) {
	c.g.TB.Helper()
	end := uint32(vsock.SeqEOM)
	if eor {
		end |= vsock.SeqEOR
	}
	for n := 0; ; {
		k := min(len(b)-n, c.MaxPacket, int(c.Credit()))
		if k == 0 && n < len(b) {
			c.g.WaitFor(fmt.Sprintf("credit on %d<->%d (%d of a %d-byte message sent)", c.HostPort, c.GuestPort, n, len(b)),
				func() bool { return c.Credit() > 0 || c.Rst })
			if c.Rst {
				c.g.TB.Fatalf("vsocktest: %d<->%d reset during a message", c.HostPort, c.GuestPort)
			}
			continue
		}
		flags := uint32(0)
		if n+k == len(b) {
			flags = end
		}
		c.Send(vsock.OpRW, flags, b[n:n+k])
		n += k
		if n == len(b) {
			return
		}
	}
}

// Send sends a packet on the connection carrying the guest's credit.
func (c *Conn) Send(op vsock.Op, flags uint32, payload []byte) {
	h := c.g.Header(op, c.GuestPort, c.HostPort)
	h.Type = c.Type
	h.Flags = flags
	h.Len = uint32(len(payload))
	h.BufAlloc, h.FwdCnt = c.BufAlloc, c.FwdCnt
	c.sentFwd = c.FwdCnt
	c.g.Send(h, payload)
	if op == vsock.OpRW {
		c.TxCnt += uint32(len(payload))
	}
}

// Credit is how many bytes the device can take now.
func (c *Conn) Credit() uint32 {
	inFlight := c.TxCnt - c.PeerFwdCnt
	if inFlight > c.PeerBufAlloc {
		return 0
	}
	return c.PeerBufAlloc - inFlight
}

// GuestCredit is how many more bytes the device may send the guest, by
// what the guest last advertised.
func (c *Conn) GuestCredit() uint32 { return c.BufAlloc - (c.RxCnt - c.sentFwd) }

// TryWrite sends as much of b as the device's credit allows without
// waiting, and returns how much that was.
func (c *Conn) TryWrite(b []byte) int {
	n := 0
	for n < len(b) {
		k := min(len(b)-n, c.MaxPacket, int(c.Credit()))
		if k == 0 {
			break
		}
		c.Send(vsock.OpRW, 0, b[n:n+k])
		n += k
	}
	return n
}

// Write sends b, waiting for credit as needed.
func (c *Conn) Write(b []byte) {
	c.g.TB.Helper()
	for n := 0; n < len(b); {
		n += c.TryWrite(b[n:])
		if n < len(b) {
			c.g.WaitFor(fmt.Sprintf("credit on %d<->%d (%d of %d bytes sent)", c.HostPort, c.GuestPort, n, len(b)),
				func() bool { return c.Credit() > 0 || c.Rst })
			if c.Rst {
				c.g.TB.Fatalf("vsocktest: %d<->%d reset during a write", c.HostPort, c.GuestPort)
			}
		}
	}
}

// Buffered is how many received bytes the guest has not read.
func (c *Conn) Buffered() int { return len(c.data) }

// Read reads n bytes, consuming them as they arrive (so that credit
// updates flow), and waits until all have come.
func (c *Conn) Read(n int) []byte {
	c.g.TB.Helper()
	out := make([]byte, 0, n)
	c.g.WaitFor(fmt.Sprintf("%d bytes on %d<->%d", n, c.HostPort, c.GuestPort), func() bool {
		if k := min(len(c.data), n-len(out)); k > 0 {
			out = append(out, c.Consume(k)...)
		}
		return len(out) == n
	})
	return out
}

// Consume takes n buffered bytes, as the guest application reading them.
func (c *Conn) Consume(n int) []byte {
	out := append([]byte(nil), c.data[:n]...)
	c.data = c.data[n:]
	c.FwdCnt += uint32(n)
	if c.AutoCredit && !c.closed && c.FwdCnt-c.sentFwd >= c.BufAlloc/2 {
		c.Send(vsock.OpCreditUpdate, 0, nil)
	}
	return out
}

// ReadUntilShutdown reads until the device's SHUTDOWN(SEND) or RST and
// returns everything read.
func (c *Conn) ReadUntilShutdown() []byte {
	c.g.TB.Helper()
	var out []byte
	c.g.WaitFor(fmt.Sprintf("SHUTDOWN on %d<->%d", c.HostPort, c.GuestPort), func() bool {
		if len(c.data) > 0 {
			out = append(out, c.Consume(len(c.data))...)
		}
		return c.Shut&vsock.ShutdownSend != 0 || c.Rst
	})
	return append(out, c.Consume(len(c.data))...)
}

// WaitRst waits for the device's RST.
func (c *Conn) WaitRst() {
	c.g.TB.Helper()
	c.g.WaitFor(fmt.Sprintf("RST on %d<->%d", c.HostPort, c.GuestPort), func() bool { return c.Rst })
}

// WaitShutdown waits until the device has sent SHUTDOWN with flags.
func (c *Conn) WaitShutdown(flags uint32) {
	c.g.TB.Helper()
	c.g.WaitFor(fmt.Sprintf("SHUTDOWN(%d) on %d<->%d", flags, c.HostPort, c.GuestPort), func() bool {
		return c.Shut&flags == flags || c.Rst
	})
	if c.Shut&flags != flags {
		c.g.TB.Fatalf("vsocktest: %d<->%d reset while waiting for SHUTDOWN(%d)", c.HostPort, c.GuestPort, flags)
	}
}

// Shutdown sends SHUTDOWN with flags.
func (c *Conn) Shutdown(flags uint32) { c.Send(vsock.OpShutdown, flags, nil) }

// Reset sends RST and forgets the connection.
func (c *Conn) Reset() {
	c.Send(vsock.OpRst, 0, nil)
	c.Forget()
}

// CreditUpdate advertises the guest's credit.
func (c *Conn) CreditUpdate() { c.Send(vsock.OpCreditUpdate, 0, nil) }

// CreditRequest asks the device for its credit.
func (c *Conn) CreditRequest() { c.Send(vsock.OpCreditRequest, 0, nil) }

// CountCtl counts the control packets with op received so far.
func (c *Conn) CountCtl(op vsock.Op) int {
	n := 0
	for _, h := range c.Ctl {
		if h.Op == op {
			n++
		}
	}
	return n
}
