package vhufront

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
)

// Mode is how the guest driver learns that the device used buffers.
type Mode string

const (
	// ModeEvent: when a turn finds nothing to do, the driver asks for
	// interrupts (used_event), re-checks the rings and sleeps in poll(2) on
	// the call eventfds, as an interrupt-driven guest does.
	ModeEvent Mode = "event"
	// ModePoll: the driver never asks for interrupts and spins on the used
	// rings, as a polling (DPDK-style) guest does.
	ModePoll Mode = "poll"
)

// Queue indices of a vsock device.
const (
	QueueRX = 0
	QueueTX = 1
)

// Config configures a Guest.
type Config struct {
	// CID is the guest's context id; the back-end's config space must agree.
	CID uint64
	// QueueSize is the size of the RX and TX rings (default 256).
	QueueSize uint16
	// RXBufSize is the payload room of each posted RX buffer (default 4096,
	// as Linux posts; the 44-byte header comes on top, in the same
	// descriptor).
	RXBufSize int
	// BufAlloc is the receive window advertised for each connection
	// (default 256 KiB, Linux's default).
	BufAlloc uint32
	// Mode: event-driven (default) or polling.
	Mode Mode
	// NoEventIdx leaves VIRTIO_F_EVENT_IDX out of the negotiation.
	NoEventIdx bool
	// Regions is the number of memory regions (1 or 2; default 2).
	Regions int
	// Timeout bounds each vhost-user request (default 5 s).
	Timeout time.Duration
	// Dgram asks for FeatureDgram (microvm's datagrams); where the back-end offers it,
	// the datagram rings are set up too (dgram.go).
	Dgram bool
	// Publish is when TX packets become visible to the device (default
	// PublishPacket).
	Publish Publish
}

// Publish is when the driver makes the TX packets it queued visible to the
// device, and so when it may kick.
type Publish string

const (
	// PublishPacket: each packet is published, and the kick decision
	// made, as soon as it is queued, as Linux's virtio-vsock driver does
	// on its fast path (virtio_transport_send_skb_fast_path: add, then
	// virtqueue_kick, per packet) and virtio-net per transmitted packet.
	// A device that re-enables kicks while it still works gets one for
	// each packet queued meanwhile: what kick suppression (seed 002) is
	// about.
	PublishPacket Publish = "packet"
	// PublishTurn: the packets of one turn are published together, one
	// kick decision per turn, as a driver that batches its sends does.
	// The driver then kicks at most once per turn whatever the device
	// does, which hides most of what kick suppression saves.
	PublishTurn Publish = "turn"
)

func (c *Config) setDefaults() {
	if c.QueueSize == 0 {
		c.QueueSize = 256
	}
	if c.RXBufSize == 0 {
		c.RXBufSize = 4096
	}
	if c.BufAlloc == 0 {
		c.BufAlloc = 256 << 10
	}
	if c.Mode == "" {
		c.Mode = ModeEvent
	}
	if c.Publish == "" {
		c.Publish = PublishPacket
	}
	if c.Regions == 0 {
		c.Regions = 2
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
}

// Stats are the driver's counters. Kicks and Irqs are per queue (QueueRX,
// QueueTX): eventfd writes we made, and signals the device made on the
// call eventfds (an eventfd read returns how many).
type Stats struct {
	Kicks, Irqs [2]uint64
	// BusyKicks counts the TX kicks made while the device still held
	// earlier TX packets (it had not returned them all): kicks the device
	// asked for while it was working, which kick suppression (seed 002)
	// exists to avoid. The others found the device done with the ring.
	BusyKicks                      uint64
	RxPackets, TxPackets           uint64
	RxBytes, TxBytes               uint64 // RW payload bytes
	CreditUpdatesSent, CreditReqs  uint64 // CREDIT_UPDATE we sent; CREDIT_REQUEST we had to send
	CreditUpdatesRcvd, RstReceived uint64
	// Sleeps counts the event-mode driver's sleeps in poll(2); SleepTimeouts
	// those that ended without an interrupt.
	Sleeps, SleepTimeouts uint64
}

// Guest plays a virtio-vsock guest driver against a vhost-user back-end:
// it owns guest memory and the RX and TX rings, keeps RX buffers posted,
// and runs stream connections with credit accounting (virtio 1.2, 5.10.6).
// A Guest is driven by one goroutine: Run, and the Conn methods called
// from inside Run's callbacks or between Runs.
type Guest struct {
	cfg    Config
	client *Client
	mem    *Memory
	rx, tx *Ring
	kick   [2]*eventfd.EventFD
	call   [2]*eventfd.EventFD

	rxBuf    []uint64 // RX descriptor i's buffer (header then payload)
	rxPosted []bool

	txSlot   []uint64 // TX slot s: header at txSlot[s], payload at +txHdrRoom; descriptors 2s, 2s+1
	txFree   []uint16
	txBusy   []bool
	ctlQueue []Hdr // control packets waiting for a TX slot

	conns     map[connKey]*Conn
	listeners map[uint32]func(*Conn)
	nextPort  uint32

	dg *dgramRings // nil unless datagrams were negotiated

	stats Stats
	err   error
	hb    [HdrSize]byte
	pfds  [2]unix.PollFd
}

type connKey struct{ local, peer uint32 }

const (
	txHdrRoom   = 64
	maxCtlQueue = 4096
)

// ErrTimeout is returned by Run when its deadline passes first.
var ErrTimeout = errors.New("vhufront: timed out")

// Start connects to the back-end at sock, negotiates, shares guest memory,
// posts every RX buffer and starts the RX and TX rings.
func Start(sock string, cfg Config) (*Guest, error) {
	cfg.setDefaults()
	if cfg.RXBufSize < 1 || cfg.RXBufSize > MaxPayload {
		return nil, fmt.Errorf("vhufront: RX buffer of %d bytes: want 1..%d", cfg.RXBufSize, MaxPayload)
	}
	if cfg.Publish != PublishPacket && cfg.Publish != PublishTurn {
		return nil, fmt.Errorf("vhufront: publish %q: want %q or %q", cfg.Publish, PublishPacket, PublishTurn)
	}
	if cfg.QueueSize < 2 || cfg.QueueSize&(cfg.QueueSize-1) != 0 {
		return nil, fmt.Errorf("vhufront: queue size %d: want a power of 2, at least 2", cfg.QueueSize)
	}
	g := &Guest{cfg: cfg, conns: map[connKey]*Conn{}, listeners: map[uint32]func(*Conn){}, nextPort: 49152}
	ok := false
	defer func() {
		if !ok {
			g.Close()
		}
	}()
	var err error
	if g.client, err = Dial(sock, cfg.Timeout); err != nil {
		return nil, err
	}
	var want uint64 = FeatureEventIdx
	if cfg.NoEventIdx {
		want = 0
	}
	if cfg.Dgram {
		want |= FeatureDgram
	}
	if err := g.client.Negotiate(want); err != nil {
		return nil, err
	}
	if cid, ok, err := g.client.GuestCID(); err != nil {
		return nil, err
	} else if ok && cid != cfg.CID {
		return nil, fmt.Errorf("vhufront: the back-end's guest CID is %d, not %d", cid, cfg.CID)
	}
	n := uint64(cfg.QueueSize)
	slots := n / 2
	ringBytes := 2 * (16*n + 6 + 2*n + 6 + 8*n + 64)
	size := ringBytes + n*uint64(HdrSize+cfg.RXBufSize+64) + slots*uint64(txHdrRoom+MaxPayload+64)
	if g.client.Features&FeatureDgram != 0 {
		size += dgramMemory(cfg)
	}
	// Two regions split the memory in halves; leave room for either half
	// to hold the larger of the buffer areas.
	if g.mem, err = NewMemory(2*size+1<<20, cfg.Regions); err != nil {
		return nil, err
	}
	a := newAllocator(g.mem)
	eventIdx := g.client.Features&FeatureEventIdx != 0
	if g.rx, err = newRing(g.mem.Memory, a, cfg.QueueSize, eventIdx); err != nil {
		return nil, err
	}
	if g.tx, err = newRing(g.mem.Memory, a, cfg.QueueSize, eventIdx); err != nil {
		return nil, err
	}
	for i := range cfg.QueueSize {
		addr, err := a.alloc(uint64(HdrSize+cfg.RXBufSize), 64)
		if err != nil {
			return nil, err
		}
		if err := g.rx.SetDesc(i, addr, uint32(HdrSize+cfg.RXBufSize), descWrite, 0); err != nil {
			return nil, err
		}
		g.rxBuf = append(g.rxBuf, addr)
		g.rxPosted = append(g.rxPosted, true)
		if err := g.rx.Offer(i); err != nil {
			return nil, err
		}
	}
	if _, err := g.rx.Publish(); err != nil {
		return nil, err
	}
	for s := range uint16(slots) {
		addr, err := a.alloc(txHdrRoom+MaxPayload, 64)
		if err != nil {
			return nil, err
		}
		if err := g.tx.SetDesc(2*s+1, addr+txHdrRoom, 0, 0, 0); err != nil {
			return nil, err
		}
		g.txSlot = append(g.txSlot, addr)
		g.txBusy = append(g.txBusy, false)
	}
	for s := int(slots) - 1; s >= 0; s-- {
		g.txFree = append(g.txFree, uint16(s))
	}
	if g.client.Features&FeatureDgram != 0 {
		if err := g.setupDgram(a); err != nil {
			return nil, err
		}
	}
	for q := range 2 {
		if g.kick[q], err = eventfd.NewNonblocking(); err != nil {
			return nil, err
		}
		if g.call[q], err = eventfd.NewNonblocking(); err != nil {
			return nil, err
		}
	}
	if err := g.client.SetMemTable(g.mem); err != nil {
		return nil, err
	}
	// The back-end's event queue, if it has one, is QEMU's business and
	// is never started (as with QEMU's vhost-user-vsock-device).
	for q, r := range []*Ring{g.rx, g.tx} {
		if err := g.client.StartRing(uint32(q), r, g.mem, g.kick[q].FD(), g.call[q].FD()); err != nil {
			return nil, err
		}
	}
	if g.dg != nil {
		if err := g.startDgram(); err != nil {
			return nil, err
		}
	}
	if cfg.Mode == ModePoll {
		_ = g.rx.DisableInterrupts()
		_ = g.tx.DisableInterrupts()
	}
	g.pfds[0] = unix.PollFd{Fd: int32(g.call[0].FD()), Events: unix.POLLIN}
	g.pfds[1] = unix.PollFd{Fd: int32(g.call[1].FD()), Events: unix.POLLIN}
	ok = true
	return g, nil
}

// Features are the negotiated feature bits.
func (g *Guest) Features() uint64 { return g.client.Features }

// Close stops the rings (GET_VRING_BASE, which resets the device and so
// every connection) and releases everything. It reports a back-end that did
// not answer.
func (g *Guest) Close() error {
	var errs []error
	if g.client != nil {
		if g.rx != nil && g.tx != nil && g.err == nil {
			for q := range 2 {
				if _, err := g.client.StopRing(uint32(q)); err != nil {
					errs = append(errs, err)
					break
				}
			}
		}
		errs = append(errs, g.closeDgram(g.err == nil)...)
		errs = append(errs, g.client.Close())
		g.client = nil
	}
	for q := range 2 {
		for _, e := range []*eventfd.EventFD{g.kick[q], g.call[q]} {
			if e != nil {
				errs = append(errs, e.Close())
			}
		}
	}
	if g.mem != nil {
		errs = append(errs, g.mem.Close())
		g.mem = nil
	}
	return errors.Join(errs...)
}

// Stats returns the counters, first counting any interrupts signalled
// since the driver last looked.
func (g *Guest) Stats() Stats {
	g.countIrqs()
	return g.stats
}

// Err is the error that stopped the driver, if any.
func (g *Guest) Err() error { return g.err }

func (g *Guest) fail(err error) {
	if g.err == nil {
		g.err = err
	}
}

func (g *Guest) failf(format string, args ...any) {
	g.fail(fmt.Errorf("vhufront: "+format, args...))
}

// Run drives the rings until done reports true, the deadline passes
// (ErrTimeout) or the device misbehaves. Each turn reaps used entries
// (dispatching received packets to their connections), calls work (the
// application, which may send and reports whether it did anything),
// publishes and kicks; a turn that did nothing waits for the device,
// never past the deadline.
func (g *Guest) Run(deadline time.Time, work func() bool, done func() bool) error {
	for {
		if g.err != nil {
			return g.err
		}
		progress := g.reap()
		if work != nil && work() {
			progress = true
		}
		g.flush()
		if g.err != nil {
			return g.err
		}
		if done() {
			return nil
		}
		if progress {
			continue
		}
		now := time.Now()
		if !now.Before(deadline) {
			return ErrTimeout
		}
		g.wait(min(deadline.Sub(now), 10*time.Millisecond))
	}
}

// wait sleeps until the device uses a buffer or d passes.
func (g *Guest) wait(d time.Duration) {
	if g.cfg.Mode == ModePoll {
		end := time.Now().Add(d)
		for i := 0; ; i++ {
			rx, err1 := g.rx.HasUsed()
			tx, err2 := g.tx.HasUsed()
			if err := errors.Join(err1, err2); err != nil {
				g.fail(err)
				return
			}
			if rx || tx || len(g.ctlQueue) > 0 {
				return
			}
			if i%256 == 255 && time.Now().After(end) {
				return
			}
		}
	}
	pending := false
	for _, r := range []*Ring{g.rx, g.tx} {
		p, err := r.EnableInterrupts()
		if err != nil {
			g.fail(err)
			return
		}
		pending = pending || p
	}
	if !pending {
		ms := int(max(d.Milliseconds(), 1))
		g.stats.Sleeps++
		for {
			g.pfds[0].Revents, g.pfds[1].Revents = 0, 0
			n, err := unix.Poll(g.pfds[:], ms)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				g.failf("poll on the call eventfds: %v", err)
			}
			if n == 0 {
				g.stats.SleepTimeouts++
			}
			break
		}
	}
	g.countIrqs()
	_ = g.rx.DisableInterrupts()
	_ = g.tx.DisableInterrupts()
}

// countIrqs reads the call eventfds: each holds how many times the device
// signalled it since the last read.
func (g *Guest) countIrqs() {
	for q := range 2 {
		if g.call[q] == nil {
			continue
		}
		n, err := g.call[q].Wait()
		if err != nil {
			g.fail(err)
		}
		g.stats.Irqs[q] += n
	}
}

// reap takes the used entries of both rings: TX slots come back, RX
// packets are dispatched and their buffers offered again.
func (g *Guest) reap() bool {
	progress := false
	for {
		id, _, ok, err := g.tx.NextUsed()
		if err != nil {
			g.fail(err)
			return progress
		}
		if !ok {
			break
		}
		progress = true
		s := id / 2
		if id%2 != 0 || int(s) >= len(g.txSlot) || !g.txBusy[s] {
			g.failf("device returned TX descriptor %d, which is not the head of a buffer it holds", id)
			return progress
		}
		g.txBusy[s] = false
		g.txFree = append(g.txFree, s)
	}
	for g.err == nil {
		id, n, ok, err := g.rx.NextUsed()
		if err != nil {
			g.fail(err)
			return progress
		}
		if !ok {
			break
		}
		progress = true
		if !g.rxPosted[id] {
			g.failf("device returned RX descriptor %d, which it does not hold", id)
			return progress
		}
		g.rxPosted[id] = false
		opened := g.receive(id, n)
		g.rxPosted[id] = true
		if err := g.rx.Offer(id); err != nil {
			g.fail(err)
		}
		if opened {
			// A connection was just established: the application
			// (Run's caller) sets its OnData before any more packets
			// are dispatched, which with our RESPONSE published at
			// once (PublishPacket) may already include its data.
			break
		}
	}
	return progress
}

// flush sends queued control packets, then publishes both rings and kicks
// where the device asked for it.
func (g *Guest) flush() {
	for len(g.ctlQueue) > 0 && len(g.txFree) > 0 {
		h := g.ctlQueue[0]
		g.ctlQueue = g.ctlQueue[1:]
		g.post(&h, nil)
	}
	if len(g.ctlQueue) == 0 {
		g.ctlQueue = nil
	}
	for q := range 2 {
		g.publish(q)
	}
}

// publish makes queue q's offered chains visible and kicks if the device
// asked for it.
func (g *Guest) publish(q int) {
	r := g.rx
	if q == QueueTX {
		r = g.tx
	}
	if !r.Pending() || g.err != nil {
		return
	}
	var unused uint16
	if q == QueueTX {
		var err error
		if unused, err = r.Unused(); err != nil {
			g.fail(err)
			return
		}
	}
	kick, err := r.Publish()
	if err != nil {
		g.fail(err)
		return
	}
	if kick {
		if unused > 0 {
			g.stats.BusyKicks++
		}
		if err := g.kick[q].Signal(); err != nil {
			g.fail(err)
			return
		}
		g.stats.Kicks[q]++
	}
}

// receive handles the packet the device put in RX buffer id (n bytes). It
// reports whether a connection was established by it (accepted, or
// answered).
func (g *Guest) receive(id uint16, n uint32) (opened bool) {
	if n < HdrSize || n > uint32(HdrSize+g.cfg.RXBufSize) {
		g.failf("device used RX buffer %d with length %d (buffer of %d)", id, n, HdrSize+g.cfg.RXBufSize)
		return
	}
	if err := g.mem.Read(g.rxBuf[id], g.hb[:]); err != nil {
		g.fail(err)
		return
	}
	var h Hdr
	h.decode(g.hb[:])
	if h.Len != n-HdrSize {
		g.failf("device packet %v in a used buffer of %d bytes", h, n)
		return
	}
	if h.SrcCID != HostCID || h.DstCID != g.cfg.CID || h.Type != typeStream {
		g.failf("device packet %v: want %d -> %d, stream", h, HostCID, g.cfg.CID)
		return
	}
	g.stats.RxPackets++
	key := connKey{local: h.DstPort, peer: h.SrcPort}
	c := g.conns[key]
	if c == nil {
		switch h.Op {
		case OpRequest:
			if accept := g.listeners[h.DstPort]; accept != nil {
				c = &Conn{g: g, Local: h.DstPort, Peer: h.SrcPort, state: connEstablished}
				c.creditFrom(&h)
				g.conns[key] = c
				c.control(OpResponse, 0)
				accept(c)
				return true
			}
		case OpRst:
			return // never answer RST with RST
		}
		g.queueCtl(Hdr{SrcPort: h.DstPort, DstPort: h.SrcPort, Op: OpRst})
		return
	}
	c.creditFrom(&h)
	switch h.Op {
	case OpResponse:
		if c.state != connConnecting {
			g.failf("device sent %v on an established connection", h)
			return
		}
		c.state = connEstablished
		return true
	case OpRW:
		if c.state != connEstablished {
			g.failf("device sent %v before the connection was established", h)
			return
		}
		if c.PeerShut&ShutSend != 0 {
			g.failf("device sent %v after SHUTDOWN(SEND)", h)
			return
		}
		// Credit: what the device sent since the fwd_cnt we last
		// advertised may not exceed our window.
		if c.rxCnt+h.Len-c.advFwd > g.cfg.BufAlloc {
			g.failf("device overran the credit of %d<->%d: %d bytes since fwd_cnt %d, window %d",
				c.Local, c.Peer, c.rxCnt+h.Len-c.advFwd, c.advFwd, g.cfg.BufAlloc)
			return
		}
		c.rxCnt += h.Len
		g.stats.RxBytes += uint64(h.Len)
		if h.Len > 0 && c.OnData != nil {
			p, err := g.mem.Slice(g.rxBuf[id]+HdrSize, uint64(h.Len))
			if err != nil {
				g.fail(err)
				return
			}
			c.OnData(p)
		}
		// The application consumed the bytes: forward count moves, and
		// when our advertised free space gets low, say so (Linux's rule:
		// less than one maximum packet left).
		c.fwdCnt = c.rxCnt
		if g.cfg.BufAlloc-(c.fwdCnt-c.advFwd) < min(MaxPayload, g.cfg.BufAlloc/2) {
			c.control(OpCreditUpdate, 0)
			g.stats.CreditUpdatesSent++
		}
	case OpCreditUpdate:
		g.stats.CreditUpdatesRcvd++
	case OpCreditRequest:
		c.control(OpCreditUpdate, 0)
		g.stats.CreditUpdatesSent++
	case OpShutdown:
		c.PeerShut |= h.Flags & ShutBoth
	case OpRst:
		g.stats.RstReceived++
		c.state = connClosed
		c.WasReset = true
		delete(g.conns, key)
	case OpRequest:
		g.failf("device sent %v for an existing connection", h)
	default:
		g.failf("device sent %v: unknown operation", h)
	}
	return false
}

// queueCtl sends a control packet now if a TX slot is free, else after the
// next ones come back.
func (g *Guest) queueCtl(h Hdr) {
	if len(g.txFree) > 0 && len(g.ctlQueue) == 0 {
		g.post(&h, nil)
		return
	}
	if len(g.ctlQueue) >= maxCtlQueue {
		g.failf("%d control packets wait for TX buffers", len(g.ctlQueue))
		return
	}
	g.ctlQueue = append(g.ctlQueue, h)
}

// post fills a free TX slot with h and payload and offers it (one
// descriptor for the header, a second for the payload, as Linux's driver
// lays packets out). The caller checked a slot is free.
func (g *Guest) post(h *Hdr, payload []byte) {
	s := g.txFree[len(g.txFree)-1]
	g.txFree = g.txFree[:len(g.txFree)-1]
	g.txBusy[s] = true
	h.SrcCID, h.DstCID, h.Type, h.Len = g.cfg.CID, HostCID, typeStream, uint32(len(payload))
	if h.BufAlloc == 0 {
		h.BufAlloc = g.cfg.BufAlloc
	}
	h.encode(g.hb[:])
	addr := g.txSlot[s]
	err := g.mem.Write(addr, g.hb[:])
	if len(payload) > 0 {
		err = errors.Join(err, g.mem.Write(addr+txHdrRoom, payload),
			g.tx.SetDescLen(2*s+1, uint32(len(payload))),
			g.tx.SetDesc(2*s, addr, HdrSize, descNext, 2*s+1))
	} else {
		err = errors.Join(err, g.tx.SetDesc(2*s, addr, HdrSize, 0, 0))
	}
	if err == nil {
		err = g.tx.Offer(2 * s)
	}
	if err != nil {
		g.fail(err)
		return
	}
	g.stats.TxPackets++
	g.stats.TxBytes += uint64(len(payload))
	if g.cfg.Publish == PublishPacket {
		g.publish(QueueTX)
	}
}

// Listen accepts connections to port: accept is called (from Run) with
// each new established connection, whose OnData it should set.
func (g *Guest) Listen(port uint32, accept func(*Conn)) { g.listeners[port] = accept }

// Unlisten stops accepting on port.
func (g *Guest) Unlisten(port uint32) { delete(g.listeners, port) }

// Connect sends a connection request to host port port; the connection is
// Established once the device answers (during Run).
func (g *Guest) Connect(port uint32) *Conn {
	for g.conns[connKey{g.nextPort, port}] != nil {
		g.nextPort++
	}
	c := &Conn{g: g, Local: g.nextPort, Peer: port, state: connConnecting}
	g.nextPort++
	if g.nextPort == 0 {
		g.nextPort = 49152
	}
	g.conns[connKey{c.Local, c.Peer}] = c
	c.control(OpRequest, 0)
	return c
}

// Conns is the number of connections in the table.
func (g *Guest) Conns() int { return len(g.conns) }

// CtlQueued is how many control packets wait for a TX slot. A driver
// closing many connections at once keeps it well below the queue's
// bound (4096, past which the driver fails).
func (g *Guest) CtlQueued() int { return len(g.ctlQueue) }

type connState int

const (
	connConnecting connState = iota
	connEstablished
	connClosed
)

// Conn is one guest stream connection.
type Conn struct {
	g           *Guest
	Local, Peer uint32 // guest port, host port
	state       connState
	// OnData receives the payload of each RW packet, a view of the RX
	// buffer valid only during the call.
	OnData func(p []byte)
	// PeerShut are the SHUTDOWN flags the device sent; WasReset is set by
	// its RST.
	PeerShut uint32
	WasReset bool

	// Our receive side: bytes received, consumed, and the fwd_cnt we last
	// told the device.
	rxCnt, fwdCnt, advFwd uint32
	// Our send side: the device's window and counters.
	peerBufAlloc, peerFwdCnt, txCnt uint32
	creditWait                      time.Time // since when Send found no credit
	shutSent                        bool
}

// Established reports whether the handshake completed and no RST came.
func (c *Conn) Established() bool { return c.state == connEstablished }

// Closed reports whether the connection is gone (RST received or sent).
func (c *Conn) Closed() bool { return c.state == connClosed }

func (c *Conn) creditFrom(h *Hdr) {
	c.peerBufAlloc, c.peerFwdCnt = h.BufAlloc, h.FwdCnt
}

// Credit is how many bytes the device can take now: its buffer less what
// is in flight (u32 wrapping arithmetic, 5.10.6.3).
func (c *Conn) Credit() uint32 {
	inFlight := c.txCnt - c.peerFwdCnt
	if inFlight > c.peerBufAlloc {
		return 0
	}
	return c.peerBufAlloc - inFlight
}

// control sends a control packet carrying our credit.
func (c *Conn) control(op uint16, flags uint32) {
	c.g.queueCtl(Hdr{SrcPort: c.Local, DstPort: c.Peer, Op: op, Flags: flags, BufAlloc: c.g.cfg.BufAlloc, FwdCnt: c.fwdCnt})
	c.advFwd = c.fwdCnt
}

// creditRequestAfter is how long Send waits without credit before asking
// for it with CREDIT_REQUEST (counted: a device should not need it).
const creditRequestAfter = 200 * time.Millisecond

// Send queues as much of p as the device's credit and the free TX buffers
// allow, in packets of at most MaxPayload bytes, and returns how much.
func (c *Conn) Send(p []byte) int {
	if c.state != connEstablished || c.shutSent {
		return 0
	}
	g := c.g
	sent := 0
	for sent < len(p) && len(g.txFree) > 0 && len(g.ctlQueue) == 0 && g.err == nil {
		n := min(len(p)-sent, MaxPayload, int(c.Credit()))
		if n == 0 {
			break
		}
		h := Hdr{SrcPort: c.Local, DstPort: c.Peer, Op: OpRW, BufAlloc: g.cfg.BufAlloc, FwdCnt: c.fwdCnt}
		g.post(&h, p[sent:sent+n])
		c.advFwd = c.fwdCnt
		c.txCnt += uint32(n)
		sent += n
	}
	if sent == 0 && len(p) > 0 && c.Credit() == 0 {
		now := time.Now()
		switch {
		case c.creditWait.IsZero():
			c.creditWait = now
		case now.Sub(c.creditWait) > creditRequestAfter:
			c.control(OpCreditRequest, 0)
			g.stats.CreditReqs++
			c.creditWait = now
		}
	} else if sent > 0 {
		c.creditWait = time.Time{}
	}
	return sent
}

// Shutdown tells the device we will send (ShutSend) and/or receive
// (ShutRcv) no more.
func (c *Conn) Shutdown(flags uint32) {
	if c.state == connClosed {
		return
	}
	c.control(OpShutdown, flags)
	if flags&ShutSend != 0 {
		c.shutSent = true
	}
}

// Reset sends RST and forgets the connection.
func (c *Conn) Reset() {
	if c.state == connClosed {
		return
	}
	c.control(OpRst, 0)
	c.state = connClosed
	delete(c.g.conns, connKey{c.Local, c.Peer})
}
