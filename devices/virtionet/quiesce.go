package virtionet

import "github.com/microvm/microvm/virtio"

// Quiesce (snapshots: virtio.Quiescer, virtio.Drainer) stops the session
// for a pause, leaving the rings as a new session can take them over.
//
// When the workers have returned (they look for the stop signal only
// between passes, never with a frame half written), the device holds:
//
//   - on TX, at most one popped chain not yet pushed: the frame the TAP
//     refused with EAGAIN (txState.pending). Nothing of it was written
//     (a TAP or packet socket takes a frame whole or not at all), so it is
//     put back with Undo, not sent: a drain must not wait on a peer that
//     may never read, and a write would hold the transport's lock across
//     a system call that moves data. The next session pops and sends it.
//     Every other chain popped was sent (or dropped, as a bad frame is)
//     and pushed; the workers publish before they sleep.
//   - on RX, the chains popped and not yet written (rxState.held): a frame
//     waiting for more room, or buffers kept after a frame too large for
//     them. Chains are used in the order they were popped, so the held
//     ones are the most recent pops and Undo, once per chain, puts them
//     all back. Pushing them empty instead would hand the driver a frame
//     of zero bytes. The frame the worker had read for them, if any,
//     cannot go back into the back-end: the Device keeps it (paused) and
//     the next session of the same driver delivers it before reading
//     again, so that no frame is lost or reordered by a pause.
//
// A session that failed (Activation.Fail) touches no ring: the transport
// has set DEVICE_NEEDS_RESET and will not save its positions.
//
// A resumed session (same features, no Reset between) also keeps the
// frames queued in the back-end, which a fresh activation drops as
// offloaded for another driver. A restore in a new process starts with
// neither: the back-end there is a new descriptor, and the frame the old
// process held goes the way of the frames its back-end had queued.

// paused is what a drained session leaves the next one.
type paused struct {
	features uint64 // the session's: a resume negotiates the same
	// buf holds a frame read from the back-end and not delivered (header
	// first, n bytes); nil when there was none.
	buf []byte
	n   int
}

// Quiesce implements virtio.Quiescer: the session drains (Drain) and the
// device keeps its configuration for the next activation.
func (d *Device) Quiesce() { d.life.Quiesce() }

// Drain implements virtio.Drainer: it stops the workers as Stop does, then,
// owning the queues, puts back every chain they popped and did not return
// (see above) and leaves the device what the next session needs.
func (s *session) Drain() {
	s.Stop()
	p := s.putBack()
	s.d.mu.Lock()
	s.d.paused = p
	s.d.mu.Unlock()
}

// putBack returns or puts back the chains the stopped workers hold and
// returns what the next session takes over, nil after a failure.
func (s *session) putBack() *paused {
	if s.failed.Load() {
		return nil
	}
	tx, rx := s.txst, s.rxst
	if tx.pending {
		s.tx.Undo()
		tx.pending = false
		clear(tx.views) // drop the references to guest memory
		tx.views = tx.views[:0]
	}
	// The workers publish before they sleep; a used entry pushed and not
	// published here would be a missed publish, which these make up for.
	if !s.publishTX(tx) || !s.publishRX(rx) {
		return nil
	}
	for ; rx.nheld > 0; rx.nheld-- {
		s.rx.Undo()
	}
	rx.room = 0
	p := &paused{features: s.features}
	if rx.n > 0 {
		p.buf, p.n = rx.buf, rx.n
	}
	return p
}

// takePaused returns, and forgets, what a drained session left, when the
// activation with features resumes it (the same features; a Reset in
// between forgets it anyway); nil otherwise.
func (d *Device) takePaused(features uint64) *paused {
	d.mu.Lock()
	p := d.paused
	d.paused = nil
	d.mu.Unlock()
	if p == nil || p.features != features {
		return nil
	}
	return p
}

var (
	_ virtio.Quiescer = (*Device)(nil)
	_ virtio.Drainer  = (*session)(nil)
)
