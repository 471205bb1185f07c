package virtio9p

import "github.com/microvm/microvm/virtio"

// Quiesce implements virtio.Quiescer, for a pause or a snapshot: the
// session stops taking requests, waits for the server to answer every one
// it holds and returns each to the guest (Drain), so that the queue's
// positions are final when it returns. The 9P connection stays, and with
// it the guest's fids and open files: the next Activate (MMIO.Resume)
// starts a session on it at the positions this one left. A driver reset
// or Close ends it.
//
// The wait is bounded by the server, not by a timer: every request the
// server takes is answered once its handler returns, and no handler here
// waits on the guest or for ever. Tlock is granted at once (dirFile.Lock;
// Tgetlock the server answers ENOSYS); no FIFO, socket or device is ever
// opened, so no read or write waits on a peer; a Tflush waits only for
// the request it names, and pop refuses one naming itself or another
// Tflush (a guest error), so flushes never wait on each other. What is
// left is host file I/O on the share, which a reset does not wait for
// either beyond drainTimeout but Quiesce must: a share on a host file
// system that hangs (a hard NFS mount whose server is gone) hangs the
// pause with it, as it hangs any host process reading there.
func (d *Device) Quiesce() { d.life.Quiesce() }

// Drain implements virtio.Drainer: Stop, except that every chain popped
// is answered and returned instead of dropped, and the connection stays.
//
// Why that leaves nothing popped and not returned: the request loop is the
// only goroutine that pops, and it notes each chain in inflight and writes
// its request to the server before it looks for the stop signal again
// (draining also keeps pop from taking more); once it has ended (Drain
// waits for it) every popped chain is in inflight and with the server.
// The server answers each (above); the reply loop keeps running until
// inflight is empty, pushing each chain with Queue.Push (which publishes
// the used index) and interrupting the guest when its suppression asks
// for it, exactly as in normal completion. Drain returns once both loops
// have, so nothing of the session touches the queue or guest memory after
// it; the connection's goroutines touch neither. The exceptions are a
// session that failed (a malformed chain, a broken ring, a server that
// ended on a bad request): it returns nothing more, but then the
// transport has DEVICE_NEEDS_RESET set and the positions do not matter;
// its connection is marked broken, and the next activation gets a new one.
//
// No lock is held while it waits (the transport calls it under MMIO.mu,
// and the Lifecycle stops sessions outside Lifecycle.mu); the reply loop
// takes s.mu only around the push, and its ActiveQueue.Interrupt takes
// only the transport's interrupt lock, never MMIO.mu.
func (s *session) Drain() {
	s.mu.Lock()
	s.draining = true // pop takes nothing more
	s.mu.Unlock()
	_ = s.stop.Signal()
	<-s.requestsDone
	close(s.drain)
	<-s.repliesDone
	s.release()
}

// The Lifecycle finds Drain through an interface check; a typo in its name
// would silently turn every Quiesce into a Reset that drops what is in
// flight.
var (
	_ virtio.Quiescer = (*Device)(nil)
	_ virtio.Drainer  = (*session)(nil)
)
