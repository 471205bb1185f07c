package vsock

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// rxBudget bounds the data packets one connection sends per turn, so one
// busy connection cannot starve the others.
const rxBudget = 16

// rxState is the RX worker's scratch.
type rxState struct {
	events [64]unix.EpollEvent
	iov    iovecs
	views  [][]byte
	rooms  [rxReadBatch]uint64       // payload room of each popped buffer
	chains [rxReadBatch]virtio.Chain // the buffers one host read fills
	pos    [rxReadBatch]uint16       // the available-ring index each was popped from
	// irq is the TX worker's held interrupt when this is its scratch
	// (the RX interrupts of its direct enqueues may join it: txirq.go);
	// nil for every other producer.
	irq *txIRQ
}

// rxLoop is the RX worker: it waits on epoll for host sockets, RX kicks (the
// guest posted buffers) and wake-ups from producers, and fills guest RX
// buffers from pending control packets and readable host sockets.
func (s *session) rxLoop() {
	st := &rxState{}
	// RX buffers are only interesting when we have run out of them, so the
	// guest's RX kicks start disabled.
	if err := s.rx.DisableNotification(); err != nil {
		s.failDevice(err)
	}
	// Likewise event buffers matter only while an event waits for one.
	if s.ev != nil {
		if err := s.ev.DisableNotification(); err != nil {
			s.failDevice(err)
		}
	}
	for {
		if !s.failed.Load() {
			s.rxPass(st)
		}
		s.rxSleeping.Store(true)
		if !s.failed.Load() && (s.budget.freed.Load() || s.rxHasWork()) {
			s.rxSleeping.Store(false)
			continue
		}
		timeout := -1 // a transport reset's fence has a deadline
		if s.ev != nil && !s.failed.Load() {
			timeout = s.fenceTimeout()
		}
		n, err := unix.EpollWait(s.epfd, st.events[:], timeout)
		s.rxSleeping.Store(false)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			s.d.log.WithError(err).Error("vsock: rx epoll")
			return
		}
		for _, ev := range st.events[:n] {
			switch ev.Fd {
			case tagStop:
				return
			case tagWake:
				_, _ = s.wake.Wait()
			case tagRxKick:
				if k, _ := s.rx.Kick.Wait(); k > 0 {
					s.d.ctr.rxKicks.Add(1)
				}
			case tagEventKick:
				_, _ = s.ev.Kick.Wait()
			default:
				s.hostEvent(st, int(ev.Fd), ev.Events)
			}
		}
	}
}

// rxHasWork reports whether a pass could make progress now: there is work
// and the guest has RX buffers. When there are none it re-enables RX kicks
// (with a re-check), so the guest wakes us when it posts some.
func (s *session) rxHasWork() bool {
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	if s.ev != nil && s.eventWaitsLocked() {
		return true
	}
	if len(s.ready) == 0 && len(s.rsts) == 0 {
		return false
	}
	ok, err := s.rxAvailableLocked()
	if err != nil {
		s.failDevice(err)
		return false
	}
	if ok {
		return true
	}
	more, err := s.rx.EnableNotification()
	if err != nil {
		s.failDevice(err)
		return false
	}
	if more {
		_ = s.rx.DisableNotification()
	}
	return more
}

// hostEvent records what epoll said about a host socket.
func (s *session) hostEvent(st *rxState, fd int, events uint32) {
	s.d.ctr.hostEvents.Add(1)
	s.connMu.Lock()
	c := s.byFD[fd]
	s.connMu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.unlock()
	if c.fd != fd || !c.sm.live() {
		return // stale event for a descriptor that was closed
	}
	c.hostEventLocked(&st.iov, events)
	if c.hasRxWork() {
		s.markReadyLocked(c)
	}
	c.interestLocked()
}

// rxPass sends the guest what is pending, while it has RX buffers: RSTs for
// vanished connections first, then each ready connection in turn.
func (s *session) rxPass(st *rxState) {
	s.feedStarved()
	if s.ev != nil {
		s.rxMu.Lock()
		s.deliverEventLocked()
		s.rxMu.Unlock()
		s.checkFence()
	}
	for !s.failed.Load() {
		s.rxMu.Lock()
		if len(s.rsts) > 0 {
			ok := s.emitLocked(&s.rsts[0])
			if ok {
				s.rsts = s.rsts[1:]
				if len(s.rsts) == 0 {
					s.rsts = nil
				}
				s.d.ctr.rstSent.Add(1)
			}
			s.rxMu.Unlock()
			if !ok {
				s.countQueueFull()
				break
			}
			continue
		}
		if len(s.ready) == 0 {
			s.rxMu.Unlock()
			break
		}
		c := s.ready[0]
		s.ready[0] = nil
		s.ready = s.ready[1:]
		if len(s.ready) == 0 {
			s.ready = nil
		}
		c.inReady = false
		s.rxMu.Unlock()

		c.mu.Lock()
		out := !s.emitConnLocked(st, c, rxBudget)
		if c.hasRxWork() {
			s.markReadyLocked(c)
		}
		c.interestLocked()
		c.unlock()
		if out {
			s.countQueueFull()
			break
		}
	}
	s.publishRX(nil)
}

// countQueueFull counts an RX pass cut short for want of guest RX buffers
// (Stats.RxQueueFull); a device that failed does not count.
func (s *session) countQueueFull() {
	if !s.failed.Load() {
		s.d.ctr.rxQueueFull.Add(1)
	}
}

// publishRX makes the used RX entries visible and interrupts the guest once,
// or leaves the interrupt to the TX worker's held one (h not nil, see
// txirq.go).
func (s *session) publishRX(h *txIRQ) {
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	if !s.rxPushed || s.failed.Load() {
		return
	}
	s.rxPushed = false
	if err := s.rx.Publish(); err != nil {
		s.failDevice(err)
		return
	}
	need, err := s.rx.NeedsNotification()
	if err != nil {
		s.failDevice(err)
		return
	}
	if need && !s.holdRX(h) {
		s.d.ctr.interrupts.Add(1)
		s.rx.Interrupt()
	}
}

// emitOrQueueLocked gets c's pending work to the guest: directly, from the
// calling goroutine, when DirectEnqueue is on and nothing is queued ahead of
// it (seed 001); otherwise by putting c on the ready list and waking the RX
// worker. Control packets go directly from any producer; host data only from
// a caller that brings RX scratch (scratch not nil: the TX worker, which
// learns first that a guest credit update unblocked data), up to one turn's
// budget. Called with c.mu held. It reports whether the RX worker must be
// woken: the caller does that after unlocking c.mu (seed 000's rule), or
// the worker, first to look at c, would wait for the lock the caller holds.
func (s *session) emitOrQueueLocked(c *conn, scratch *rxState) (wake bool) {
	data := c.dataReady()
	if s.opts.DirectEnqueue && (c.sm.pend != 0 || data) && (scratch != nil || !data) && !s.failed.Load() {
		s.rxMu.Lock()
		idle := len(s.ready) == 0 && len(s.rsts) == 0 && !c.inReady
		s.rxMu.Unlock()
		if idle {
			var local rxState
			st, budget := scratch, rxBudget
			if st == nil {
				st, budget = &local, 0
			}
			if s.emitConnLocked(st, c, budget) && !c.hasRxWork() {
				s.d.ctr.directEnqueues.Add(1)
				s.publishRX(st.irq)
				return false
			}
			s.publishRX(st.irq)
		}
	}
	if c.hasRxWork() {
		s.d.ctr.rxHandoffs.Add(1)
		s.markReadyLocked(c)
		return true
	}
	return false
}

// emitConnLocked sends c's pending packets in protocol order: connection
// setup, data (at most budget packets), credit update, shutdown. It returns
// false when the guest ran out of RX buffers. Called with c.mu held.
func (s *session) emitConnLocked(st *rxState, c *conn, budget int) bool {
	if c.sm.state == stateClosed {
		return true
	}
	h := Header{SrcPort: c.key.hostPort, DstPort: c.key.guestPort, Type: c.typ}
	ctl := func(op Op, flags uint32) bool {
		h.Op, h.Flags, h.Len = op, flags, 0
		c.grantLocked()
		h.BufAlloc, h.FwdCnt = c.bufAlloc, c.grantFwd
		s.rxMu.Lock()
		ok := s.emitLocked(&h)
		s.rxMu.Unlock()
		if ok {
			c.lastFwd, c.lastBufAlloc = c.grantFwd, c.bufAlloc
		}
		return ok
	}
	if c.sm.pend&pendRequest != 0 {
		if !ctl(OpRequest, 0) {
			return false
		}
		c.sm.pend &^= pendRequest
	}
	if c.sm.pend&pendResponse != 0 {
		if !ctl(OpResponse, 0) {
			return false
		}
		c.sm.pend &^= pendResponse
	}
	for sent := 0; sent < budget && c.dataReady(); sent++ {
		switch s.emitData(st, c) {
		case emitNoBuffers:
			return false
		case emitStop:
			sent = budget
		case emitReset:
			c.resetLocked()
			return true
		}
		if c.sm.state == stateClosed {
			return true
		}
	}
	if c.sm.pend&pendCredit != 0 {
		c.grantLocked()
		if c.lastFwd != c.grantFwd || c.lastBufAlloc != c.bufAlloc || c.sm.pend&pendCreditForced != 0 {
			if !ctl(OpCreditUpdate, 0) {
				return false
			}
			s.d.ctr.creditUpdates.Add(1)
		}
		c.sm.pend &^= pendCredit | pendCreditForced
	}
	if c.sm.pend&pendShutdown != 0 {
		if !ctl(OpShutdown, c.sm.shutFlags) {
			return false
		}
		c.applyLocked(c.sm.onShutdownSent())
	}
	return true
}

type emitResult int

const (
	emitSent      emitResult = iota
	emitStop                 // nothing more to read now (EAGAIN, EOF, reset)
	emitNoBuffers            // the guest has no RX buffer
	emitReset                // the host socket failed: reset the connection
)

// rxReadBatch bounds how many guest RX buffers one read from a host socket
// fills: Linux posts 4 KiB buffers, so a 64 KiB burst from the host takes one
// readv instead of sixteen.
const rxReadBatch = 16

// emitData sends host data to the guest as RW packets: the CONNECT prefix
// first, then straight from the host socket into guest buffers with one
// readv across up to rxReadBatch of them (header space skipped), as much as
// the guest's credit allows. The buffers are popped under rxMu, filled
// without it (the connection reads: connread.go), and pushed under it
// again; those left empty go to the spare list (rxspare.go). The read never
// blocks. Called with c.mu held, not rxMu.
func (s *session) emitData(st *rxState, c *conn) emitResult {
	if c.typ == TypeSeqpacket {
		return s.emitSeqData(st, c)
	}
	credit := uint64(c.peerCredit())
	if credit == 0 {
		return emitStop
	}
	popped := s.popForRead(st, c, credit)
	if popped == 0 {
		return emitNoBuffers
	}
	if f := testHookRead.Load(); f != nil {
		(*f)(st.irq != nil)
	}
	var total uint64
	for _, room := range st.rooms[:popped] {
		total += room
	}
	got, r := c.readHostLocked(&st.iov, st.views, total)
	clear(st.views)
	if r != emitSent {
		s.giveBack(st, c, popped)
		return r
	}
	// The bytes fill the buffers in order; each filled buffer becomes one
	// packet and the ones left empty go to the spare list.
	h := Header{SrcCID: CIDHost, DstCID: s.d.cfg.CID, SrcPort: c.key.hostPort, DstPort: c.key.guestPort,
		Type: TypeStream, Op: OpRW}
	c.grantLocked()
	h.BufAlloc, h.FwdCnt = c.bufAlloc, c.grantFwd
	var hb [HeaderSize]byte
	s.rxMu.Lock()
	if s.failed.Load() {
		// Failed while the read ran: a failed device does not touch the
		// ring, and what was read is lost with the device.
		s.rxMu.Unlock()
		return emitNoBuffers
	}
	filled := 0
	for left := uint64(got); left > 0; filled++ {
		ch := &st.chains[filled]
		k := min(left, st.rooms[filled])
		h.Len = uint32(k)
		h.Encode(hb[:])
		w := ch.Writer()
		w.Write(hb[:])
		if err := s.rx.PushNoPublish(ch.Head, uint32(HeaderSize+k)); err != nil {
			s.rxMu.Unlock()
			s.failDevice(err)
			return emitNoBuffers
		}
		left -= k
		c.toGuest += uint32(k)
		s.d.ctr.rxPackets.Add(1)
		s.d.ctr.rxBytes.Add(k)
	}
	if s.spareLocked(st, filled, popped) {
		c.wakeRX = true // after unlocking (conn.unlock)
	}
	s.rxPushed = true
	s.rxMu.Unlock()
	c.lastFwd, c.lastBufAlloc = c.grantFwd, c.bufAlloc
	return emitSent
}

// testHookRead, set only by tests (export_test.go), runs between popping the
// buffers of a host read and the read; txWorker says whether the TX worker
// (a direct enqueue) is the reader. It lets a test hold the buffers out of
// the ring while the RX worker looks for some.
var testHookRead atomic.Pointer[func(txWorker bool)]

// popForRead pops the guest RX buffers one host read may fill, up to
// credit bytes (one buffer while a CONNECT prefix is left), into
// st.chains, with their payload room in st.rooms and views past the header
// space in st.views. It returns how many; none when the guest has no
// buffer or a broken one failed the device. Called with c.mu held; takes
// rxMu.
func (s *session) popForRead(st *rxState, c *conn, credit uint64) int {
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	if s.failed.Load() {
		return 0
	}
	popped := 0
	st.views = st.views[:0]
	var total uint64
	for popped < rxReadBatch && total < credit && (popped == 0 || len(c.prefix) == 0) {
		ch := &st.chains[popped]
		pos, ok, err := s.popRXLocked(ch)
		if err != nil {
			s.failDevice(err)
			break
		}
		if !ok {
			break
		}
		st.pos[popped] = pos
		if ch.WritableLen() <= HeaderSize {
			// A buffer without room after the header can never carry
			// data: left at the head of the ring it would be retried
			// forever.
			s.failDevice(virtioGuestErr("RX buffer of %d bytes has no room for data", ch.WritableLen()))
			popped++
			break
		}
		room := min(ch.WritableLen()-HeaderSize, MaxPacketPayload, credit-total)
		st.rooms[popped] = room
		w := ch.Writer()
		w.Advance(HeaderSize) // the header goes in once the length is known
		st.views = w.Views(st.views, room)
		total += room
		popped++
	}
	if s.failed.Load() {
		s.spareLocked(st, 0, popped)
		clear(st.views)
		return 0
	}
	return popped
}

// giveBack puts st.chains[:n], popped for a read on c that filled none of
// them, on the spare list; if the RX worker may be asleep waiting for them
// (spareLocked), it is woken once c is unlocked (conn.unlock). Called with
// c.mu held.
func (s *session) giveBack(st *rxState, c *conn, n int) {
	s.rxMu.Lock()
	if s.spareLocked(st, 0, n) {
		c.wakeRX = true
	}
	s.rxMu.Unlock()
}

// spareLocked puts st.chains[from:to] on the spare list, newest first (each
// then goes straight to the top: rxspare.go). It reports whether
// the RX worker must be woken: other RX work waits (a ready connection, an
// RST), and while these buffers were out of the ring the worker may have
// found none for it and gone to sleep waiting for a guest kick that will
// not come, since the guest posted nothing new. (Seen when the TX worker's
// direct enqueue took the last buffers and its read came back empty: an
// agent exec never finished.) Called with rxMu held; the caller wakes the
// worker after unlocking.
func (s *session) spareLocked(st *rxState, from, to int) bool {
	for k := to - 1; k >= from; k-- {
		s.rxSpare.put(&st.chains[k], st.pos[k])
	}
	return to > from && (len(s.ready) > 0 || len(s.rsts) > 0)
}

// emitSeqData sends one SEQPACKET record from the host to the guest: read
// whole from the host socket (readRecordLocked) once the guest's credit
// covers it, then copied into as many RX buffers as it takes, one RW packet
// each, SeqEOM (and SeqEOR) on the last. Out of RX buffers it stops and
// goes on with the same record on the next turn, so a record is never
// merged with another nor cut short. Called with c.mu held.
func (s *session) emitSeqData(st *rxState, c *conn) emitResult {
	if c.recOff == len(c.rec) {
		if r := c.readRecordLocked(&st.iov, &st.views); r != emitSent {
			return r
		}
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	h := Header{SrcCID: CIDHost, DstCID: s.d.cfg.CID, SrcPort: c.key.hostPort, DstPort: c.key.guestPort,
		Type: TypeSeqpacket, Op: OpRW}
	c.grantLocked()
	h.BufAlloc, h.FwdCnt = c.bufAlloc, c.grantFwd
	var hb [HeaderSize]byte
	ch := &s.rxChain
	for c.recOff < len(c.rec) {
		pos, ok, err := s.popRXLocked(ch)
		if err != nil {
			s.failDevice(err)
			return emitNoBuffers
		}
		if !ok {
			return emitNoBuffers
		}
		if ch.WritableLen() <= HeaderSize {
			s.rxSpare.put(ch, pos)
			s.failDevice(virtioGuestErr("RX buffer of %d bytes has no room for data", ch.WritableLen()))
			return emitNoBuffers
		}
		k := int(min(ch.WritableLen()-HeaderSize, MaxPacketPayload, uint64(len(c.rec)-c.recOff)))
		h.Len, h.Flags = uint32(k), 0
		if c.recOff+k == len(c.rec) {
			h.Flags = c.recEnd
		}
		h.Encode(hb[:])
		w := ch.Writer()
		w.Write(hb[:])
		w.Write(c.rec[c.recOff : c.recOff+k])
		if err := s.rx.PushNoPublish(ch.Head, uint32(HeaderSize+k)); err != nil {
			s.failDevice(err)
			return emitNoBuffers
		}
		s.rxPushed = true
		c.lastFwd, c.lastBufAlloc = c.grantFwd, c.bufAlloc
		c.recOff += k
		c.toGuest += uint32(k)
		s.d.ctr.rxPackets.Add(1)
		s.d.ctr.rxBytes.Add(uint64(k))
	}
	s.d.ctr.seqToGuest.Add(1)
	c.recOff = 0
	if cap(c.rec) > idleQueueCap {
		c.rec = nil
	} else {
		c.rec = c.rec[:0]
	}
	return emitSent
}

// emitLocked writes a control packet (no payload) into the next RX buffer.
// It reports false when the guest has none. Called with rxMu held.
func (s *session) emitLocked(h *Header) bool {
	if s.failed.Load() {
		return false
	}
	ch := &s.rxChain
	pos, ok, err := s.popRXLocked(ch)
	if err != nil {
		s.failDevice(err)
		return false
	}
	if !ok {
		return false
	}
	if ch.WritableLen() < HeaderSize {
		s.rxSpare.put(ch, pos)
		s.failDevice(virtioGuestErr("RX buffer of %d bytes cannot hold a packet header", ch.WritableLen()))
		return false
	}
	h.SrcCID, h.DstCID = CIDHost, s.d.cfg.CID
	var hb [HeaderSize]byte
	h.Encode(hb[:])
	w := ch.Writer()
	w.Write(hb[:])
	if err := s.rx.PushNoPublish(ch.Head, HeaderSize); err != nil {
		s.failDevice(err)
		return false
	}
	s.rxPushed = true
	s.d.ctr.rxPackets.Add(1)
	return true
}
