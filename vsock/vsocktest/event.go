package vsocktest

import (
	"encoding/binary"

	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
)

// DefaultEventBuffers is how many event buffers the guest keeps posted, as
// Linux does (virtio_vsock's event_list).
const DefaultEventBuffers = 8

// Event is an event the device wrote into an event buffer.
type Event struct {
	ID  uint32 // the le32 id, when Len is at least 4
	Len uint32 // the used length the device reported
}

// eventDriver is the guest's side of the event queue.
type eventDriver struct {
	bufs   map[uint16]rxBuf // posted event buffers by head
	events []Event
	resets int // TRANSPORT_RESET events acted on
}

// postEventsInitial posts the activation's event buffers.
func (g *Guest) postEventsInitial() {
	g.ev = eventDriver{bufs: map[uint16]rxBuf{}}
	if g.Opts.NoEventQueue {
		return
	}
	n := g.Opts.EventBuffers
	switch {
	case n == 0:
		n = DefaultEventBuffers
	case n < 0:
		n = 0
	}
	g.PostEvents(n, vsock.EventSize)
}

// PostEvents posts n event buffers of size bytes (Linux posts
// vsock.EventSize) and kicks the event queue if the device asks for it.
func (g *Guest) PostEvents(n int, size uint32) {
	g.TB.Helper()
	if g.Opts.NoEventQueue {
		g.TB.Fatal("vsocktest: no event queue")
	}
	bufs := make([]rxBuf, n)
	for i := range bufs {
		bufs[i] = rxBuf{g.Mem.Alloc(uint64(max(size, 1)), 8), size}
	}
	g.postEventBufs(bufs)
}

// postEventBufs makes bufs available on the event queue and kicks if the
// device asks for it.
func (g *Guest) postEventBufs(bufs []rxBuf) {
	g.TB.Helper()
	old := g.Event.AvailIdx()
	for _, b := range bufs {
		head, ok := g.Event.Add(virtiotest.Buf{Addr: b.addr, Len: b.size, Writable: true})
		if !ok {
			g.TB.Fatal("vsocktest: event ring full")
		}
		g.ev.bufs[head] = b
	}
	if len(bufs) > 0 {
		g.kick(g.Event, g.EventKick, old)
	}
}

// EventsPosted is how many event buffers the device holds.
func (g *Guest) EventsPosted() int { return len(g.ev.bufs) }

// Events returns every event received in this activation, in order.
func (g *Guest) Events() []Event { return append([]Event(nil), g.ev.events...) }

// TransportResets is how many TRANSPORT_RESET events the guest acted on in
// this activation.
func (g *Guest) TransportResets() int { return g.ev.resets }

// reapEvents takes the used event buffers and acts on them as Linux's
// virtio_transport_event_work does: an event of exactly vsock.EventSize
// bytes is handled, and (with AutoRepost) every buffer large enough goes
// back to the ring.
func (g *Guest) reapEvents() bool {
	if g.Opts.NoEventQueue {
		return false
	}
	used := g.Event.Reap()
	var repost []rxBuf
	for _, u := range used {
		b, ok := g.ev.bufs[u.ID]
		if !ok {
			g.TB.Fatalf("vsocktest: device used event head %d that is not posted", u.ID)
		}
		delete(g.ev.bufs, u.ID)
		if g.AutoRepost && b.size >= vsock.EventSize {
			repost = append(repost, rxBuf{b.addr, vsock.EventSize})
		}
		if u.Len > b.size {
			g.TB.Fatalf("vsocktest: device wrote %d bytes into an event buffer of %d", u.Len, b.size)
		}
		e := Event{Len: u.Len}
		if u.Len >= 4 {
			var id [4]byte
			if err := g.Mem.Read(b.addr, id[:]); err != nil {
				g.TB.Fatal(err)
			}
			e.ID = binary.LittleEndian.Uint32(id[:])
		}
		g.ev.events = append(g.ev.events, e)
		if e.Len == vsock.EventSize && e.ID == vsock.EventTransportReset {
			g.transportReset()
		}
	}
	// Acted on first, then given back, as Linux does.
	g.postEventBufs(repost)
	return len(used) > 0
}

// transportReset does what Linux does on VIRTIO_VSOCK_EVENT_TRANSPORT_RESET:
// every connected socket (an established connection: Linux puts a socket in
// its connected table once RESPONSE is exchanged) is reset without a packet
// and forgotten; sockets still connecting are left alone.
func (g *Guest) transportReset() {
	g.ev.resets++
	for k, c := range g.conns {
		if c.Established {
			c.TransportReset = true
			c.closed = true
			delete(g.conns, k)
		}
	}
}
