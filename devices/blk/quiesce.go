package blk

import "github.com/microvm/microvm/virtio"

// Quiesce implements virtio.Quiescer, for a pause or a snapshot: the
// session stops taking requests, finishes the I/O of those it holds and
// returns each to the guest (Drain), so that the queue's positions are
// final when it returns. The image and the counters stay; the next
// Activate (MMIO.Resume, or a restore) starts a session at the positions
// this one left, and its dispatcher looks at the ring before it waits for
// a kick.
func (d *Device) Quiesce() { d.life.Quiesce() }

// Drain implements virtio.Drainer: Stop, except that the workers return
// the requests they hold instead of dropping them.
//
// Why that leaves nothing popped and not returned: the dispatcher is the
// only goroutine that pops, and it hands every chain it popped to the work
// channel (which has room for all the slots, so the hand-over never
// blocks) before it looks at quit again; a worker takes each chain from
// the channel until the dispatcher closes it on its way out, runs its I/O
// to the end, and pushes it with Queue.Push (which publishes the used
// index) and signals the interrupt if the driver's suppression asks for
// one, exactly as in normal completion. Drain returns once the dispatcher
// and every worker have (the wait group), so nothing of the session
// touches the queue or guest memory after it. The one exception is a
// session that failed (a malformed chain or a broken ring): it pushes
// nothing more, but then the transport has DEVICE_NEEDS_RESET set and the
// positions do not matter.
//
// No lock is held across the I/O: a worker takes qmu only around the push,
// as it always does, and Drain itself takes none (the transport calls it
// under MMIO.mu and the Lifecycle's stop is outside Lifecycle.mu; the
// workers' ActiveQueue.Interrupt takes only the transport's interrupt
// lock, never MMIO.mu).
func (s *session) Drain() { s.shutdown(false) }

// The Lifecycle finds Drain through an interface check; a typo in its name
// would silently turn every Quiesce into a Reset that drops what is in
// flight.
var (
	_ virtio.Quiescer = (*Device)(nil)
	_ virtio.Drainer  = (*session)(nil)
)
