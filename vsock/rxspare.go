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
//
// Each spare buffer keeps the available-ring index it was popped from, and
// pops take the oldest first. A read fills its buffers in the order it
// popped them, so when no other producer pops while a read is out, the
// buffers not returned are always the most recent pops, in order: exactly
// what a quiesce can put back with Undo (quiesce.go). A producer that pops
// from the ring while another's read is out, and pushes, leaves a hole: an
// older buffer on the list under a newer one returned. The next pops take
// the holes first; a quiesce that still finds one returns it empty.

// rxSpare is the list of popped, unused RX buffers, ordered by age: the
// newest at index 0, the oldest at the top (n-1), where take looks.
// Guarded by rxMu. Values move in and out by swapping, so no two Chains
// ever share the slices a Chain reuses from pop to pop.
type rxSpare struct {
	chains []virtio.Chain // [:n] hold buffers; the rest are recycled Chains
	pos    []uint16       // [:n]: the available-ring index each was popped from
	n      int
}

// older reports whether available-ring index a was popped before b. Both
// are of buffers popped and not returned, fewer than the ring's size (at
// most 2^15) apart.
func older(a, b uint16) bool { return int16(a-b) < 0 }

// put moves *ch, popped from available-ring index pos, onto the list in
// its place by age, leaving ch a recycled Chain. A buffer older than every
// other (a read's leftovers, put newest first: spareLocked) goes to the top
// at once.
func (p *rxSpare) put(ch *virtio.Chain, pos uint16) {
	if p.n == len(p.chains) {
		p.chains = append(p.chains, virtio.Chain{})
		p.pos = append(p.pos, 0)
	}
	i := p.n
	p.chains[i], *ch = *ch, p.chains[i]
	p.pos[i] = pos
	p.n++
	for ; i > 0 && older(p.pos[i-1], p.pos[i]); i-- {
		p.chains[i], p.chains[i-1] = p.chains[i-1], p.chains[i]
		p.pos[i], p.pos[i-1] = p.pos[i-1], p.pos[i]
	}
}

// take moves the oldest buffer into *ch and returns its available-ring
// index; false when there is none.
func (p *rxSpare) take(ch *virtio.Chain) (uint16, bool) {
	if p.n == 0 {
		return 0, false
	}
	p.n--
	p.chains[p.n], *ch = *ch, p.chains[p.n]
	return p.pos[p.n], true
}

// popRXLocked takes the next free RX buffer: a spare one first, then the
// ring's next. It returns the available-ring index the buffer was popped
// from. Called with rxMu held.
func (s *session) popRXLocked(ch *virtio.Chain) (pos uint16, ok bool, err error) {
	if pos, ok := s.rxSpare.take(ch); ok {
		return pos, true, nil
	}
	ok, err = s.rx.Pop(ch)
	return s.rx.LastAvail() - 1, ok, err
}

// rxAvailableLocked reports whether an RX buffer is free (spare or in the
// ring). Called with rxMu held.
func (s *session) rxAvailableLocked() (bool, error) {
	if s.rxSpare.n > 0 {
		return true, nil
	}
	return s.rx.HasAvailable()
}
