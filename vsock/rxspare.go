package vsock

import "github.com/microvm/microvm/virtio"

// RX buffers taken from the ring but not used.
//
// A host read pops the guest buffers it may fill under rxMu, reads into
// them without it (no lock is held across a syscall that moves data: the
// TX worker's direct enqueues and the other producers go on meanwhile), and
// takes rxMu again to push what it filled. The ring can only give back the
// buffer popped last (virtio.Queue.Undo), and others may have popped since,
// so the buffers a short read left empty go to the spare list instead, and
// every pop takes from it first. It holds at most the ring's size (each
// entry is a distinct popped buffer) and dies with the session.

// rxSpare is a stack of popped, unused RX buffers. Guarded by rxMu. Values
// move in and out by swapping, so no two Chains ever share the slices a
// Chain reuses from pop to pop.
type rxSpare struct {
	chains []virtio.Chain // [:n] hold buffers; the rest are recycled Chains
	n      int
}

// put moves *ch onto the stack, leaving ch a recycled Chain.
func (p *rxSpare) put(ch *virtio.Chain) {
	if p.n == len(p.chains) {
		p.chains = append(p.chains, virtio.Chain{})
	}
	p.chains[p.n], *ch = *ch, p.chains[p.n]
	p.n++
}

// take moves the top buffer into *ch; false when there is none.
func (p *rxSpare) take(ch *virtio.Chain) bool {
	if p.n == 0 {
		return false
	}
	p.n--
	p.chains[p.n], *ch = *ch, p.chains[p.n]
	return true
}

// popRXLocked takes the next free RX buffer: a spare one first, then the
// ring's next. Called with rxMu held.
func (s *session) popRXLocked(ch *virtio.Chain) (bool, error) {
	if s.rxSpare.take(ch) {
		return true, nil
	}
	return s.rx.Pop(ch)
}

// rxAvailableLocked reports whether an RX buffer is free (spare or in the
// ring). Called with rxMu held.
func (s *session) rxAvailableLocked() (bool, error) {
	if s.rxSpare.n > 0 {
		return true, nil
	}
	return s.rx.HasAvailable()
}
