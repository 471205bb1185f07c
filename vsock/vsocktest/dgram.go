package vsocktest

import (
	"sync/atomic"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
)

// dgramDriver is the guest side of the datagram queues.
type dgramDriver struct {
	rxBufs   map[uint16]rxBuf // posted datagram RX buffers by head
	rxSpare  []uint64
	txSlot   map[uint16]int
	txFree   []int
	txAddr   []uint64
	received []Packet // datagrams not yet taken by Dgrams
	irqs     atomic.Uint64
}

const (
	dgramTxSlots = 16
	// DgramRxBufLen is the size of each datagram RX buffer, header
	// included.
	DgramRxBufLen = vsock.HeaderSize + 4096
)

// activateDgram builds the datagram queues (3 and 4) for an activation.
func (g *Guest) activateDgram(aq func(*virtiotest.Queue, *eventfd.EventFD, *atomic.Uint64) *virtio.ActiveQueue) []*virtio.ActiveQueue {
	n := g.Opts.QueueSize
	g.DRX = virtiotest.NewQueue(g.Mem, n, false)
	g.DTX = virtiotest.NewQueue(g.Mem, n, false)
	var err error
	for _, p := range []**eventfd.EventFD{&g.DRXKick, &g.DTXKick} {
		if *p, err = eventfd.NewNonblocking(); err != nil {
			g.TB.Fatal(err)
		}
	}
	g.dg = dgramDriver{rxBufs: map[uint16]rxBuf{}, txSlot: map[uint16]int{}}
	for i := 0; i < dgramTxSlots; i++ {
		g.dg.txAddr = append(g.dg.txAddr, g.Mem.Alloc(txSlotLen, 64))
		g.dg.txFree = append(g.dg.txFree, i)
	}
	var txIrqs atomic.Uint64
	return []*virtio.ActiveQueue{aq(g.DRX, g.DRXKick, &g.dg.irqs), aq(g.DTX, g.DTXKick, &txIrqs)}
}

func (g *Guest) postDgramInitial() {
	n := int(g.Opts.QueueSize)
	if g.Opts.DgramRxBuffers > 0 {
		n = min(n, g.Opts.DgramRxBuffers)
	} else if g.Opts.DgramRxBuffers < 0 {
		n = 0
	}
	g.PostDgramRX(n, DgramRxBufLen)
}

// PostDgramRX posts up to n datagram RX buffers of size bytes (header
// included), one descriptor each, and kicks if the device asks. It returns
// how many it posted.
func (g *Guest) PostDgramRX(n int, size uint32) int {
	old := g.DRX.AvailIdx()
	posted := 0
	for ; posted < n && g.DRX.Free() > 0; posted++ {
		var a uint64
		if size == DgramRxBufLen && len(g.dg.rxSpare) > 0 {
			a = g.dg.rxSpare[len(g.dg.rxSpare)-1]
			g.dg.rxSpare = g.dg.rxSpare[:len(g.dg.rxSpare)-1]
		} else {
			a = g.Mem.Alloc(uint64(max(size, 1)), 64)
		}
		head, ok := g.DRX.Add(virtiotest.Buf{Addr: a, Len: size, Writable: true})
		if !ok {
			g.TB.Fatal("vsocktest: datagram RX ring full")
		}
		g.dg.rxBufs[head] = rxBuf{a, size}
	}
	if posted > 0 {
		g.kick(g.DRX, g.DRXKick, old)
	}
	return posted
}

// DgramRxPosted is how many datagram RX buffers the device holds.
func (g *Guest) DgramRxPosted() int { return len(g.dg.rxBufs) }

// DgramHeader returns a datagram header from guest port src to host port
// dst for payload bytes.
func (g *Guest) DgramHeader(src, dst uint32, n int) vsock.Header {
	return vsock.Header{SrcCID: g.Opts.CID, DstCID: vsock.CIDHost, SrcPort: src, DstPort: dst,
		Len: uint32(n), Type: vsock.TypeDgram, Op: vsock.OpRW}
}

// SendDgram sends one datagram from guest port src to host port dst.
func (g *Guest) SendDgram(src, dst uint32, payload []byte) {
	g.TB.Helper()
	g.SendDgramRaw(g.DgramHeader(src, dst, len(payload)), payload)
}

// SendDgramRaw sends h (as given) and payload as one chain on the datagram
// TX queue, and kicks.
func (g *Guest) SendDgramRaw(h vsock.Header, payload []byte) {
	g.TB.Helper()
	var hb [vsock.HeaderSize]byte
	h.Encode(hb[:])
	g.SendDgramBytes(append(hb[:], payload...))
}

// SendDgramBytes sends b as the whole readable part of one chain on the
// datagram TX queue, and kicks: for malformed packets.
func (g *Guest) SendDgramBytes(b []byte) {
	g.TB.Helper()
	if len(b) > txSlotLen {
		g.TB.Fatalf("vsocktest: datagram of %d bytes", len(b))
	}
	for len(g.dg.txFree) == 0 || g.DTX.Free() == 0 {
		free := len(g.dg.txFree)
		g.WaitFor("the device to consume datagrams", func() bool { return len(g.dg.txFree) > free })
	}
	slot := g.dg.txFree[len(g.dg.txFree)-1]
	g.dg.txFree = g.dg.txFree[:len(g.dg.txFree)-1]
	a := g.dg.txAddr[slot]
	if err := g.Mem.Write(a, b); err != nil {
		g.TB.Fatal(err)
	}
	old := g.DTX.AvailIdx()
	head, ok := g.DTX.Add(virtiotest.Buf{Addr: a, Len: uint32(len(b))})
	if !ok {
		g.TB.Fatal("vsocktest: datagram TX ring full")
	}
	g.dg.txSlot[head] = slot
	g.kick(g.DTX, g.DTXKick, old)
}

// DgramTxInFlight is how many datagram TX chains the device has not
// returned.
func (g *Guest) DgramTxInFlight() int { return len(g.dg.txSlot) }

// SyncDgram waits until the device has returned every datagram TX chain.
func (g *Guest) SyncDgram() {
	g.TB.Helper()
	g.WaitFor("the device to consume every datagram", func() bool { return g.DgramTxInFlight() == 0 })
}

// reapDgrams frees returned datagram TX chains and takes received
// datagrams, reposting their buffers when AutoRepost is on.
func (g *Guest) reapDgrams() bool {
	got := false
	for _, u := range g.DTX.Reap() {
		got = true
		if s, ok := g.dg.txSlot[u.ID]; ok {
			delete(g.dg.txSlot, u.ID)
			g.dg.txFree = append(g.dg.txFree, s)
		}
	}
	repost := 0
	for _, u := range g.DRX.Reap() {
		got = true
		b, ok := g.dg.rxBufs[u.ID]
		if !ok {
			g.TB.Fatalf("vsocktest: device used datagram RX head %d that is not posted", u.ID)
		}
		delete(g.dg.rxBufs, u.ID)
		if b.size == DgramRxBufLen {
			g.dg.rxSpare = append(g.dg.rxSpare, b.addr)
			if g.AutoRepost {
				repost++
			}
		}
		if u.Len < vsock.HeaderSize || u.Len > b.size {
			g.TB.Fatalf("vsocktest: device wrote %d bytes into a datagram RX buffer of %d", u.Len, b.size)
		}
		buf := make([]byte, u.Len)
		if err := g.Mem.Read(b.addr, buf); err != nil {
			g.TB.Fatal(err)
		}
		var p Packet
		p.Hdr.Decode(buf)
		p.Data = buf[vsock.HeaderSize:]
		h := &p.Hdr
		switch {
		case h.SrcCID != vsock.CIDHost || h.DstCID != g.Opts.CID:
			g.TB.Errorf("vsocktest: datagram %v: CIDs, want %d->%d", h, vsock.CIDHost, g.Opts.CID)
		case h.Type != vsock.TypeDgram || h.Op != vsock.OpRW:
			g.TB.Errorf("vsocktest: datagram %v: want type DGRAM, op RW", h)
		case h.Len != u.Len-vsock.HeaderSize:
			g.TB.Errorf("vsocktest: datagram %v in a used entry of %d bytes", h, u.Len)
		}
		g.dg.received = append(g.dg.received, p)
	}
	if repost > 0 {
		g.PostDgramRX(repost, DgramRxBufLen)
	}
	return got
}

// Dgrams returns the datagrams received since the last call.
func (g *Guest) Dgrams() []Packet {
	g.Poll()
	p := g.dg.received
	g.dg.received = nil
	return p
}

// WaitDgrams waits until n datagrams have arrived and returns them (and any
// more that came).
func (g *Guest) WaitDgrams(n int) []Packet {
	g.TB.Helper()
	var got []Packet
	g.WaitFor("datagrams", func() bool {
		got = append(got, g.dg.received...)
		g.dg.received = nil
		return len(got) >= n
	})
	return got
}
