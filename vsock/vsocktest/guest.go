// Package vsocktest plays a virtio-vsock guest driver over plain memory, so
// the vsock device is tested, fuzzed and benchmarked in-process without KVM:
// it activates a vsock.Device on virtiotest queues, posts RX buffers, sends
// TX packets, kicks, reaps used entries and decodes their headers, and keeps
// the guest side of stream connections (credit accounting included). The
// host side is a scriptable Dialer and socketpair helpers.
//
// A Guest is driven by one goroutine, the test's: its methods call
// testing.TB.Fatal on a broken invariant or an expired wait.
//
// EVENT_IDX: the device reads used_event with a plain load, so a driver in
// the same process that moved it while the device runs would be a data race
// as far as the race detector is concerned (on real hardware it is the
// protocol). The Guest therefore leaves used_event at 0 and polls the used
// rings (interrupts only shorten its waits); it does honour avail_event,
// which the device publishes atomically, so the device's kick suppression is
// exercised for real.
package vsocktest

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
)

// Defaults for Options.
const (
	DefaultCID      = 3
	DefaultRxBufLen = vsock.HeaderSize + 4096
	DefaultMemSize  = 4 << 20
	DefaultTimeout  = 10 * time.Second
	// txSlotLen is the guest memory reserved per TX packet in flight: a
	// header and more than the largest payload, for malformed packets.
	txSlotLen = vsock.HeaderSize + vsock.MaxPacketPayload + 4096
	txSlots   = 16
)

// Options configure a Guest.
type Options struct {
	CID       uint64 // must match the device's; default DefaultCID
	QueueSize uint16 // default vsock.DefaultQueueSize
	EventIdx  bool   // negotiate VIRTIO_F_EVENT_IDX
	// Indirect negotiates VIRTIO_F_INDIRECT_DESC and sends TX packets
	// through indirect tables.
	Indirect bool
	// RxBufLen is the size of each RX buffer, header included (default
	// DefaultRxBufLen).
	RxBufLen uint32
	// RxSplit and TxSplit are how many descriptors each RX buffer and TX
	// packet is split across (1..3, default 1); the cuts fall inside the
	// header and inside the payload.
	RxSplit, TxSplit int
	// RxBuffers is how many RX buffers are posted at activation: 0 as many
	// as the queue holds, negative none.
	RxBuffers int
	MemSize   uint64        // default DefaultMemSize
	Timeout   time.Duration // bound on every wait; default DefaultTimeout
	// NoEventQueue activates without the event queue (as vhost-user may).
	NoEventQueue bool
	// SharedInterrupt activates as virtio-mmio does: one interrupt for
	// every queue, and the guest looks at every queue when it comes
	// (virtio.Activation.SharedInterrupt). UnannouncedTX checks that
	// every TX completion was followed by an interrupt that covers it.
	SharedInterrupt bool
	// InterruptsOnly makes WaitFor look at the rings only after an
	// interrupt, as a driver that sleeps does: a device that publishes
	// without interrupting stalls it (other calls, Sync and Within
	// among them, still poll).
	InterruptsOnly bool
	// EventBuffers is how many event buffers are posted at activation: 0
	// DefaultEventBuffers (as Linux), negative none (event.go).
	EventBuffers int
	// GuestBuf is the receive buffer new connections advertise (default
	// DefaultGuestBuf).
	GuestBuf uint32
	// Dgram negotiates vsock.FeatureDgram (the device must offer it)
	// and drives the datagram queues (dgram.go).
	Dgram bool
	// DgramRxBuffers is how many datagram RX buffers are posted at
	// activation: 0 as many as the queue holds, negative none.
	DgramRxBuffers int
	// Seqpacket negotiates vsock.FeatureSeqpacket (when the device
	// offers it).
	Seqpacket bool
	// Transport, when set, activates and resets the device instead of the
	// Guest calling Device.Activate and Device.Reset itself (transport.go).
	Transport Transport
	// NewMemory, when set, provides the guest memory of each activation
	// instead of a fresh slice of MemSize bytes.
	NewMemory func(tb testing.TB) *virtiotest.Memory
}

// Transport stands between a Guest and its device, as virtio-mmio or a
// vhost-user front-end does in a real VMM.
type Transport interface {
	// Activate brings the device up on the guest's queues: a.Features are
	// the features to negotiate, a.Queues[i].Config() each queue's
	// addresses and a.Queues[i].Kick the eventfd the guest signals to
	// kick it (nil entries: queues the device does not get). It returns
	// the eventfds the guest must signal instead, by queue (shorter, or
	// nil entries: keep the guest's own).
	Activate(g *Guest, a virtio.Activation) (kicks []*eventfd.EventFD, err error)
	// Reset takes the device down (its workers have stopped when it
	// returns).
	Reset(g *Guest)
}

func (o *Options) defaults() {
	if o.CID == 0 {
		o.CID = DefaultCID
	}
	if o.QueueSize == 0 {
		o.QueueSize = vsock.DefaultQueueSize
	}
	if o.RxBufLen == 0 {
		o.RxBufLen = DefaultRxBufLen
	}
	o.RxSplit = min(max(o.RxSplit, 1), 3)
	o.TxSplit = min(max(o.TxSplit, 1), 3)
	if o.MemSize == 0 {
		o.MemSize = DefaultMemSize
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.GuestBuf == 0 {
		o.GuestBuf = DefaultGuestBuf
	}
	if o.Dgram && o.MemSize == DefaultMemSize {
		o.MemSize = 2 * DefaultMemSize // room for the datagram queues' buffers
	}
}

// Packet is a packet the device sent to the guest.
type Packet struct {
	Hdr  vsock.Header
	Data []byte
}

func (p Packet) String() string { return p.Hdr.String() }

// rxBuf is a posted RX buffer.
type rxBuf struct {
	addr uint64
	size uint32
}

// connKey identifies a guest connection: host port, guest port.
type connKey struct{ host, guest uint32 }

// Guest is the guest driver of one vsock device.
type Guest struct {
	TB   testing.TB
	Dev  *vsock.Device
	Opts Options
	Mem  *virtiotest.Memory

	// The driver side of the queues and their kick eventfds, for tests
	// that craft bad rings. Replaced by each activation.
	RX, TX, Event             *virtiotest.Queue
	RXKick, TXKick, EventKick *eventfd.EventFD
	rxIrqs, txIrqs            atomic.Uint64
	// txAnnounced is the TX used index the last interrupt covering the
	// TX queue saw (the TX queue's own, or any with SharedInterrupt).
	txAnnounceMu                 sync.Mutex
	txAnnounced                  uint16
	irq                          chan struct{}
	active                       bool
	failMu                       sync.Mutex
	fails                        []error
	rxBufs                       map[uint16]rxBuf // posted RX buffers by head
	rxSpare                      []uint64         // RX buffers not posted
	txSlot                       map[uint16]int   // TX slot in flight by head
	txFree                       []int            // free TX slots
	txAddr                       []uint64
	pending                      []Packet // received, not for a registered connection
	conns                        map[connKey]*Conn
	tick                         *time.Timer
	received, sent, rxBytesTotal uint64

	// The datagram queues (Opts.Dgram), nil without.
	DRX, DTX         *virtiotest.Queue
	DRXKick, DTXKick *eventfd.EventFD
	dg               dgramDriver
	ev               eventDriver

	ownKicks []*eventfd.EventFD // the kick eventfds this Guest made (closed by Reset)
	// holdTX: TX chains are made available without a kick (HoldTX).
	holdTX bool

	// AutoRepost reposts each reaped RX buffer at once (default true).
	AutoRepost bool
	// AcceptEmptyRX takes an RX buffer the device returned with nothing
	// written (used length 0) as Linux does: dropped (and reposted), and
	// counted (EmptyRX). Without it such a buffer fails the test. A
	// quiesce returns buffers it cannot put back so.
	AcceptEmptyRX bool
	emptyRX       int
	// Observe, when set, sees every packet the device sends on the RX
	// queue (after the checks above, before it is routed to a
	// connection or the pending list): for checkers of the whole stream.
	Observe func(Packet)
	// Activation is what the last Activate handed the device.
	Activation virtio.Activation
}

// New returns a guest for dev and activates the device. Reset (or the test's
// end) deactivates it.
func New(tb testing.TB, dev *vsock.Device, o Options) *Guest {
	tb.Helper()
	o.defaults()
	g := &Guest{
		TB: tb, Dev: dev, Opts: o,
		irq:        make(chan struct{}, 1),
		AutoRepost: true,
		tick:       time.NewTimer(time.Hour),
	}
	tb.Cleanup(func() {
		if g.active {
			g.Reset()
		}
	})
	g.Activate()
	return g
}

// Features are the feature bits the guest negotiates.
func (g *Guest) Features() uint64 {
	f := uint64(virtio.FeatureVersion1)
	if g.Opts.EventIdx {
		f |= virtio.FeatureEventIdx
	}
	if g.Opts.Indirect {
		f |= virtio.FeatureIndirectDesc
	}
	if g.Opts.Dgram {
		f |= vsock.FeatureDgram
	}
	if g.Opts.Seqpacket {
		f |= g.Dev.Features() & vsock.FeatureSeqpacket
	}
	return f
}

// Activate builds fresh guest memory and queues, activates the device on
// them and posts RX buffers.
func (g *Guest) Activate() {
	tb := g.TB
	tb.Helper()
	if g.active {
		tb.Fatal("vsocktest: Activate while active")
	}
	if g.Opts.NewMemory != nil {
		g.Mem = g.Opts.NewMemory(tb)
	} else {
		g.Mem = virtiotest.NewMemory(tb, g.Opts.MemSize)
	}
	g.txAddr, g.rxSpare = g.txAddr[:0], g.rxSpare[:0]
	for i := 0; i < txSlots; i++ {
		g.txAddr = append(g.txAddr, g.Mem.Alloc(txSlotLen, 64))
	}
	n := g.Opts.QueueSize
	// The driver-side queues never write used_event (see the package doc).
	g.RX = virtiotest.NewQueue(g.Mem, n, false)
	g.TX = virtiotest.NewQueue(g.Mem, n, false)
	g.Event = virtiotest.NewQueue(g.Mem, n, false)
	var err error
	for _, p := range []**eventfd.EventFD{&g.RXKick, &g.TXKick, &g.EventKick} {
		if *p, err = eventfd.NewNonblocking(); err != nil {
			tb.Fatal(err)
		}
	}
	aq := func(q *virtiotest.Queue, kick *eventfd.EventFD, ctr *atomic.Uint64) *virtio.ActiveQueue {
		seesTX := q == g.TX || g.Opts.SharedInterrupt
		if err := q.Cfg.Validate(g.Mem.Memory, n); err != nil {
			tb.Fatalf("vsocktest: queue config: %v", err)
		}
		return &virtio.ActiveQueue{
			Queue: virtio.NewQueue(g.Mem.Memory, q.Cfg, g.Opts.EventIdx, g.Opts.Indirect),
			Kick:  kick,
			Interrupt: func() {
				ctr.Add(1)
				if seesTX {
					g.noteTXAnnounced()
				}
				select {
				case g.irq <- struct{}{}:
				default:
				}
			},
		}
	}
	var evIrqs atomic.Uint64
	qs := []*virtio.ActiveQueue{aq(g.RX, g.RXKick, &g.rxIrqs), aq(g.TX, g.TXKick, &g.txIrqs)}
	if !g.Opts.NoEventQueue {
		qs = append(qs, aq(g.Event, g.EventKick, &evIrqs))
	}
	if g.Opts.Dgram {
		if len(qs) == 2 {
			qs = append(qs, nil) // the event queue's place
		}
		qs = append(qs, g.activateDgram(aq)...)
	}
	g.failMu.Lock()
	g.fails = nil
	g.failMu.Unlock()
	g.rxBufs = map[uint16]rxBuf{}
	g.txSlot = map[uint16]int{}
	g.txFree = g.txFree[:0]
	for i := len(g.txAddr) - 1; i >= 0; i-- {
		g.txFree = append(g.txFree, i)
	}
	g.pending = nil
	g.conns = map[connKey]*Conn{}
	g.txAnnounceMu.Lock()
	g.txAnnounced = 0
	g.txAnnounceMu.Unlock()
	g.Activation = virtio.Activation{Mem: g.Mem.Memory, Features: g.Features(), Queues: qs, Fail: g.fail,
		SharedInterrupt: g.Opts.SharedInterrupt}
	g.ownKicks = []*eventfd.EventFD{g.RXKick, g.TXKick, g.EventKick, g.DRXKick, g.DTXKick}
	if g.Opts.Transport != nil {
		kicks, err := g.Opts.Transport.Activate(g, g.Activation)
		if err != nil {
			tb.Fatalf("vsocktest: transport: activate: %v", err)
		}
		for i, k := range kicks {
			if k == nil {
				continue
			}
			switch i {
			case vsock.QueueRX:
				g.RXKick = k
			case vsock.QueueTX:
				g.TXKick = k
			case vsock.QueueEvent:
				g.EventKick = k
			case vsock.QueueDgramRX:
				g.DRXKick = k
			case vsock.QueueDgramTX:
				g.DTXKick = k
			}
		}
	} else if err := g.Dev.Activate(g.Activation); err != nil {
		tb.Fatalf("vsocktest: Activate: %v", err)
	}
	g.active = true
	nbuf := int(n) / g.Opts.RxSplit
	if g.Opts.RxBuffers > 0 {
		nbuf = min(nbuf, g.Opts.RxBuffers)
	} else if g.Opts.RxBuffers < 0 {
		nbuf = 0
	}
	g.PostRX(nbuf)
	g.postEventsInitial()
	if g.Opts.Dgram {
		g.postDgramInitial()
	}
}

// Reset resets the device and forgets the activation's queues and
// connections. The kick eventfds are closed after the device's workers have
// stopped.
func (g *Guest) Reset() {
	if g.Opts.Transport != nil {
		g.Opts.Transport.Reset(g)
	} else {
		g.Dev.Reset()
	}
	g.Detach()
}

// Detach forgets the activation's queues and connections without touching
// the device: for a transport that lost the device by itself (a vhost-user
// front-end that disconnected). The guest's own kick eventfds are closed.
func (g *Guest) Detach() {
	g.active = false
	for _, e := range g.ownKicks {
		if e != nil {
			e.Close()
		}
	}
	g.ownKicks = nil
	g.DRXKick, g.DTXKick = nil, nil
	g.rxBufs = nil
	for _, c := range g.conns {
		c.closed = true
	}
	g.conns = nil
}

func (g *Guest) fail(err error) {
	g.failMu.Lock()
	g.fails = append(g.fails, err)
	g.failMu.Unlock()
	select {
	case g.irq <- struct{}{}:
	default:
	}
}

// Fails returns the errors the device reported through Activation.Fail in
// this activation.
func (g *Guest) Fails() []error {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	return append([]error(nil), g.fails...)
}

// Interrupts returns how many interrupts the device raised on the RX and TX
// queues.
func (g *Guest) Interrupts() (rx, tx uint64) { return g.rxIrqs.Load(), g.txIrqs.Load() }

// txUsedIdx reads the TX ring's used index from guest memory.
func (g *Guest) txUsedIdx() uint16 {
	v, err := g.Mem.Load16Acquire(g.TX.Cfg.Used + 2)
	if err != nil {
		panic(fmt.Sprintf("vsocktest: TX used index: %v", err))
	}
	return v
}

// noteTXAnnounced records, from an interrupt that covers the TX queue,
// the TX used index it announces: the device published it before
// raising the interrupt. Interrupts may come from several goroutines at
// once; the furthest index wins.
func (g *Guest) noteTXAnnounced() {
	v := g.txUsedIdx()
	g.txAnnounceMu.Lock()
	if int16(v-g.txAnnounced) > 0 {
		g.txAnnounced = v
	}
	g.txAnnounceMu.Unlock()
}

// UnannouncedTX is how many TX completions the device has published that
// no interrupt covering the TX queue followed. The guest always asks for
// TX interrupts, so once the device is quiet it must be 0: a held-back
// interrupt never sent shows here.
func (g *Guest) UnannouncedTX() uint16 {
	v := g.txUsedIdx()
	g.txAnnounceMu.Lock()
	defer g.txAnnounceMu.Unlock()
	return v - g.txAnnounced
}

// cuts returns where a buffer of n bytes is split into k descriptors: once
// inside the header, once inside the rest.
func cuts(n uint32, k int) []uint32 {
	var c []uint32
	if k >= 2 && n > 20 {
		c = append(c, 20)
	}
	if k >= 3 && n > vsock.HeaderSize+1 {
		c = append(c, vsock.HeaderSize+(n-vsock.HeaderSize)/3)
	}
	return c
}

// split turns the n bytes at addr into bufs cut at cuts (ascending, inside
// (0, n)).
func split(addr uint64, n uint32, at []uint32, writable bool) []virtiotest.Buf {
	var out []virtiotest.Buf
	prev := uint32(0)
	for _, c := range at {
		if c <= prev || c >= n {
			continue
		}
		out = append(out, virtiotest.Buf{Addr: addr + uint64(prev), Len: c - prev, Writable: writable})
		prev = c
	}
	return append(out, virtiotest.Buf{Addr: addr + uint64(prev), Len: n - prev, Writable: writable})
}

// PostRX posts up to n more RX buffers of Opts.RxBufLen bytes (as many as the
// ring has descriptors for) and kicks the RX queue if the device asks for
// it. It returns how many it posted.
func (g *Guest) PostRX(n int) int {
	return g.PostRXSized(n, g.Opts.RxBufLen, g.Opts.RxSplit)
}

// PostRXSized posts up to n RX buffers of size bytes split across k
// descriptors. Buffers of another size than Opts.RxBufLen are not reposted.
func (g *Guest) PostRXSized(n int, size uint32, k int) int {
	old := g.RX.AvailIdx()
	posted := 0
	for ; posted < n && g.RX.Free() >= k; posted++ {
		var a uint64
		if size == g.Opts.RxBufLen && len(g.rxSpare) > 0 {
			a = g.rxSpare[len(g.rxSpare)-1]
			g.rxSpare = g.rxSpare[:len(g.rxSpare)-1]
		} else {
			a = g.Mem.Alloc(uint64(max(size, 1)), 64)
		}
		head, ok := g.RX.Add(split(a, size, cuts(size, k), true)...)
		if !ok {
			g.TB.Fatalf("vsocktest: RX ring full")
		}
		g.rxBufs[head] = rxBuf{a, size}
	}
	if posted > 0 {
		g.kick(g.RX, g.RXKick, old)
	}
	return posted
}

// RxPosted is how many RX buffers the device holds.
func (g *Guest) RxPosted() int { return len(g.rxBufs) }

// kick notifies the device about buffers published since old, if it asked.
func (g *Guest) kick(q *virtiotest.Queue, e *eventfd.EventFD, old uint16) {
	if g.needsKick(q, old) {
		if err := e.Signal(); err != nil {
			g.TB.Fatal(err)
		}
	}
}

func (g *Guest) needsKick(q *virtiotest.Queue, old uint16) bool {
	if !g.Opts.EventIdx {
		return q.NeedsKick(old) // reads the used flags atomically
	}
	ev, err := q.Mem.Load16Acquire(q.Cfg.Used + 4 + 8*uint64(q.Cfg.Size))
	if err != nil {
		g.TB.Fatal(err)
	}
	idx := q.AvailIdx()
	return idx-ev-1 < idx-old
}

// Kick signals both queues' eventfds unconditionally.
func (g *Guest) Kick() {
	_ = g.TXKick.Signal()
	_ = g.RXKick.Signal()
}

// Send sends one packet: h as given (its Len is not checked against payload)
// followed by payload, in Opts.TxSplit descriptors, and kicks.
func (g *Guest) Send(h vsock.Header, payload []byte) {
	var hb [vsock.HeaderSize]byte
	h.Encode(hb[:])
	b := make([]byte, 0, vsock.HeaderSize+len(payload))
	b = append(append(b, hb[:]...), payload...)
	g.SendBytes(b, cuts(uint32(len(b)), g.Opts.TxSplit))
}

// SendBytes sends b as the readable part of one TX chain, cut into
// descriptors at the offsets in at, and kicks.
func (g *Guest) SendBytes(b []byte, at []uint32) {
	g.TB.Helper()
	if len(b) > txSlotLen {
		g.TB.Fatalf("vsocktest: TX packet of %d bytes", len(b))
	}
	slot := g.txSlotFree()
	a := g.txAddr[slot]
	if err := g.Mem.Write(a, b); err != nil {
		g.TB.Fatal(err)
	}
	if len(b) == 0 {
		g.AddTX(slot, virtiotest.Buf{Addr: a, Len: 0})
		return
	}
	g.AddTX(slot, split(a, uint32(len(b)), at, false)...)
}

// AddTX makes bufs available on the TX queue as one chain (through an
// indirect table with Opts.Indirect) and kicks. slot is the TX slot the
// buffers live in (freed when the chain is used), or -1.
func (g *Guest) AddTX(slot int, bufs ...virtiotest.Buf) {
	g.TB.Helper()
	for {
		if g.Opts.Indirect && g.TX.Free() >= 1 || !g.Opts.Indirect && g.TX.Free() >= len(bufs) {
			break
		}
		if g.holdTX {
			g.TB.Fatalf("vsocktest: TX ring full while kicks are held (HoldTX)")
		}
		g.waitTX()
	}
	old := g.TX.AvailIdx()
	var head uint16
	var ok bool
	if g.Opts.Indirect {
		head, ok = g.TX.AddIndirect(bufs...)
	} else {
		head, ok = g.TX.Add(bufs...)
	}
	if !ok {
		g.TB.Fatalf("vsocktest: TX ring full")
	}
	if slot >= 0 {
		g.txSlot[head] = slot
	}
	g.sent++
	if !g.holdTX {
		g.kick(g.TX, g.TXKick, old)
	}
}

// HoldTX waits until the device has taken every TX chain sent so far
// (Sync), runs f with TX kicks held back, so that every packet f sends
// waits in the ring unseen, then kicks once: the device's TX worker, idle
// in its poll, finds them all in one pass (up to its batch size, as one
// batch). What f sends must fit in the ring and in the free TX slots: f
// must not wait for the device.
func (g *Guest) HoldTX(f func()) {
	g.TB.Helper()
	g.Sync()
	g.holdTX = true
	defer func() {
		g.holdTX = false
		if err := g.TXKick.Signal(); err != nil {
			g.TB.Fatal(err)
		}
	}()
	f()
}

func (g *Guest) txSlotFree() int {
	for len(g.txFree) == 0 {
		if g.holdTX {
			g.TB.Fatalf("vsocktest: no free TX slot while kicks are held (HoldTX)")
		}
		g.waitTX()
	}
	s := g.txFree[len(g.txFree)-1]
	g.txFree = g.txFree[:len(g.txFree)-1]
	return s
}

// waitTX waits until the device returns a TX chain.
func (g *Guest) waitTX() {
	g.TB.Helper()
	free := g.TX.Free()
	g.WaitFor("the device to consume TX packets", func() bool { return g.TX.Free() > free })
}

// reapTX frees the TX chains the device returned.
func (g *Guest) reapTX() bool {
	used := g.TX.Reap()
	for _, u := range used {
		if s, ok := g.txSlot[u.ID]; ok {
			delete(g.txSlot, u.ID)
			g.txFree = append(g.txFree, s)
		}
	}
	return len(used) > 0
}

// TxInFlight is how many TX chains the device has not returned yet.
func (g *Guest) TxInFlight() int { return int(g.Opts.QueueSize) - g.TX.Free() }

// Poll reaps both used rings once, routes what the device sent and reposts
// RX buffers. It reports whether anything happened.
func (g *Guest) Poll() bool {
	if !g.active {
		return false
	}
	got := g.reapTX()
	if g.DRX != nil && g.reapDgrams() {
		got = true
	}
	// RX before events: what the device put in the RX ring before a
	// TRANSPORT_RESET still reaches its connection.
	if g.reapRX() {
		got = true
	}
	if g.reapEvents() {
		got = true
	}
	return got
}

// reapRX takes the used RX buffers, routes their packets and reposts.
func (g *Guest) reapRX() bool {
	used := g.RX.Reap()
	if len(used) == 0 {
		return false
	}
	repost := 0
	for _, u := range used {
		b, ok := g.rxBufs[u.ID]
		if !ok {
			g.TB.Fatalf("vsocktest: device used RX head %d that is not posted", u.ID)
		}
		delete(g.rxBufs, u.ID)
		if b.size == g.Opts.RxBufLen {
			if g.AutoRepost {
				repost++
			}
			g.rxSpare = append(g.rxSpare, b.addr)
		}
		if u.Len == 0 && g.AcceptEmptyRX {
			g.emptyRX++
			continue
		}
		g.receive(b.addr, u.Len, b.size)
	}
	if repost > 0 {
		g.PostRX(repost)
	}
	return true
}

// receive decodes and checks one RX packet and routes it.
func (g *Guest) receive(addr uint64, n, size uint32) {
	tb := g.TB
	if n < vsock.HeaderSize || n > size {
		tb.Fatalf("vsocktest: device wrote %d bytes into an RX buffer of %d", n, size)
	}
	b := make([]byte, n)
	if err := g.Mem.Read(addr, b); err != nil {
		tb.Fatal(err)
	}
	var p Packet
	p.Hdr.Decode(b)
	p.Data = b[vsock.HeaderSize:]
	h := &p.Hdr
	switch {
	case h.SrcCID != vsock.CIDHost || h.DstCID != g.Opts.CID:
		tb.Errorf("vsocktest: RX packet %v: CIDs, want %d->%d", h, vsock.CIDHost, g.Opts.CID)
	case h.Len != n-vsock.HeaderSize:
		tb.Errorf("vsocktest: RX packet %v in a used entry of %d bytes", h, n)
	case h.Type != vsock.TypeStream && (h.Type != vsock.TypeSeqpacket || g.Features()&vsock.FeatureSeqpacket == 0):
		tb.Errorf("vsocktest: RX packet %v: type (features %#x)", h, g.Features())
	case h.Type == vsock.TypeStream && h.Flags != 0 && h.Op != vsock.OpShutdown:
		tb.Errorf("vsocktest: RX stream packet %v with flags", h)
	case h.Op != vsock.OpRW && h.Op != vsock.OpShutdown && h.Flags != 0:
		tb.Errorf("vsocktest: RX control packet %v with flags", h)
	case h.Op != vsock.OpRW && h.Len != 0:
		tb.Errorf("vsocktest: RX control packet %v with payload", h)
	case h.Op == vsock.OpRW && h.Len == 0:
		tb.Errorf("vsocktest: empty RW packet %v", h)
	}
	g.received++
	g.rxBytesTotal += uint64(h.Len)
	if g.Observe != nil {
		g.Observe(p)
	}
	if c := g.conns[connKey{h.SrcPort, h.DstPort}]; c != nil {
		c.receive(p)
		return
	}
	g.pending = append(g.pending, p)
}

// EmptyRX is how many RX buffers the device returned with nothing written
// (AcceptEmptyRX).
func (g *Guest) EmptyRX() int { return g.emptyRX }

// Received is how many packets the guest received and payload bytes in them.
func (g *Guest) Received() (packets, bytes uint64) { return g.received, g.rxBytesTotal }

// WaitFor polls until cond holds and fails the test with what after
// Opts.Timeout. Interrupts (and device failures) end a poll early; otherwise
// it looks again every millisecond.
func (g *Guest) WaitFor(what string, cond func() bool) {
	g.TB.Helper()
	deadline := time.Now().Add(g.Opts.Timeout)
	irq := !g.Opts.InterruptsOnly // look at the rings this time round
	for {
		if irq {
			g.Poll()
		}
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			g.TB.Fatalf("vsocktest: timed out after %v waiting for %s (fails: %v, stats: %+v)",
				g.Opts.Timeout, what, g.Fails(), g.Dev.Stats())
		}
		g.tick.Reset(time.Millisecond)
		select {
		case <-g.irq:
			irq = true
			if !g.tick.Stop() {
				<-g.tick.C
			}
		case <-g.tick.C:
			irq = !g.Opts.InterruptsOnly
		}
	}
}

// Within polls for up to d and reports whether cond became true.
func (g *Guest) Within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		g.Poll()
		if cond() {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// Quiet polls for d and fails the test if cond becomes true: for checking
// that something does not happen.
func (g *Guest) Quiet(d time.Duration, what string, cond func() bool) {
	g.TB.Helper()
	if g.Within(d, cond) {
		g.TB.Fatalf("vsocktest: %s", what)
	}
}

// WaitFail waits for the device to report a failure and returns it.
func (g *Guest) WaitFail() error {
	g.TB.Helper()
	g.WaitFor("the device to fail", func() bool { return len(g.Fails()) > 0 })
	return g.Fails()[0]
}

// Pending returns the received packets no connection claimed.
func (g *Guest) Pending() []Packet { return g.pending }

// TakePending returns the received packets no connection claimed and
// empties the list.
func (g *Guest) TakePending() []Packet {
	p := g.pending
	g.pending = nil
	return p
}

// PrunePending keeps only the pending packets for which keep is true, so
// that a long run does not accumulate packets nobody will claim.
func (g *Guest) PrunePending(keep func(*Packet) bool) {
	out := g.pending[:0]
	for i := range g.pending {
		if keep(&g.pending[i]) {
			out = append(out, g.pending[i])
		}
	}
	clear(g.pending[len(out):])
	g.pending = out
}

// Expect waits for a packet no connection claimed that matches, removes it
// from the pending list and returns it.
func (g *Guest) Expect(what string, match func(*vsock.Header) bool) Packet {
	g.TB.Helper()
	var got Packet
	g.WaitFor(what, func() bool {
		for i := range g.pending {
			if match(&g.pending[i].Hdr) {
				got = g.pending[i]
				g.pending = append(g.pending[:i], g.pending[i+1:]...)
				return true
			}
		}
		return false
	})
	return got
}

// ExpectOp waits for a packet with op between host port hp and guest port
// gp (either 0: any).
func (g *Guest) ExpectOp(op vsock.Op, hp, gp uint32) Packet {
	g.TB.Helper()
	return g.Expect(fmt.Sprintf("%v %d->%d", op, hp, gp), func(h *vsock.Header) bool {
		return h.Op == op && (hp == 0 || h.SrcPort == hp) && (gp == 0 || h.DstPort == gp)
	})
}

// Header returns a stream header from the guest to the host with the given
// ports and op (the CIDs filled in).
func (g *Guest) Header(op vsock.Op, guestPort, hostPort uint32) vsock.Header {
	return vsock.Header{SrcCID: g.Opts.CID, DstCID: vsock.CIDHost, SrcPort: guestPort, DstPort: hostPort,
		Type: vsock.TypeStream, Op: op}
}

// SendOp sends a control packet (no payload) with the given buf_alloc.
func (g *Guest) SendOp(op vsock.Op, guestPort, hostPort, bufAlloc uint32) {
	h := g.Header(op, guestPort, hostPort)
	h.BufAlloc = bufAlloc
	g.Send(h, nil)
}

// Sync waits until the device has returned every TX chain, so everything
// sent so far has been processed.
func (g *Guest) Sync() {
	g.TB.Helper()
	g.WaitFor("the device to consume every TX packet", func() bool { return g.TxInFlight() == 0 })
}

// Pattern returns n bytes of a deterministic pattern derived from seed.
func Pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

// firstDiff returns the index of the first byte where a and b differ, the
// shorter length when one is a prefix of the other, or -1 (for messages).
func firstDiff(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}

// CheckEqual fails the test if got differs from want.
func CheckEqual(tb testing.TB, what string, got, want []byte) {
	tb.Helper()
	if !bytes.Equal(got, want) {
		tb.Fatalf("%s: got %d bytes, want %d; first difference at %d", what, len(got), len(want), firstDiff(got, want))
	}
}
