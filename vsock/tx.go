package vsock

import (
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// txBatch is how many TX chains the worker pops before processing them, so
// that runs of packets for one connection can share a lock (Options.BatchLock).
const txBatch = 64

// txPassBudget bounds the TX chains one pass handles: a guest that keeps
// the ring full cannot keep the worker from its stop eventfd (Stop, which
// the transport calls under its own lock, waits for it) nor from a
// resume. A pass that spends it returns with work left, and the worker
// looks at its eventfds without waiting before the next one.
const txPassBudget = 4 * txBatch

// txPacket is one popped TX chain with its header decoded once.
type txPacket struct {
	chain virtio.Chain
	body  virtio.Reader // the chain after the header: the payload
	hdr   Header
	ok    bool // the header was readable
}

// txState is the TX worker's scratch, reused across passes.
type txState struct {
	pkts    [txBatch]txPacket
	payload [][]byte
	iov     iovecs
	// The run of packets currently being processed under one lock.
	cur    *conn
	curKey connKey
	wantRx bool // cur has work for the RX side: mark it ready after unlock
	// runViews are cur's payloads not yet written to its host socket: with
	// BatchLock a run's payloads go out in one writev at the end of the run.
	// They point into TX buffers pushed but not yet published, which the
	// guest cannot reuse before handleBatch publishes them, after endRun.
	runViews [][]byte
	// seqViews is scratch for one SEQPACKET record sent straight from
	// guest memory.
	seqViews [][]byte
	hdrBuf   [HeaderSize]byte
	// pkts[held:heldN] were popped but are held, the first a REQUEST that
	// came while a transport reset waits for the guest (heldN 0: none).
	held, heldN int
	// rx is scratch for host data this worker puts in the RX ring itself
	// (DirectEnqueue).
	rx rxState
	// irq is the RX interrupt of this worker's direct enqueues, held to
	// the end of the batch (IRQCoalesce, txirq.go).
	irq txIRQ
}

// txLoop is the TX worker: woken by the TX queue's kick eventfd, it drains
// guest packets and writes their payloads to host sockets.
func (s *session) txLoop() {
	st := &txState{}
	st.rx.irq = &st.irq
	defer s.putBackHeld(st) // quiesce.go
	fds := []unix.PollFd{{Fd: int32(s.tx.Kick.FD()), Events: unix.POLLIN}, {Fd: int32(s.resumeTX.FD()), Events: unix.POLLIN},
		{Fd: int32(s.stopTX.FD()), Events: unix.POLLIN}}
	if s.opts.KickSuppress {
		// Start with kicks enabled: the driver must wake us the first time.
		if _, err := s.tx.EnableNotification(); err != nil {
			s.failDevice(err)
		}
	}
	for {
		wait := -1 // until a kick, a resume or the stop
		if !s.failed.Load() {
			if s.processTX(st) {
				wait = 0 // the pass spent its budget: look, then go on
			}
			s.flushTXIRQ(&st.irq, false) // nothing is held past a batch; if it were, it goes now
		}
		stopped, err := eventfd.PollStop(fds, wait)
		if err != nil {
			s.d.log.WithError(err).Error("vsock: tx poll")
			return
		}
		if stopped {
			return
		}
		if fds[1].Revents != 0 {
			_, _ = s.resumeTX.Wait()
		}
		if n, _ := s.tx.Kick.Wait(); n > 0 {
			s.d.ctr.txKicks.Add(1)
		}
	}
}

// processTX drains the TX ring, txPassBudget chains at most, and reports
// whether it stopped at the budget with chains possibly left (the caller
// comes back without waiting for a kick). With KickSuppress the guest's
// kicks stay disabled for the whole pass, host writes included, and are
// re-enabled only at the end with a final re-check of the ring (seed 002);
// without it they are re-enabled as soon as each batch is popped, before
// the host writes. A pass cut at the budget leaves them as they are: the
// next pass follows at once.
func (s *session) processTX(st *txState) (more bool) {
	if st.heldN > 0 {
		// Packets held behind a REQUEST while a transport reset waits
		// for the guest go first, in order, once it is over.
		if s.fenced() {
			return false
		}
		from, n := st.held, st.heldN
		st.heldN = 0
		s.handleBatch(st, from, n)
		if st.heldN > 0 || s.failed.Load() {
			return false
		}
	}
	budget := txPassBudget
	for {
		if s.opts.KickSuppress {
			if err := s.tx.DisableNotification(); err != nil {
				s.failDevice(err)
				return false
			}
			s.d.ctr.kickSuppressions.Add(1)
		}
		for {
			n, err := s.popTX(st)
			if err != nil {
				s.failDevice(err)
				return false
			}
			if n == 0 {
				break
			}
			if s.failed.Load() {
				// Failed (by the RX side) since the last look: what
				// was popped may have been published after the failure,
				// and a failed device does not act on it.
				return false
			}
			if !s.opts.KickSuppress {
				if _, err := s.tx.EnableNotification(); err != nil {
					s.failDevice(err)
					return false
				}
			}
			s.handleBatch(st, 0, n)
			if s.failed.Load() || st.heldN > 0 {
				return false // held: resumeTX brings the worker back
			}
			if hook := s.d.afterTXBatch.Load(); hook != nil {
				(*hook)()
			}
			if budget -= n; budget <= 0 {
				s.d.ctr.txPassesCut.Add(1)
				return true
			}
		}
		again, err := s.tx.EnableNotification()
		if err != nil {
			s.failDevice(err)
			return false
		}
		if !again {
			return false
		}
	}
}

// popTX pops up to txBatch chains and decodes their headers.
func (s *session) popTX(st *txState) (int, error) {
	n := 0
	for n < txBatch {
		p := &st.pkts[n]
		ok, err := s.tx.Pop(&p.chain)
		if err != nil || !ok {
			return n, err
		}
		p.body = p.chain.Reader()
		p.ok = p.body.Read(st.hdrBuf[:]) == HeaderSize
		if p.ok {
			p.hdr.Decode(st.hdrBuf[:])
		}
		n++
	}
	return n, nil
}

// handleBatch processes popped packets pkts[from:n] in order, returns their
// chains and interrupts the guest once for the batch (on a shared line the
// RX interrupt of the batch's direct enqueues included: txirq.go). A REQUEST that comes
// while a transport reset waits for the guest stops it: that packet and the
// rest stay popped, held (st.held) until the fence lifts, so that no
// connection is set up that the guest's handling of the event would reset
// behind the device's back.
func (s *session) handleBatch(st *txState, from, n int) {
	for i := from; i < n; i++ {
		p := &st.pkts[i]
		if p.ok && p.hdr.Op == OpRequest && s.fenced() {
			st.held, st.heldN = i, n
			break
		}
		s.handlePacket(st, p)
		if err := s.tx.PushNoPublish(p.chain.Head, 0); err != nil {
			s.endRun(st)
			s.failDevice(err)
			return
		}
	}
	s.endRun(st)
	if s.failed.Load() {
		// The device failed meanwhile (the RX side can fail it): it must
		// not touch the rings any more, not even to return these buffers.
		return
	}
	if err := s.tx.Publish(); err != nil {
		s.failDevice(err)
		return
	}
	if err := s.notifyTX(&st.irq); err != nil {
		s.failDevice(err)
	}
}

// handlePacket processes one guest packet.
func (s *session) handlePacket(st *txState, p *txPacket) {
	if !p.ok {
		s.endRun(st)
		s.guestError(virtio.GuestErrHeader, "TX chain %d of %d bytes cannot hold a packet header", p.chain.Head, p.chain.ReadableLen())
		return
	}
	h := &p.hdr
	s.d.ctr.txPackets.Add(1)
	if h.SrcCID != s.d.cfg.CID || h.DstCID != CIDHost {
		// Not ours to answer: a guest cannot speak for another CID, and
		// only the host is reachable through this device.
		s.endRun(st)
		s.guestError(virtio.GuestErrAddress, "packet %v: bad CIDs (guest is %d)", h, s.d.cfg.CID)
		return
	}
	key := connKey{hostPort: h.DstPort, guestPort: h.SrcPort}
	if h.Type != TypeStream && (h.Type != TypeSeqpacket || !s.seqpacket) {
		s.endRun(st)
		if h.Op != OpRst {
			s.guestError(virtio.GuestErrType, "packet %v: unsupported socket type (SEQPACKET negotiated: %v)", h, s.seqpacket)
			s.resetPorts(h, key)
		}
		return
	}
	if uint64(h.Len) > p.body.Len() || h.Len > MaxPacketPayload {
		s.endRun(st)
		s.guestError(virtio.GuestErrLength, "packet %v: len %d but the chain holds %d payload bytes (max %d)",
			h, h.Len, p.body.Len(), MaxPacketPayload)
		s.resetPorts(h, key)
		return
	}
	if h.Op == OpRequest {
		s.endRun(st)
		s.guestRequest(h, key)
		return
	}
	c := s.beginRun(st, key)
	if c == nil {
		if h.Op != OpRst {
			s.sendRst(Header{SrcPort: key.hostPort, DstPort: key.guestPort, Type: h.Type})
		}
		return
	}
	if !c.sm.live() {
		s.endRun(st)
		return
	}
	if !keepsRunData(h, c.typ) {
		// This packet may end the connection: the bytes the guest sent
		// before it, waiting in the run (BatchLock), reach the host
		// socket first, as they would have without BatchLock.
		c.writeRunLocked(st)
	}
	if h.Type != c.typ {
		// A connection keeps the type it was made with (Linux resets a
		// socket on a packet of another type too); an RST is never
		// answered with one.
		s.guestError(virtio.GuestErrType, "packet %v on a connection of type %d", h, c.typ)
		c.applyLocked(c.sm.onWrongType(h.Op))
		s.endRun(st)
		return
	}
	c.updatePeerCredit(h)
	prev := c.sm.state
	a := c.sm.onGuestOp(h.Op, h.Flags)
	if a&actProtoErr != 0 {
		s.guestError(virtio.GuestErrOp, "packet %v on %s connection %v", h, prev, c.key)
	}
	if a&actDropMsg != 0 && len(c.msg) > 0 {
		// The rest of this message will never come: no record for it.
		s.d.log.Debugf("vsock: dropped an unfinished %d-byte message on %v at the guest's shutdown", len(c.msg), c.key)
		c.msg = nil
	}
	if a&actDropLate != 0 {
		// Nobody can take the data: drop it and keep waiting for the
		// guest's RST (or the close timeout).
		s.d.ctr.lateRW.Add(1)
		s.d.log.Debugf("vsock: dropped %d bytes the guest sent to %v after the host closed", h.Len, c.key)
	}
	c.applyLocked(a)
	switch {
	case a&actFlush != 0:
		c.flushForShutdownLocked(st)
	case h.Op == OpRW && rwAdmitted(a):
		st.payload = p.body.Views(st.payload[:0], uint64(h.Len))
		c.guestData(st, h)
	}
	if c.hasRxWork() {
		st.wantRx = true
	}
	if !s.opts.BatchLock {
		s.endRun(st)
	}
}

// keepsRunData reports whether a packet for the run's connection (of type
// typ) leaves the payloads waiting in the run where they are: an RW or a
// credit packet of the connection's type, which cannot end it before
// their bytes are written. Anything else (RST, SHUTDOWN, a RESPONSE or
// unknown op that resets it, a packet of another type) may close the host
// socket, so the run's bytes go out before it is handled. An RW that
// overruns its credit resets the connection too: guestData writes the run
// before it does.
func keepsRunData(h *Header, typ uint16) bool {
	if h.Type != typ {
		return false
	}
	switch h.Op {
	case OpRW, OpCreditUpdate, OpCreditRequest:
		return true
	}
	return false
}

// resetPorts answers a packet the device rejects before any connection
// sees it with an RST for its ports, which tells the guest they are free: a
// connection on them is reset with it (or it would live on unseen), and a
// REQUEST is counted as refused. Without a connection an RST is never
// answered with one.
func (s *session) resetPorts(h *Header, key connKey) {
	if c := s.lookup(key); c != nil {
		c.mu.Lock()
		c.resetLocked()
		c.unlock()
		return
	}
	if h.Op == OpRst {
		return
	}
	if h.Op == OpRequest {
		s.d.ctr.connsRefused.Add(1)
	}
	s.sendRst(Header{SrcPort: key.hostPort, DstPort: key.guestPort, Type: h.Type})
}

// beginRun locks the connection for key, reusing the run's lock when the
// previous packet was for the same connection (Options.BatchLock).
func (s *session) beginRun(st *txState, key connKey) *conn {
	if st.cur != nil && st.curKey == key && st.cur.sm.state != stateClosed {
		s.d.ctr.batchedPackets.Add(1)
		return st.cur
	}
	s.endRun(st)
	c := s.lookup(key)
	if c == nil {
		return nil
	}
	c.mu.Lock()
	st.cur, st.curKey = c, key
	return c
}

// endRun finishes the current run: flushes coalesced small writes, decides
// on one credit update for the whole run, unlocks, and only then makes the
// connection's RX work visible (deferred readiness, seed 000).
func (s *session) endRun(st *txState) {
	c := st.cur
	if c == nil {
		return
	}
	st.cur = nil
	c.writeRunLocked(st)
	if c.sm.state != stateClosed {
		if c.toHost.Len() > 0 {
			c.flushLocked(&st.iov)
		}
		c.creditCheckLocked()
		if c.hasRxWork() {
			st.wantRx = true
		}
	}
	want := st.wantRx && c.sm.state != stateClosed
	st.wantRx = false
	wake := false
	if want {
		wake = s.emitOrQueueLocked(c, &st.rx)
	}
	c.interestLocked()
	c.unlock()
	if wake {
		s.wakeRX()
	}
}

// guestRequest handles a guest's connection request to a host port.
func (s *session) guestRequest(h *Header, key connKey) {
	rst := Header{SrcPort: key.hostPort, DstPort: key.guestPort, Type: h.Type}
	if old := s.lookup(key); old != nil {
		old.mu.Lock()
		s.guestError(virtio.GuestErrOp, "REQUEST for existing connection %d<->%d", key.hostPort, key.guestPort)
		old.resetLocked()
		old.unlock()
		return
	}
	if s.d.cfg.Dialer == nil {
		s.refuseGuest(rst)
		return
	}
	if _, ok := s.d.cfg.Dialer.(SeqpacketDialer); h.Type == TypeSeqpacket && !ok {
		s.d.log.WithField("port", key.hostPort).Debug("vsock: SEQPACKET connection refused: the dialer makes stream sockets only")
		s.refuseGuest(rst)
		return
	}
	// A guest that sends REQUEST then RST in a loop frees its table slot
	// at once while the dial goes on; the dials themselves are bounded too.
	if s.dials.Load() >= int64(s.d.cfg.MaxConns) {
		s.d.log.Debug("vsock: too many guest connection attempts in flight")
		s.refuseGuest(rst)
		return
	}
	c := s.newConn(key, h.Type, newGuestSM())
	c.updatePeerCredit(h)
	if err := s.addConn(c); err != nil {
		s.d.log.WithError(err).Debug("vsock: guest connection refused")
		s.refuseGuest(rst)
		return
	}
	s.dials.Add(1)
	go s.dial(c)
}

// dial connects a guest-initiated connection to the host in the background,
// so a slow or full listener never blocks a worker.
func (s *session) dial(c *conn) {
	defer s.dials.Add(-1)
	var fd int
	var err error
	if sd, ok := s.d.cfg.Dialer.(SeqpacketDialer); ok && c.typ == TypeSeqpacket {
		// A stream listener at the address refuses with EPROTOTYPE:
		// like any dial error, the guest gets RST (ECONNRESET).
		fd, err = sd.DialSeqpacket(c.key.guestPort, c.key.hostPort, s.d.cfg.ConnectTimeout)
	} else {
		fd, err = s.d.cfg.Dialer.Dial(c.key.guestPort, c.key.hostPort, s.d.cfg.ConnectTimeout)
	}
	wake := false
	defer func() { // after the unlock below: wake the RX worker once c is free
		if wake {
			s.wakeRX()
		}
	}()
	c.mu.Lock()
	defer c.unlock()
	switch {
	case err != nil:
		// fd is no descriptor: a Dialer returns none with an error.
		s.d.log.WithError(err).WithField("port", c.key.hostPort).Debug("vsock: host refused guest connection")
	case c.sm.state == stateGuestConnecting:
		// The socket joins the epoll set before the connection counts
		// as established; if it cannot, the attempt is refused.
		if rerr := c.registerLocked(fd); rerr != nil {
			closeFD(fd)
			s.d.log.WithError(rerr).Warn("vsock: guest connection")
			err = rerr
		}
	default:
		closeFD(fd) // the guest gave up, or the device was reset
	}
	a, keep := c.sm.onDialed(err != nil)
	c.applyLocked(a)
	if keep {
		wake = s.emitOrQueueLocked(c, nil)
	}
}
