package virtio9p

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// drainTimeout bounds how long Stop waits for the server to answer the
// requests in flight.
const drainTimeout = 2 * time.Second

const (
	hdrLen       = 7      // size[4] type[1] tag[2]
	noTag        = 0xffff // NOTAG: Tversion's, and the server's reply to a request it cannot decode
	typeTversion = 100    // Tversion: size tag msize[4] version[s]
	typeTflush   = 108    // Tflush: size tag oldtag[2]
)

// session is one activation: a 9P connection between the guest's request
// queue and a p9 server.
//
// The request loop (its goroutine) pops chains, copies each request out
// of guest memory, notes the chain under the request's tag and writes the
// request into the server's pipe. The server answers each request on a
// goroutine of its own, in any order, writing replies into the reply
// pipe; the reply loop (its goroutine) reads them one by one, finds the
// chain by tag, copies the reply into the chain's writable buffers,
// returns it to the used ring and interrupts the guest after unlocking.
//
// Locks: mu guards the queue (popped by the request loop, pushed by the
// reply loop) and inflight; it is never held across a pipe read or write
// or the interrupt.
type session struct {
	d    *Device
	q    *virtio.ActiveQueue
	fail func(error)
	stop *eventfd.EventFD

	mu       sync.Mutex
	inflight map[uint16]pending
	failed   bool  // a guest error stopped the session
	stopping bool  // Stop has begun
	failErr  error // the error to report, once mu is released

	toServer   *io.PipeWriter // requests, written by the request loop
	fromServer *io.PipeReader // replies, read by the reply loop

	// Requests the server took and replies it gave: the server answers
	// every request it decodes or not (a reply per request), so the
	// difference is what its handlers still hold.
	toServerN, fromServerN atomic.Uint64

	requestsDone, repliesDone, served chan struct{}
}

// pending is a request in flight: its chain's head and writable buffers.
type pending struct {
	head     uint16
	writable [][]byte
	flush    bool // a Tflush
}

func startSession(d *Device, q *virtio.ActiveQueue, fail func(error)) (*session, error) {
	stop, err := eventfd.NewNonblocking()
	if err != nil {
		return nil, err
	}
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	s := &session{d: d, q: q, fail: fail, stop: stop, inflight: map[uint16]pending{},
		toServer: reqW, fromServer: repR,
		requestsDone: make(chan struct{}), repliesDone: make(chan struct{}), served: make(chan struct{})}
	srv := p9.NewServer(d.fs, p9.WithServerLogger(traceLog{d}))
	go func() {
		defer close(s.served)
		// Handle returns once the request pipe ends and every handler
		// has answered; it closes both pipes' server ends and every file
		// the guest had open. It also returns when a request breaks the
		// connection (longer than the msize the guest negotiated, or not
		// a message): a guest error, unless Stop ended the pipe.
		serve(srv, reqR, repW, d)
		s.mu.Lock()
		if !s.stopping {
			s.failLocked(virtio.GuestErrLayout, fmt.Errorf("%w: 9p: the server ended the session on a request it could not take (longer than the negotiated msize, or malformed)", virtio.ErrGuest))
		}
		s.mu.Unlock()
		s.reportFail()
	}()
	go s.replies()
	go s.requests()
	return s, nil
}

// serve runs the server's session. A panic from it (the WaitGroup race
// Stop works around) is logged, not fatal: the session is ending anyway,
// and its pipes are closed so the reply loop ends too.
func serve(srv *p9.Server, reqR *io.PipeReader, repW *io.PipeWriter, d *Device) {
	defer func() {
		if r := recover(); r != nil {
			d.log.WithField("panic", r).Error("9p: the server's session ended in a panic; its open files may leak")
			reqR.Close()
			repW.Close()
		}
	}()
	_ = srv.Handle(reqR, repW)
}

// traceLog passes the server's own messages, about two lines per guest
// request, to the device's log at trace level: at debug they drowned every
// other line of a VM that reads files (containerd copies its shims' logs
// into its own). A logger without a trace level gets none of them.
type traceLog struct{ d *Device }

func (l traceLog) Printf(format string, v ...any) {
	if t, ok := l.d.log.(interface{ Tracef(string, ...any) }); ok {
		t.Tracef("9p server: "+format, v...)
	}
}

// Stop implements virtio.Session: it ends both loops and the server and
// waits for them.
func (s *session) Stop() {
	s.mu.Lock()
	s.stopping = true // replies from now on are dropped, not pushed
	s.mu.Unlock()
	_ = s.stop.Signal()
	<-s.requestsDone
	// Let the server answer what it holds before its request pipe ends:
	// hugelgupf/p9 v0.3.0's Handle waits for its handlers with a
	// WaitGroup that a receiver goroutine it spawned may still Add to,
	// a data race (and, rarely, a "WaitGroup is reused" panic) when
	// that Wait has to block. Ending the pipe once the handlers are done
	// keeps the Wait from blocking; the bound keeps a reset from
	// waiting long on a slow host file.
	deadline := time.Now().Add(drainTimeout)
drain:
	for s.toServerN.Load() > s.fromServerN.Load() && time.Now().Before(deadline) {
		select {
		case <-s.served: // the server is gone: nothing more will come
			break drain
		case <-time.After(time.Millisecond):
		}
	}
	time.Sleep(2 * time.Millisecond) // the handlers return after their replies
	s.toServer.CloseWithError(io.EOF)
	<-s.served
	<-s.repliesDone
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
				if _, err := s.toServer.Write(msg); err != nil {
					return // the server ended
				}
				s.toServerN.Add(1)
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
// it (false: the ring is empty, or the guest erred).
func (s *session) pop(chain *virtio.Chain) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
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

func (s *session) replies() {
	defer close(s.repliesDone)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(s.fromServer, hdr[:]); err != nil {
			return // the server ended
		}
		size := binary.LittleEndian.Uint32(hdr[:])
		if size < hdrLen || size > MaxMessage+hdrLen {
			// The server wrote what it must not: a host invariant broke.
			panic(fmt.Sprintf("virtio9p: server reply of %d bytes", size))
		}
		msg := make([]byte, size)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(s.fromServer, msg[4:]); err != nil {
			return
		}
		s.fromServerN.Add(1)
		s.deliver(msg)
	}
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
