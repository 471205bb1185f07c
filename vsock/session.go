package vsock

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// session is one activation of the device: the queues, the two workers and
// the connections. A device reset ends the session (shutdown) and a new
// activation starts a fresh one.
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
	// ev is the event queue (5.10.6.7), nil when the driver did not set it
	// up or the vhost-user front-end keeps it. Used only under rxMu, by
	// the RX worker, which also watches its kicks.
	ev *virtio.ActiveQueue

	connMu   sync.Mutex // guards conns, byFD, nextPort, closed, fence, fenceEnd
	conns    map[connKey]*conn
	byFD     map[int]*conn
	nextPort uint32
	closed   bool
	// fence is non-nil from a transport reset until the guest has handled
	// its event (or fenceEnd passes): no connection is set up meanwhile
	// (event.go). It is closed when lifted, waking host connects that wait.
	fence    chan struct{}
	fenceEnd time.Time

	rxMu     sync.Mutex                // guards the RX and event queues, ready, inReady flags, rsts, rxChain(s), evPending
	ready    []*conn                   // connections with work for the guest, FIFO
	rsts     []Header                  // RSTs for connections that no longer exist
	rxChain  virtio.Chain              // a control packet's buffer
	rxChains [rxReadBatch]virtio.Chain // the buffers one host read fills
	rxPushed bool                      // used entries published since the last notification
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
		conns: map[connKey]*conn{}, byFD: map[int]*conn{}, nextPort: hostPortBase, epfd: -1,
		seqpacket: a.Features&FeatureSeqpacket != 0,
		budget:    newBudget(&d.cfg),
	}
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

// shutdown stops both workers, then closes every connection's host socket.
func (s *session) shutdown() {
	_ = s.stopRX.Signal()
	_ = s.stopTX.Signal()
	if s.stopDgram != nil {
		_ = s.stopDgram.Signal()
	}
	s.wg.Wait()
	s.connMu.Lock()
	s.closed = true
	conns := s.conns
	s.conns, s.byFD = map[connKey]*conn{}, map[int]*conn{}
	if s.fence != nil {
		close(s.fence) // host connects waiting for it fail on closed
		s.fence = nil
	}
	s.connMu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		s.closeConnLocked(c)
		c.mu.Unlock()
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
func (s *session) guestError(kind GuestErrorKind, format string, args ...any) {
	s.d.ctr.guestErrors[kind].Add(1)
	s.d.log.Warnf("vsock: guest error: "+format, args...)
}

// failDevice reports a guest error that stops the device (a broken queue).
// The workers stop using the queues; the transport sets NEEDS_RESET.
func (s *session) failDevice(err error) {
	if s.failed.Swap(true) {
		return
	}
	s.d.ctr.guestErrors[GuestErrQueue].Add(1)
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
// connection to guestPort, from [2^30, 2^31), round robin. At most
// len(conns) ports can be taken, so len(conns)+1 candidates always contain a
// free one. Called with connMu held.
func (s *session) allocHostPortLocked(guestPort uint32) (uint32, bool) {
	for i := 0; i <= len(s.conns); i++ {
		p := s.nextPort
		s.nextPort++
		if s.nextPort >= hostPortLimit {
			s.nextPort = hostPortBase
		}
		if s.conns[connKey{p, guestPort}] == nil {
			return p, true
		}
	}
	return 0, false
}

// newConn returns a connection with no credit granted yet: its first
// packet to the guest (REQUEST or RESPONSE) takes its window from the
// budget (grantLocked).
func newConn(k connKey, typ uint16) *conn {
	return &conn{key: k, typ: typ, fd: -1}
}

// registerFDLocked hands a connected host socket to the connection and the epoll
// set. Called with c.mu held.
func (s *session) registerFDLocked(c *conn, fd int) error {
	// The workers read and write host sockets expecting EAGAIN, never a
	// block: whatever the Dialer or the host client handed over.
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("vsock: host socket: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("vsock: epoll add socket: %w", err)
	}
	c.fd = fd
	s.connMu.Lock()
	s.byFD[fd] = c
	s.connMu.Unlock()
	// Data may already be waiting: the edge for it may have come before
	// registration.
	c.hostReadable = true
	return nil
}

// closeConnLocked closes the host socket and marks the connection closed;
// the caller removes it from the table (removeConn) unless shutdown did.
// Called with c.mu held.
func (s *session) closeConnLocked(c *conn) {
	if c.state == stateClosed {
		return
	}
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.fd >= 0 {
		s.connMu.Lock()
		if s.byFD[c.fd] == c {
			delete(s.byFD, c.fd)
		}
		s.connMu.Unlock()
		closeFD(c.fd)
		c.fd = -1
	}
	c.state = stateClosed
	// Whatever the connection could still have made us buffer goes back
	// to the device's budget.
	if exp := c.exposureLocked(); s.budget.shrink(exp, exp) {
		s.wakeRX()
	}
	c.bufAlloc, c.grantFwd = 0, c.fwdCnt
	c.toHost.Reset()
	c.prefix = nil
	c.msg, c.rec, c.recOff, c.seqNeed = nil, nil, 0, 0
	c.recs.reset()
	c.pend = 0
	s.d.ctr.connsOpen.Add(-1)
}

// removeConnLocked drops a closed connection from the table. Called with c.mu held
// (connMu nests inside conn.mu only for this map update, never the other way).
func (s *session) removeConnLocked(c *conn) {
	s.connMu.Lock()
	if s.conns[c.key] == c {
		delete(s.conns, c.key)
	}
	s.connMu.Unlock()
}

// resetConnLocked closes c and sends the guest an RST for it: the device
// gives up on the connection (a refusal or a timeout before it was
// established, a reset after), and counts it so.
func (s *session) resetConnLocked(c *conn) {
	s.countAbortLocked(c, false)
	s.closeWithRstLocked(c)
}

// countAbortLocked counts a connection that ends by an RST, the device's
// (guestRst false) or the guest's, by its state: an attempt never
// established was refused (Stats.ConnsRefused), an established connection
// reset (ConnsReset). The RST that answers a SHUTDOWN(BOTH) is the orderly
// end and is not counted: the guest's arrives in stateClosing, the
// device's goes through closeWithRstLocked. The device resetting a
// connection in stateClosing (the guest did not answer in time, or broke
// the protocol meanwhile) is a reset. Called with c.mu held, before the
// connection closes.
func (s *session) countAbortLocked(c *conn, guestRst bool) {
	switch c.state {
	case stateGuestConnecting, stateHostConnecting:
		s.d.ctr.connsRefused.Add(1)
	case stateEstablished:
		s.d.ctr.connsReset.Add(1)
	case stateClosing:
		if !guestRst {
			s.d.ctr.connsReset.Add(1)
		}
	}
}

// refuseGuest answers a guest REQUEST that gets no connection with an RST
// (Stats.ConnsRefused).
func (s *session) refuseGuest(rst Header) {
	s.d.ctr.connsRefused.Add(1)
	s.queueRst(rst)
}

// closeWithRstLocked closes c and sends the guest an RST for it, counting
// nothing. Called with c.mu held.
func (s *session) closeWithRstLocked(c *conn) {
	if c.state == stateClosed {
		return
	}
	s.closeConnLocked(c)
	s.removeConnLocked(c)
	s.queueRst(Header{SrcPort: c.key.hostPort, DstPort: c.key.guestPort, Type: c.typ})
}

// queueRst queues an RST to the guest for a connection that no longer
// exists (h's ports). It keeps h.Type when it is TypeSeqpacket and the
// driver negotiated it (a Linux guest ignores an RST whose type is not its
// socket's) and sends TypeStream otherwise. The queue is bounded; beyond it RSTs are dropped
// and counted (the guest's own timeouts then clean up).
func (s *session) queueRst(h Header) {
	h.Op = OpRst
	if h.Type != TypeSeqpacket || !s.seqpacket {
		h.Type = TypeStream
	}
	h.Len, h.Flags, h.BufAlloc, h.FwdCnt = 0, 0, 0, 0
	s.rxMu.Lock()
	if len(s.rsts) >= s.d.cfg.MaxConns+256 {
		s.rxMu.Unlock()
		s.d.ctr.droppedRsts.Add(1)
		return
	}
	s.rsts = append(s.rsts, h)
	s.rxMu.Unlock()
	s.wakeRX()
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
// guest its REQUEST. It closes fd on any error but errFenced.
func (s *session) startHostConn(fd int, typ uint16, port uint32, prefix []byte, deadline time.Time) error {
	s.connMu.Lock()
	hostPort, ok := s.allocHostPortLocked(port)
	s.connMu.Unlock()
	if !ok {
		closeFD(fd)
		s.d.ctr.connsRefused.Add(1)
		return fmt.Errorf("vsock: no free host port")
	}
	c := newConn(connKey{hostPort, port}, typ)
	c.state = stateHostConnecting
	c.prefix = append([]byte(nil), prefix...)
	// Hold c.mu before c is in the table: a reset (or a guest packet for
	// the new port) must not close c before it owns fd, or fd would leak.
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := s.addConn(c); err != nil {
		if !errors.Is(err, errFenced) {
			closeFD(fd)
			s.d.ctr.connsRefused.Add(1)
		}
		return err
	}
	c.fd = fd // registered with epoll once the guest accepts
	c.pend |= pendRequest
	c.timer = time.AfterFunc(time.Until(deadline), func() { s.connectTimeout(c) })
	s.emitOrQueueLocked(c, nil)
	return nil
}

// connectTimeout gives up on a connection the guest did not answer in time.
func (s *session) connectTimeout(c *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateHostConnecting || c.state == stateGuestConnecting {
		s.d.log.WithField("port", c.key.guestPort).Debug("vsock: connection attempt timed out")
		s.resetConnLocked(c)
	}
}

// closeTimeout resets a connection the guest did not finish closing in time.
func (s *session) closeTimeout(c *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateClosing {
		s.d.log.WithField("port", c.key.guestPort).Debug("vsock: guest did not answer SHUTDOWN; resetting")
		s.resetConnLocked(c)
	}
}
