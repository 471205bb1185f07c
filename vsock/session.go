package vsock

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// session is one activation of the device: the queues, the two workers and
// the connections. A device reset ends the session (Stop), a quiesce too
// (Drain, quiesce.go), and a new activation starts a fresh one.
//
// Goroutines: the TX worker (txLoop) owns the TX queue; the RX worker
// (rxLoop) owns the epoll set and, under rxMu, shares the RX queue with
// producers doing a direct enqueue. Dial goroutines and timers only touch a
// connection under its mu and the ready list under rxMu.
//
// Lock order: conn.mu, then connMu or rxMu (both leaves, never nested);
// see the package comment. Nobody holds two conn.mu.
type session struct {
	d    *Device
	opts Options
	rx   *virtio.ActiveQueue
	tx   *virtio.ActiveQueue
	fail func(error)
	// drx and dtx are the datagram queues, nil unless the driver
	// negotiated FeatureDgram; the datagram worker owns both.
	drx, dtx *virtio.ActiveQueue
	// seqpacket: the driver accepted FeatureSeqpacket.
	seqpacket bool
	// sharedIRQ: the transport raises one interrupt for every queue
	// (virtio.Activation.SharedInterrupt), so one interrupt after both
	// rings were published serves both (txirq.go).
	sharedIRQ bool
	// ev is the event queue (5.10.6.7), nil when the driver did not set it
	// up or the vhost-user front-end keeps it. Used only under rxMu, by
	// the RX worker, which also watches its kicks.
	ev *virtio.ActiveQueue

	connMu sync.Mutex // guards conns, byFD, closed, drained, fence, fenceEnd
	conns  map[connKey]*conn
	byFD   map[int]*conn
	closed bool
	// drained: the session was closed by Drain (a quiesce), not a reset:
	// host connects that find it closed try the next session
	// (errQuiesced).
	drained bool
	// fence is non-nil from a transport reset until the guest has handled
	// its event (or fenceEnd passes): no connection is set up meanwhile
	// (event.go). It is closed when lifted, waking host connects that wait.
	fence    chan struct{}
	fenceEnd time.Time

	rxMu     sync.Mutex   // guards the RX and event queues, ready, inReady flags, rsts, rxChain, rxSpare, evPending
	ready    []*conn      // connections with work for the guest, FIFO
	rsts     []Header     // RSTs for connections that no longer exist
	rxChain  virtio.Chain // a control packet's buffer
	rxSpare  rxSpare      // buffers popped for a host read and left empty (rxspare.go)
	rxPushed bool         // used entries published since the last notification
	// evPending: a TRANSPORT_RESET waits for an event buffer; evChain is
	// the buffer it goes into. evDelivered: the last one was written and
	// the driver's available index was evMark then; the driver posting
	// past it means it has handled the event (event.go).
	evPending   bool
	evDelivered bool
	evMark      uint16
	evChain     virtio.Chain

	epfd       int
	wake       *eventfd.EventFD // wakes the RX worker
	stopRX     *eventfd.EventFD
	stopTX     *eventfd.EventFD
	resumeTX   *eventfd.EventFD // wakes the TX worker when a fence lifts
	stopDgram  *eventfd.EventFD // nil without datagrams
	rxSleeping atomic.Bool
	failed     atomic.Bool
	dials      atomic.Int64 // dial goroutines in flight (bounded by MaxConns)
	budget     budget       // the device-wide bound on buffered guest->host bytes
	env        connEnv      // what the connections share; env.mux is s
	wg         sync.WaitGroup
}

// epoll tags for the non-connection descriptors.
const (
	tagWake      = -1
	tagStop      = -2
	tagRxKick    = -3
	tagEventKick = -4
)

func newSession(d *Device, a virtio.Activation) (*session, error) {
	s := &session{
		d: d, opts: d.opts, rx: a.Queues[QueueRX], tx: a.Queues[QueueTX], fail: a.Fail,
		conns: map[connKey]*conn{}, byFD: map[int]*conn{}, epfd: -1,
		seqpacket: a.Features&FeatureSeqpacket != 0,
		sharedIRQ: a.SharedInterrupt,
		budget:    newBudget(&d.cfg),
	}
	s.env = connEnv{mux: s, cfg: &d.cfg, opts: d.opts, ctr: &d.ctr, log: d.log, budget: &s.budget}
	var err error
	cleanup := func() {
		for _, e := range []*eventfd.EventFD{s.wake, s.stopRX, s.stopTX, s.resumeTX, s.stopDgram} {
			if e != nil {
				e.Close()
			}
		}
		if s.epfd >= 0 {
			unix.Close(s.epfd)
		}
	}
	if s.wake, err = eventfd.NewNonblocking(); err != nil {
		cleanup()
		return nil, err
	}
	if s.stopRX, err = eventfd.NewNonblocking(); err != nil {
		cleanup()
		return nil, err
	}
	if s.stopTX, err = eventfd.NewNonblocking(); err != nil {
		cleanup()
		return nil, err
	}
	if s.resumeTX, err = eventfd.NewNonblocking(); err != nil {
		cleanup()
		return nil, err
	}
	if a.Features&FeatureDgram != 0 && d.dgram != nil {
		s.drx, s.dtx = a.Queues[QueueDgramRX], a.Queues[QueueDgramTX]
		if s.stopDgram, err = eventfd.NewNonblocking(); err != nil {
			cleanup()
			return nil, err
		}
	}
	if s.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		cleanup()
		return nil, fmt.Errorf("vsock: epoll: %w", err)
	}
	watch := []struct {
		fd  int
		tag int32
	}{{s.wake.FD(), tagWake}, {s.stopRX.FD(), tagStop}, {s.rx.Kick.FD(), tagRxKick}}
	if len(a.Queues) > QueueEvent && a.Queues[QueueEvent] != nil {
		s.ev = a.Queues[QueueEvent]
		watch = append(watch, struct {
			fd  int
			tag int32
		}{s.ev.Kick.FD(), tagEventKick})
	}
	for _, r := range watch {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: r.tag}
		if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, r.fd, &ev); err != nil {
			cleanup()
			return nil, fmt.Errorf("vsock: epoll add: %w", err)
		}
	}
	return s, nil
}

func (s *session) start() {
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.txLoop() }()
	go func() { defer s.wg.Done(); s.rxLoop() }()
	if s.stopDgram != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.dgramLoop() }()
	}
}

// Stop implements virtio.Session: it stops both workers, then closes every
// connection's host socket.
func (s *session) Stop() { s.shutdown(false) }

// shutdown ends the session: it stops the workers (each returns between
// passes, having returned what it popped but the TX chains a fence holds,
// which the TX worker puts back on its way out), closes the session to new
// connections and closes every connection's host socket. For a drain
// (Drain, quiesce.go) it then puts back the RX buffers left popped, once
// nobody else can pop any. Last, it closes the session's descriptors.
func (s *session) shutdown(drain bool) {
	_ = s.stopRX.Signal()
	_ = s.stopTX.Signal()
	if s.stopDgram != nil {
		_ = s.stopDgram.Signal()
	}
	s.wg.Wait()
	s.connMu.Lock()
	s.closed, s.drained = true, drain
	conns := s.conns
	s.conns, s.byFD = map[connKey]*conn{}, map[int]*conn{}
	if s.fence != nil {
		close(s.fence) // host connects waiting for it fail on closed
		s.fence = nil
	}
	s.connMu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		if c.sm.live() {
			c.sm.close()
			c.releaseLocked()
		}
		c.unlock()
	}
	if drain {
		// Every goroutine that could pop an RX buffer has stopped (the
		// workers) or found its connection closed under the lock taken
		// above.
		s.putBackRX()
	}
	unix.Close(s.epfd)
	s.wake.Close()
	s.stopRX.Close()
	s.stopTX.Close()
	s.resumeTX.Close()
	if s.stopDgram != nil {
		s.stopDgram.Close()
	}
}

// guestError counts a protocol violation by the guest that does not stop the
// device (the connection involved is reset).
func (s *session) guestError(kind virtio.GuestErrorKind, format string, args ...any) {
	s.d.ctr.guestErrors.Report(s.d.log, kind, "vsock: guest error: ", format, args...)
}

// failDevice reports a guest error that stops the device (a broken queue).
// The workers stop using the queues; the transport sets NEEDS_RESET.
func (s *session) failDevice(err error) {
	if s.failed.Swap(true) {
		return
	}
	s.d.ctr.guestErrors.Add(virtio.GuestErrQueue)
	s.fail(err)
}

// lookup finds a connection.
func (s *session) lookup(k connKey) *conn {
	s.connMu.Lock()
	c := s.conns[k]
	s.connMu.Unlock()
	return c
}

// addConn inserts a new connection, refusing past the limit or a duplicate.
func (s *session) addConn(c *conn) error {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	switch {
	case s.closed && s.drained:
		return errQuiesced
	case s.closed:
		return fmt.Errorf("vsock: device reset")
	case s.fence != nil:
		return errFenced
	case len(s.conns) >= s.d.cfg.MaxConns:
		return fmt.Errorf("vsock: connection limit (%d) reached", s.d.cfg.MaxConns)
	case s.conns[c.key] != nil:
		return fmt.Errorf("vsock: connection %d<->%d exists", c.key.hostPort, c.key.guestPort)
	}
	s.conns[c.key] = c
	s.d.ctr.connsOpened.Add(1)
	s.d.ctr.connsOpen.Add(1)
	return nil
}

// allocHostPortLocked picks a free host-side port for a host-initiated
// connection to guestPort, from [2^30, 2^31), round robin from where the
// device's previous session left off (Device.portSeq). At most
// len(conns) ports can be taken, so len(conns)+1 candidates always contain a
// free one. Called with connMu held.
func (s *session) allocHostPortLocked(guestPort uint32) (uint32, bool) {
	for i := 0; i <= len(s.conns); i++ {
		p := hostPortBase + (s.d.portSeq.Add(1)-1)%(hostPortLimit-hostPortBase)
		if s.conns[connKey{p, guestPort}] == nil {
			return p, true
		}
	}
	return 0, false
}

// newConn returns a connection with no credit granted yet: its first
// packet to the guest (REQUEST or RESPONSE) takes its window from the
// budget (grantLocked).
func (s *session) newConn(k connKey, typ uint16, sm connSM) *conn {
	return &conn{key: k, typ: typ, env: &s.env, fd: -1, sm: sm}
}

// watch implements mux: fd joins the descriptor index before the epoll
// set, so an edge the ADD reports at once (data or a hang-up already there)
// finds the connection; the RX worker then waits for c.mu, which the caller
// holds until c owns fd. An edge dropped for want of its connection would
// not come again: a lost hang-up left a short read taken for drained and
// the end of the stream never read (found with Options.ReadinessGate, which
// leaves no later EPOLLOUT edge to repeat it).
func (s *session) watch(c *conn, fd int, events uint32) error {
	s.connMu.Lock()
	s.byFD[fd] = c
	s.connMu.Unlock()
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		s.unwatch(c, fd)
		return fmt.Errorf("vsock: epoll add socket: %w", err)
	}
	return nil
}

// rearm implements mux.
func (s *session) rearm(fd int, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	return unix.EpollCtl(s.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// unwatch implements mux.
func (s *session) unwatch(c *conn, fd int) {
	s.connMu.Lock()
	if s.byFD[fd] == c {
		delete(s.byFD, fd)
	}
	s.connMu.Unlock()
}

// remove implements mux: a closed connection leaves the table (connMu
// nests inside conn.mu only for map updates, never the other way).
func (s *session) remove(c *conn) {
	s.connMu.Lock()
	if s.conns[c.key] == c {
		delete(s.conns, c.key)
	}
	s.connMu.Unlock()
}

// refuseGuest answers a guest REQUEST that gets no connection with an RST
// (Stats.ConnsRefused).
func (s *session) refuseGuest(rst Header) {
	s.d.ctr.connsRefused.Add(1)
	s.sendRst(rst)
}

// sendRst queues an RST (queueRst) and wakes the RX worker for it: for
// callers that hold no connection lock.
func (s *session) sendRst(h Header) {
	if s.queueRst(h) {
		s.wakeRX()
	}
}

// queueRst queues an RST to the guest for a connection that no longer
// exists (h's ports) and reports whether the RX worker must be woken,
// which the caller does once it holds no connection lock (sendRst, or
// conn.unlock). It keeps h.Type when it is TypeSeqpacket and the
// driver negotiated it (a Linux guest ignores an RST whose type is not its
// socket's) and sends TypeStream otherwise. The queue is bounded; beyond it RSTs are dropped
// and counted (the guest's own timeouts then clean up).
func (s *session) queueRst(h Header) (wake bool) {
	h.Op = OpRst
	if h.Type != TypeSeqpacket || !s.seqpacket {
		h.Type = TypeStream
	}
	h.Len, h.Flags, h.BufAlloc, h.FwdCnt = 0, 0, 0, 0
	s.rxMu.Lock()
	if len(s.rsts) >= s.d.cfg.MaxConns+256 {
		s.rxMu.Unlock()
		s.d.ctr.droppedRsts.Add(1)
		return false
	}
	s.rsts = append(s.rsts, h)
	s.rxMu.Unlock()
	return true
}

// markReadyLocked puts c on the RX ready list (once). Called with c.mu held.
func (s *session) markReadyLocked(c *conn) {
	s.rxMu.Lock()
	if !c.inReady {
		c.inReady = true
		s.ready = append(s.ready, c)
	}
	s.rxMu.Unlock()
}

// wakeRX wakes the RX worker if it sleeps.
func (s *session) wakeRX() {
	if s.rxSleeping.Load() {
		_ = s.wake.Signal()
	}
}

// connectFromHost implements Device.ConnectFromHost (typ TypeStream) and
// Device.ConnectSeqpacketFromHost (TypeSeqpacket) on this session. While a
// transport reset waits for the guest (a fence) it waits too, up to
// deadline.
func (s *session) connectFromHost(fd int, typ uint16, port uint32, prefix []byte, deadline time.Time) error {
	if typ == TypeSeqpacket && !s.seqpacket {
		closeFD(fd)
		s.d.ctr.connsRefused.Add(1)
		return fmt.Errorf("vsock: the guest driver did not negotiate SEQPACKET")
	}
	for {
		if err := s.waitFence(deadline); err != nil {
			closeFD(fd)
			return err
		}
		err := s.startHostConn(fd, typ, port, prefix, deadline)
		if !errors.Is(err, errFenced) {
			return err
		}
	}
}

// startHostConn adds a host-initiated connection over fd and sends the
// guest its REQUEST. It closes fd on any error but errFenced and
// errQuiesced (the caller keeps it for the next session).
func (s *session) startHostConn(fd int, typ uint16, port uint32, prefix []byte, deadline time.Time) error {
	s.connMu.Lock()
	hostPort, ok := s.allocHostPortLocked(port)
	s.connMu.Unlock()
	if !ok {
		closeFD(fd)
		s.d.ctr.connsRefused.Add(1)
		return fmt.Errorf("vsock: no free host port")
	}
	c := s.newConn(connKey{hostPort, port}, typ, newHostSM())
	c.prefix = append([]byte(nil), prefix...)
	wake := false
	defer func() { // after the unlock below: wake the RX worker once c is free
		if wake {
			s.wakeRX()
		}
	}()
	// Hold c.mu before c is in the table: a reset (or a guest packet for
	// the new port) must not close c before it owns fd, or fd would leak.
	c.mu.Lock()
	defer c.unlock()
	if err := s.addConn(c); err != nil {
		if !errors.Is(err, errFenced) && !errors.Is(err, errQuiesced) {
			closeFD(fd)
			s.d.ctr.connsRefused.Add(1)
		}
		return err
	}
	c.fd = fd // registered with epoll once the guest accepts
	c.timer = time.AfterFunc(time.Until(deadline), func() { c.onTimer((*connSM).onConnectTimeout) })
	wake = s.emitOrQueueLocked(c, nil)
	return nil
}
