package virtio9p

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

const (
	hdrLen       = 7      // size[4] type[1] tag[2]
	noTag        = 0xffff // NOTAG: Tversion's, and the server's reply to a request it cannot decode
	typeTversion = 100    // Tversion: size tag msize[4] version[s]
	typeTflush   = 108    // Tflush: size tag oldtag[2]
	typeTreaddir = 40     // Treaddir: size tag fid[4] offset[8] count[4]

	// maxReaddirCount is the largest count a Treaddir reaches the server
	// with: an Rreaddir (size tag count[4] data) then fits MaxMessage.
	maxReaddirCount = MaxMessage - hdrLen - 4
)

// session is one activation: the guest's request queue feeding the
// device's 9P connection (conn).
//
// The request loop (its goroutine) pops chains, copies each request out
// of guest memory, notes the chain under the request's tag and writes the
// request into the server's pipe. The server answers each request on a
// goroutine of its own, in any order; the connection's reader hands the
// replies one by one to the reply loop (its goroutine), which finds the
// chain by tag, copies the reply into the chain's writable buffers,
// returns it to the used ring and interrupts the guest after unlocking.
//
// Stop (a driver reset, Close) ends both loops and drops what is in
// flight; the device then ends the connection. Drain (Quiesce, quiesce.go)
// ends the request loop, lets the reply loop return every chain still in
// flight, then ends it; the connection stays.
//
// Locks: mu guards the queue (popped by the request loop, pushed by the
// reply loop), inflight and the flags; it is never held across a pipe
// read or write, a channel operation or the interrupt.
type session struct {
	d    *Device
	c    *conn
	q    *virtio.ActiveQueue
	fail func(error)
	stop *eventfd.EventFD // wakes the request loop to end: Stop or Drain

	// quit is closed by Stop: the reply loop ends at once. drain is
	// closed by Drain once the request loop has ended: the reply loop
	// ends when nothing is in flight.
	quit, drain chan struct{}

	mu       sync.Mutex
	inflight map[uint16]pending
	failed   bool  // a guest error stopped the session
	stopping bool  // Stop has begun: replies are dropped
	draining bool  // Drain has begun: nothing more is popped
	failErr  error // the error to report, once mu is released

	requestsDone, repliesDone chan struct{}
}

// pending is a request in flight: its chain's head and writable buffers.
type pending struct {
	head     uint16
	writable [][]byte
	flush    bool // a Tflush
}

func startSession(d *Device, c *conn, q *virtio.ActiveQueue, fail func(error)) (*session, error) {
	stop, err := eventfd.NewNonblocking()
	if err != nil {
		return nil, err
	}
	s := &session{d: d, c: c, q: q, fail: fail, stop: stop, inflight: map[uint16]pending{},
		quit: make(chan struct{}), drain: make(chan struct{}),
		requestsDone: make(chan struct{}), repliesDone: make(chan struct{})}
	go s.replies()
	go s.requests()
	return s, nil
}

// Stop implements virtio.Session: it ends both loops, dropping the
// requests in flight (the driver is resetting the rings), and waits for
// them. The caller ends the connection (Device.Reset).
func (s *session) Stop() {
	s.mu.Lock()
	s.stopping = true // replies from now on are dropped, not pushed
	s.mu.Unlock()
	_ = s.stop.Signal()
	<-s.requestsDone
	close(s.quit)
	<-s.repliesDone
	s.release()
}

// release frees what the session holds once its loops have ended.
func (s *session) release() {
	s.stop.Close()
	s.mu.Lock()
	clear(s.inflight) // drop the references to guest memory
	s.mu.Unlock()
}

func (s *session) isFailed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// requests is the request loop. It looks at the ring before it first
// waits for a kick: a resumed or restored session's ring may hold requests
// the driver posted while notifications were suppressed. Every request it
// pops is in flight and written to the server before it looks for the
// stop signal, so once it has ended nothing popped is left unsent.
func (s *session) requests() {
	defer close(s.requestsDone)
	fds := []unix.PollFd{
		{Fd: int32(s.q.Kick.FD()), Events: unix.POLLIN},
		{Fd: int32(s.stop.FD()), Events: unix.POLLIN},
	}
	var chain virtio.Chain
	for {
		if !s.isFailed() {
			for {
				msg, ok := s.pop(&chain)
				s.reportFail()
				if !ok {
					break
				}
				// Counted before the write: the write returns only once the
				// server read the request, which it may have answered (and
				// the reply been counted) by then.
				s.d.requests.Add(1)
				s.d.requestBytes.Add(uint64(len(msg)))
				if err := s.c.write(msg); err != nil {
					// The server ended: the reply loop sees it (its
					// replies end) and reports the guest error.
					return
				}
			}
		}
		stopped, err := eventfd.PollStop(fds, -1)
		if err != nil {
			s.d.log.WithError(err).Error("9p: poll")
			return
		}
		if stopped {
			return
		}
		if n, _ := s.q.Kick.Wait(); n > 0 {
			s.d.kicks.Add(1)
		}
	}
}

// pop takes the next request off the ring, checks it is one whole 9P
// message with room for a reply, notes it in flight and returns a copy of
// it (false: the ring is empty, the guest erred, or the session is
// stopping or draining and takes nothing more).
func (s *session) pop(chain *virtio.Chain) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed || s.draining || s.stopping {
		return nil, false
	}
	for {
		ok, err := s.q.Pop(chain)
		if err != nil {
			s.failLocked(virtio.GuestErrQueue, err)
			return nil, false
		}
		if ok {
			break
		}
		more, err := s.q.EnableNotification()
		if err != nil {
			s.failLocked(virtio.GuestErrQueue, err)
			return nil, false
		}
		if !more {
			return nil, false
		}
	}
	rlen := chain.ReadableLen()
	if rlen < hdrLen || rlen > MaxMessage || chain.WritableLen() < hdrLen {
		s.failLocked(virtio.GuestErrLayout, fmt.Errorf("%w: 9p chain %d has %d readable and %d writable bytes; want a request of %d to %d bytes and room for the reply",
			virtio.ErrGuest, chain.Head, rlen, chain.WritableLen(), hdrLen, MaxMessage))
		return nil, false
	}
	msg := make([]byte, rlen)
	r := chain.Reader()
	r.Read(msg)
	size := binary.LittleEndian.Uint32(msg)
	tag := binary.LittleEndian.Uint16(msg[5:])
	if uint64(size) != rlen {
		s.failLocked(virtio.GuestErrLayout, fmt.Errorf("%w: 9p chain %d: message size %d, but %d readable bytes", virtio.ErrGuest, chain.Head, size, rlen))
		return nil, false
	}
	if _, dup := s.inflight[tag]; dup {
		s.failLocked(virtio.GuestErrLayout, fmt.Errorf("%w: 9p chain %d reuses tag %d of a request in flight", virtio.ErrGuest, chain.Head, tag))
		return nil, false
	}
	if msg[4] == typeTflush && len(msg) >= hdrLen+2 {
		// The server's Tflush waits for the request it names: naming
		// itself or another Tflush (which Linux never does) would wait
		// for ever, and a reset would then wait on the server.
		old := binary.LittleEndian.Uint16(msg[hdrLen:])
		if p, ok := s.inflight[old]; old == tag || ok && p.flush {
			s.failLocked(virtio.GuestErrLayout, fmt.Errorf("%w: 9p chain %d: Tflush of tag %d, itself or a Tflush", virtio.ErrGuest, chain.Head, old))
			return nil, false
		}
	}
	if msg[4] == typeTversion && len(msg) >= hdrLen+4 {
		// The server would grant up to its own bound; ours is lower.
		if binary.LittleEndian.Uint32(msg[hdrLen:]) > MaxMessage {
			binary.LittleEndian.PutUint32(msg[hdrLen:], MaxMessage)
		}
	}
	if msg[4] == typeTreaddir && len(msg) >= hdrLen+16 {
		// The server sizes an Rreaddir by the count asked, not by the
		// msize: a larger count would have it write a reply longer
		// than any the connection takes (conn.read).
		if binary.LittleEndian.Uint32(msg[hdrLen+12:]) > maxReaddirCount {
			binary.LittleEndian.PutUint32(msg[hdrLen+12:], maxReaddirCount)
		}
	}
	s.inflight[tag] = pending{head: chain.Head, writable: append([][]byte(nil), chain.Writable()...), flush: msg[4] == typeTflush}
	return msg, true
}

// failLocked records a guest error with s.mu held: the session serves
// nothing more until the driver resets the device. The caller reports it
// (reportFail) once it has unlocked.
func (s *session) failLocked(kind virtio.GuestErrorKind, err error) {
	if s.failed {
		return
	}
	s.failed = true
	s.failErr = err
	s.d.guestErrors.Add(kind)
	s.c.broken.Store(true)
}

// reportFail hands a recorded guest error to the transport (which logs it,
// sets DEVICE_NEEDS_RESET and interrupts the guest), outside s.mu.
func (s *session) reportFail() {
	s.mu.Lock()
	err := s.failErr
	s.failErr = nil
	s.mu.Unlock()
	if err != nil {
		s.fail(err)
	}
}

// replies is the reply loop: it returns each reply the connection hands
// over to its request's chain. It ends when Stop says so, when the server
// has ended (a guest error unless Stop began), or, once Drain has seen the
// request loop end, when nothing is in flight any more (or the session
// failed, which leaves the rest to the driver's reset).
func (s *session) replies() {
	defer close(s.repliesDone)
	drain := s.drain
	for {
		select {
		case msg, ok := <-s.c.replies:
			if !ok {
				s.serverEnded()
				return
			}
			s.deliver(msg)
		case <-drain:
			drain = nil // from now on only replies or quit wake the loop
		case <-s.quit:
			return
		}
		if drain == nil && s.idle() {
			return
		}
	}
}

// idle says whether nothing the session popped still waits for its
// reply, or the session failed and owes no more replies.
func (s *session) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inflight) == 0 || s.failed
}

// serverEnded reports a server that ended the connection by itself: it
// does so only on a request it cannot take (longer than the msize the
// guest negotiated, or not a message), whose chain it never answers.
func (s *session) serverEnded() {
	s.mu.Lock()
	if !s.stopping {
		s.failLocked(virtio.GuestErrLayout, fmt.Errorf("%w: 9p: the server ended the session on a request it could not take (longer than the negotiated msize, or malformed)", virtio.ErrGuest))
	}
	s.mu.Unlock()
	s.reportFail()
}

// deliver writes a reply into its request's chain and returns the chain.
func (s *session) deliver(msg []byte) {
	tag := binary.LittleEndian.Uint16(msg[5:])
	s.mu.Lock()
	p, ok := s.inflight[tag]
	delete(s.inflight, tag)
	if !ok && tag == noTag {
		// The server answers a request it could not decode under NOTAG:
		// its own tag is lost, so it could never be answered.
		s.failLocked(virtio.GuestErrLayout, fmt.Errorf("%w: 9p: a request the server could not decode", virtio.ErrGuest))
	}
	failed := s.failed || s.stopping
	s.mu.Unlock()
	s.reportFail()
	if !ok || failed {
		return // after a guest error, or once Stop began, nothing more goes back
	}
	// The buffers are the request's alone until it is pushed.
	n := 0
	for _, b := range p.writable {
		n += copy(b, msg[n:])
		if n == len(msg) {
			break
		}
	}
	s.mu.Lock()
	if s.failed || s.stopping {
		s.mu.Unlock()
		return
	}
	err := s.q.Push(p.head, uint32(n))
	need := false
	if err == nil {
		need, err = s.q.NeedsNotification()
	}
	if err != nil {
		s.failLocked(virtio.GuestErrQueue, err)
		s.mu.Unlock()
		s.reportFail()
		return
	}
	s.mu.Unlock()
	s.d.replies.Add(1)
	s.d.replyBytes.Add(uint64(n))
	if need {
		s.q.Interrupt()
	}
}
