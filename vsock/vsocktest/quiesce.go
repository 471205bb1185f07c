package vsocktest

import (
	"fmt"

	"github.com/microvm/microvm/virtio"
)

// Pauses (virtio.Quiescer): the device's session stops and a new one
// starts on the same rings, while the guest driver keeps everything it
// has (memory, queues, posted buffers, connections) and is told nothing,
// as under virtio-mmio's Quiesce and Resume. Through a Transport the test
// drives the transport itself; these are for a Guest that activates the
// device directly.

// Quiesce stops the device's session for a pause (Device.Quiesce). The
// guest stays active: it may go on polling the rings, where nothing new
// appears until Resume.
func (g *Guest) Quiesce() {
	g.TB.Helper()
	if g.Opts.Transport != nil || !g.active {
		g.TB.Fatal("vsocktest: Quiesce needs a guest activating the device itself, active")
	}
	g.Dev.Quiesce()
}

// Drained checks the Quiescer contract on every queue of the quiesced
// session: each one's next available entry is its next used entry (nothing
// popped and not returned), and the used index in guest memory is that
// too (nothing pushed and not published). Call it after Quiesce, before
// Resume. Without a Transport only (a transport keeps its own queues:
// virtio-mmio's SaveState checks them).
func (g *Guest) Drained() error {
	if g.Opts.Transport != nil {
		return fmt.Errorf("vsocktest: Drained through a transport")
	}
	for i, q := range g.Activation.Queues {
		if q == nil {
			continue
		}
		if q.LastAvail() != q.NextUsed() {
			return fmt.Errorf("queue %d: device at available entry %d, used entry %d: %d chains not returned",
				i, q.LastAvail(), q.NextUsed(), q.LastAvail()-q.NextUsed())
		}
		used, err := g.Mem.Load16Acquire(q.Config().Used + 2)
		if err != nil {
			return fmt.Errorf("queue %d: %w", i, err)
		}
		if used != q.NextUsed() {
			return fmt.Errorf("queue %d: used index %d in the ring, the device pushed up to %d", i, used, q.NextUsed())
		}
	}
	return nil
}

// Resume starts a new session of the device on the guest's queues, each at
// the position the quiesced one left it (its used index read back from the
// ring), with the same kick eventfds and interrupts, and kicks each queue
// once, as MMIO.Resume does.
func (g *Guest) Resume() {
	g.TB.Helper()
	if g.Opts.Transport != nil || !g.active {
		g.TB.Fatal("vsocktest: Resume needs a guest activating the device itself, active")
	}
	a := g.Activation
	a.Queues = make([]*virtio.ActiveQueue, len(g.Activation.Queues))
	for i, old := range g.Activation.Queues {
		if old == nil {
			continue
		}
		q := virtio.NewQueue(g.Mem.Memory, old.Config(), g.Opts.EventIdx, g.Opts.Indirect)
		if err := q.SetIndices(old.LastAvail()); err != nil {
			g.TB.Fatalf("vsocktest: resume queue %d: %v", i, err)
		}
		a.Queues[i] = &virtio.ActiveQueue{Queue: q, Kick: old.Kick, Interrupt: old.Interrupt}
	}
	if err := g.Dev.Activate(a); err != nil {
		g.TB.Fatalf("vsocktest: resume: %v", err)
	}
	g.Activation = a
	for _, q := range a.Queues {
		if q != nil {
			if err := q.Kick.Signal(); err != nil {
				g.TB.Fatal(err)
			}
		}
	}
}
