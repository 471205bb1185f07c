package blk

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// iovMax is the most buffers one preadv/pwritev takes (Linux's IOV_MAX).
const iovMax = 1024

// slot is the storage of one request in flight: its chain (the views stay
// valid until the slot's next Pop) and the parsed header. sub and block
// are scratch space of a copy-on-write disk's requests (overlay.read, a
// block's copy-up), kept with the slot so that I/O allocates nothing.
type slot struct {
	chain virtio.Chain
	req   request
	views [][]byte
	sub   [][]byte
	block []byte
}

// cowBlock returns the slot's copy-up buffer, allocated on first use: at
// most InFlight blocks per session.
func (sl *slot) cowBlock() []byte {
	if sl.block == nil {
		sl.block = make([]byte, CopyOnWriteBlockSize)
	}
	return sl.block
}

// session is one activation: the dispatcher, the workers, and the slots
// they pass between them. See the package comment for who owns what.
type session struct {
	d    *Device
	q    *virtio.ActiveQueue
	fail func(error)
	disk disk

	qmu sync.Mutex // guards q: Pop by the dispatcher, Push by the workers

	free     chan *slot // slots not in flight (buffered: InFlight)
	work     chan *slot // popped requests for the workers (buffered: InFlight)
	quit     chan struct{}
	stop     *eventfd.EventFD
	failed   atomic.Bool
	inFlight atomic.Int64
	wg       sync.WaitGroup

	// abandon is set by Stop (a driver reset) before it closes quit: the
	// workers then finish the I/O they hold but push nothing. Drain (a
	// pause) leaves it clear, so they return every request they hold.
	abandon atomic.Bool
}

func newSession(d *Device, a virtio.Activation) (*session, error) {
	stop, err := eventfd.NewNonblocking()
	if err != nil {
		return nil, err
	}
	n := d.cfg.InFlight
	s := &session{
		d: d, q: a.Queues[0], fail: a.Fail,
		disk: disk{sectors: d.sectors, readOnly: d.cfg.ReadOnly, features: a.Features},
		free: make(chan *slot, n), work: make(chan *slot, n), quit: make(chan struct{}), stop: stop,
	}
	for range n {
		s.free <- &slot{}
	}
	return s, nil
}

func (s *session) start() {
	s.wg.Add(1 + s.d.cfg.InFlight)
	go func() { defer s.wg.Done(); s.dispatch() }()
	for range s.d.cfg.InFlight {
		go func() { defer s.wg.Done(); s.serve() }()
	}
}

// Stop implements virtio.Session, for a driver reset: it stops taking
// requests and waits for those in flight, whose I/O completes but which
// are not returned (the driver is tearing its rings down).
func (s *session) Stop() { s.shutdown(true) }

// shutdown stops the dispatcher, lets the workers finish what is in flight
// (returning it to the guest unless abandon is set), and waits for all of
// them. Called once, by Stop or Drain.
func (s *session) shutdown(abandon bool) {
	s.abandon.Store(abandon)
	close(s.quit)
	_ = s.stop.Signal()
	s.wg.Wait()
	s.stop.Close()
}

// guestError stops the device for a malformed chain or a broken ring: the
// driver must reset it. A *guestErr gives its kind; any other error is
// the virtqueue code's (virtio.GuestErrQueue).
func (s *session) guestError(err error) {
	kind := virtio.GuestErrQueue
	var ge *guestErr
	if errors.As(err, &ge) {
		kind = ge.kind
	}
	s.d.ctr.guestErrors.Add(kind)
	if !s.failed.Swap(true) {
		s.fail(err)
	}
}

// dispatch is the dispatcher goroutine: it waits for kicks, pops chains
// into free slots, parses their headers and hands them to the workers.
func (s *session) dispatch() {
	defer close(s.work) // the workers drain it and return
	fds := []unix.PollFd{
		{Fd: int32(s.q.Kick.FD()), Events: unix.POLLIN},
		{Fd: int32(s.stop.FD()), Events: unix.POLLIN},
	}
	for {
		if !s.failed.Load() && !s.popAvailable() {
			return
		}
		stopped, err := eventfd.PollStop(fds, -1)
		if err != nil {
			s.d.log.WithError(err).Error("blk: poll")
			return
		}
		if stopped {
			return
		}
		if n, _ := s.q.Kick.Wait(); n > 0 {
			s.d.ctr.kicks.Add(1)
		}
	}
}

// popAvailable pops every available chain, waiting for a free slot before
// each (that bounds the requests in flight), and re-enables kicks once the
// ring is empty. It returns false when the session is stopping.
func (s *session) popAvailable() bool {
	for {
		// A stopping session pops nothing more, even when a slot is
		// free too (select would pick either): each chain popped now
		// would hold the stop up for its I/O.
		select {
		case <-s.quit:
			return false
		default:
		}
		var sl *slot
		select {
		case sl = <-s.free:
		case <-s.quit:
			return false
		}
		s.qmu.Lock()
		ok, err := s.q.Pop(&sl.chain)
		for err == nil && !ok {
			// With VIRTIO_F_EVENT_IDX this also moves avail_event to
			// where the driver must kick next; a chain that came in
			// meanwhile is popped now rather than waiting for a kick
			// the driver may have skipped.
			var more bool
			if more, err = s.q.EnableNotification(); err != nil || !more {
				break
			}
			ok, err = s.q.Pop(&sl.chain)
		}
		s.qmu.Unlock()
		if err != nil || !ok {
			s.free <- sl
			if err != nil {
				s.guestError(err)
			}
			return true
		}
		if err := s.parse(sl); err != nil {
			s.free <- sl
			s.d.log.WithError(err).Warn("blk: malformed request, device needs reset")
			s.guestError(err)
			return true
		}
		n := uint64(s.inFlight.Add(1))
		if n > s.d.ctr.maxInFlight.Load() {
			s.d.ctr.maxInFlight.Store(n) // only the dispatcher stores it
		}
		s.work <- sl
	}
}

// parse copies the header out of the chain once and checks the request.
func (s *session) parse(sl *slot) error {
	var hdr [headerSize]byte
	r := sl.chain.Reader()
	r.Read(hdr[:])
	req, err := parseRequest(hdr, sl.chain.ReadableLen(), sl.chain.WritableLen(), s.disk)
	if err != nil {
		return fmt.Errorf("chain %d: %w", sl.chain.Head, err)
	}
	sl.req = req
	return nil
}

// testHookIO, set only by tests (export_test.go), runs in a worker before
// the I/O of each request, with the request's sector. It lets a test hold
// requests in flight (a slow disk) while it quiesces or resets the device.
var testHookIO atomic.Pointer[func(sector uint64)]

// serve is a worker goroutine: it runs requests and returns them to the
// guest until the dispatcher closes the work channel.
func (s *session) serve() {
	for sl := range s.work {
		if f := testHookIO.Load(); f != nil {
			(*f)(sl.req.sector)
		}
		written := s.run(sl)
		clear(sl.views) // drop references to guest memory
		sl.views = sl.views[:0]
		s.complete(sl, written)
		s.inFlight.Add(-1)
		s.free <- sl
	}
}

// complete writes nothing but the used entry: the status byte is already in
// place. It interrupts the guest when the queue's suppression asks for it.
// A session being drained (quit closed, abandon clear) still completes
// this way: that is how Drain returns what is in flight.
func (s *session) complete(sl *slot, written uint32) {
	if s.failed.Load() {
		return // the driver must reset the device; the ring is not trusted
	}
	if s.abandon.Load() {
		return // the driver reset the device: its rings are being torn down
	}
	s.qmu.Lock()
	err := s.q.Push(sl.chain.Head, written)
	need := false
	if err == nil {
		need, err = s.q.NeedsNotification()
	}
	s.qmu.Unlock()
	if err != nil {
		s.guestError(err)
		return
	}
	if need {
		s.d.ctr.interrupts.Add(1)
		s.q.Interrupt()
	}
}
