package vsock

import (
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// What a connection does with the guest's bytes: to its host socket straight
// from guest memory, or into its byte queue and out on EPOLLOUT. The TX
// worker (tx.go) routes each admitted payload here with the connection
// locked and its scratch (st); the RX worker calls flushLocked when the
// socket drains.

// creditCheckLocked schedules a CREDIT_UPDATE when the guest believes less
// than half of our buffer is free but we have forwarded more since we last
// told it.
func (c *conn) creditCheckLocked() {
	if c.sm.state == stateEstablished && c.fwdCnt != c.lastFwd && c.guestViewFree() < c.bufAlloc/2 {
		c.sm.pend |= pendCredit
	}
}

// flushForShutdownLocked gives the host everything the guest sent before
// its SHUTDOWN (the run's views, then the buffer); the shutdown takes
// effect once nothing is left (afterFlushLocked), now or when the host
// socket drains.
func (c *conn) flushForShutdownLocked(st *txState) {
	c.writeRunLocked(st)
	if !c.sm.live() {
		return
	}
	if c.toHost.Len() > 0 {
		c.flushLocked(&st.iov) // applies the shutdown if it drains the buffer
		return
	}
	c.afterFlushLocked()
}

// afterFlushLocked tells the state machine when the host has all of the
// guest's data, so that a SHUTDOWN the guest sent takes effect
// (onHostDrained).
func (c *conn) afterFlushLocked() {
	if c.toHost.Len() > 0 || !c.sm.live() {
		return
	}
	c.applyLocked(c.sm.onHostDrained())
}

// guestData forwards an RW payload (st.payload, h.Len bytes) to the host.
// The state machine has admitted it (rwAdmitted).
func (c *conn) guestData(st *txState, h *Header) {
	n := h.Len
	// Against the credit granted (grantFwd, not fwdCnt): what the guest
	// was told is at most that, and the device-wide budget counts on it.
	if c.fromGuest+n-c.grantFwd > c.bufAlloc {
		c.env.mux.guestError(virtio.GuestErrCredit, "connection %d<->%d: guest overran its credit (%d bytes outstanding, %d more, window %d)",
			c.key.hostPort, c.key.guestPort, c.fromGuest-c.grantFwd, n, c.bufAlloc)
		c.writeRunLocked(st) // what the guest sent within its credit still goes
		c.resetLocked()
		return
	}
	c.fromGuest += n
	c.env.ctr.txBytes.Add(uint64(n))
	c.growWindowLocked()
	if c.typ == TypeSeqpacket {
		c.guestSeqData(st, h)
		return
	}
	if n == 0 {
		return
	}
	if !c.sm.canForward() {
		// The host is gone: the data has nowhere to go.
		c.resetLocked()
		return
	}
	if c.toHost.Len() == 0 {
		// Scatter-gather straight from guest memory: now, or with the
		// rest of the run in one writev (BatchLock).
		st.runViews = append(st.runViews, st.payload...)
		if !c.env.opts.BatchLock {
			c.writeRunLocked(st)
		}
		return
	}
	// Older bytes still buffered: copy, in order after anything the run
	// holds.
	c.writeRunLocked(st)
	if c.sm.state == stateClosed {
		return
	}
	c.appendTx(st.payload, 0)
	if !c.env.opts.BatchLock {
		c.flushLocked(&st.iov)
	}
}

// writeRunLocked sends the run's pending payload views to the host socket
// with one writev, copying what the socket does not take into the
// connection's buffer (behind anything already buffered, to keep the byte
// order).
func (c *conn) writeRunLocked(st *txState) {
	if len(st.runViews) == 0 {
		return
	}
	defer func() {
		clear(st.runViews)
		st.runViews = st.runViews[:0]
	}()
	if c.sm.state == stateClosed || c.fd < 0 {
		return
	}
	if c.toHost.Len() > 0 {
		c.appendTx(st.runViews, 0)
		return
	}
	var total int
	for _, v := range st.runViews {
		total += len(v)
	}
	w, err := st.iov.writev(c.fd, st.runViews)
	if err != nil {
		c.env.log.WithError(err).Debug("vsock: host write")
		c.resetLocked()
		return
	}
	c.forwardedLocked(uint32(w))
	if w < total {
		c.env.ctr.hostWriteStalls.Add(1)
		c.appendTx(st.runViews, uint64(w))
	}
}

// appendTx copies payload bytes from skip on into the connection's buffer.
func (c *conn) appendTx(payload [][]byte, skip uint64) {
	for _, b := range payload {
		if skip >= uint64(len(b)) {
			skip -= uint64(len(b))
			continue
		}
		c.toHost.Append(b[skip:])
		skip = 0
	}
}

// guestSeqData takes one fragment of a SEQPACKET message (st.payload, h.Len
// bytes, already within the credit). Fragments gather in c.msg until the
// packet with SeqEOM; the message then goes to the host socket as one
// record (sendmsg, MSG_EOR when the guest set SeqEOR): straight from guest
// memory when nothing is waiting ahead of it, otherwise queued behind the
// records in c.toHost. Nothing here ever joins two messages: each record is
// one sendmsg, whatever the Options. c.msg cannot outgrow the buffer we
// advertised: its bytes are not forwarded, so they count against the
// credit, and a guest that sends a message larger than the buffer overruns
// it and is reset (guestData) rather than making c.msg grow.
func (c *conn) guestSeqData(st *txState, h *Header) {
	if !c.sm.canForward() {
		// The host is gone: the data has nowhere to go.
		c.resetLocked()
		return
	}
	if h.Flags&SeqEOM == 0 {
		for _, v := range st.payload {
			c.msg = append(c.msg, v...)
		}
		return
	}
	n := len(c.msg) + int(h.Len)
	eor := h.Flags&SeqEOR != 0
	if n == 0 {
		// An empty message: Linux never sends one, and no host record
		// could be told apart from the end of the stream. Dropped.
		return
	}
	flags := 0
	if eor {
		flags = unix.MSG_EOR
	}
	if c.toHost.Len() == 0 && len(st.payload) < maxIov {
		st.seqViews = append(append(st.seqViews[:0], c.msg), st.payload...)
		ok, err := st.iov.sendmsg(c.fd, st.seqViews, flags)
		clear(st.seqViews)
		if err != nil {
			c.env.log.WithError(err).Debugf("vsock: host write of a %d-byte record", n)
			c.resetLocked()
			return
		}
		if ok {
			c.forwardedLocked(uint32(n))
			c.env.ctr.seqToHost.Add(1)
			c.resetMsg()
			return
		}
		c.env.ctr.hostWriteStalls.Add(1)
	}
	queued := c.toHost.Len()
	c.toHost.Append(c.msg)
	for _, v := range st.payload {
		c.toHost.Append(v)
	}
	c.recs.push(uint32(n), eor)
	c.resetMsg()
	if queued > 0 {
		c.flushLocked(&st.iov)
	}
}

// resetMsg empties c.msg, letting go of a large array.
func (c *conn) resetMsg() {
	if cap(c.msg) > idleQueueCap {
		c.msg = nil
	} else {
		c.msg = c.msg[:0]
	}
}

// flushSeqLocked writes the queued SEQPACKET records to the host socket, one
// sendmsg each (a record's bytes may lie in several of the queue's chunks),
// until the socket is full.
func (c *conn) flushSeqLocked(iov *iovecs) {
	for c.recs.len() > 0 {
		n, eor := c.recs.head()
		flags := 0
		if eor {
			flags = unix.MSG_EOR
		}
		views := c.toHost.Views(iov.views[:0], n)
		if len(views) > maxIov {
			// A record of more than maxIov chunks (64 MiB) goes out
			// from one copy: one sendmsg must carry all of it.
			whole := make([]byte, 0, n)
			for _, v := range views {
				whole = append(whole, v...)
			}
			views = append(views[:0], whole)
		}
		ok, err := iov.sendmsg(c.fd, views, flags)
		clear(views)
		iov.views = views[:0]
		if err != nil {
			c.env.log.WithError(err).Debugf("vsock: host write of a %d-byte record", n)
			c.resetLocked()
			return
		}
		if !ok {
			c.env.ctr.hostWriteStalls.Add(1)
			return
		}
		c.toHost.Consume(n)
		c.recs.pop()
		c.forwardedLocked(uint32(n))
		c.env.ctr.seqToHost.Add(1)
	}
	c.afterFlushLocked()
}

// flushLocked writes buffered guest data to the host socket, with writev
// over the queue's chunks, until it is empty or the socket full. iov is
// the calling worker's scratch.
func (c *conn) flushLocked(iov *iovecs) {
	if c.fd < 0 || c.toHost.Len() == 0 {
		return
	}
	if c.typ == TypeSeqpacket {
		c.flushSeqLocked(iov)
		return
	}
	for c.toHost.Len() > 0 {
		views := c.toHost.Views(iov.views[:0], c.toHost.Len())
		w, err := iov.writev(c.fd, views)
		clear(views)
		iov.views = views[:0]
		if err != nil {
			c.env.log.WithError(err).Debug("vsock: host write")
			c.resetLocked()
			return
		}
		if w == 0 {
			c.env.ctr.hostWriteStalls.Add(1)
			return
		}
		c.forwardedLocked(uint32(w))
		c.toHost.Consume(w)
	}
	// A shutdown the guest sent while data was still buffered takes
	// effect now. (This may close the connection.)
	c.afterFlushLocked()
}
