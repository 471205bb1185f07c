package vsock

import (
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// What a connection reads from its host socket for the guest. The RX side
// (rx.go) pops the guest's RX buffers and hands the connection their views;
// the connection fills them (the CONNECT prefix first, then one readv) and
// keeps its own account of what the socket has left: readable, drained,
// at its end. SEQPACKET records are read whole into the connection's own
// buffer once the guest's credit covers them.

// readHostLocked fills views (room bytes in all, within the guest's credit)
// with the connection's next host bytes: the CONNECT prefix if any is left,
// else one readv from the socket. It returns how many bytes it placed, or
// emitStop (nothing to read now: EAGAIN or the end of the stream) or
// emitReset (the socket failed). Called with c.mu held; the caller clears
// views after.
func (c *conn) readHostLocked(iov *iovecs, views [][]byte, room uint64) (int, emitResult) {
	if len(c.prefix) > 0 {
		// One buffer (the RX side pops no more while a prefix is
		// left): copy what fits of the bytes that came with the
		// CONNECT line.
		got := virtio.CopyTo(views, 0, c.prefix)
		c.prefix = c.prefix[got:]
		if len(c.prefix) == 0 {
			c.prefix = nil
		}
		return got, emitSent
	}
	got, err := iov.readv(c.fd, views)
	switch {
	case isAgain(err):
		c.hostReadable = false
		c.env.ctr.hostReadsEmpty.Add(1)
		return 0, emitStop
	case err != nil:
		c.env.log.WithError(err).Debug("vsock: host read")
		return 0, emitReset
	case got == 0:
		c.hostEOFLocked()
		return 0, emitStop
	case uint64(got) < room && c.env.opts.ShortReadDrains && !c.hostClosing:
		// A stream read returns less than asked only when the socket
		// had no more: data that comes later raises a new EPOLLIN edge
		// (hostEvent), so reading again now would only find EAGAIN.
		// After a hang-up no edge announces the end of the stream: read
		// on to it.
		c.hostReadable = false
	}
	return got, emitSent
}

// hostEOFLocked records that the host shut down its sending side; the
// state machine schedules the SHUTDOWN that tells the guest. Called with
// c.mu held.
func (c *conn) hostEOFLocked() {
	c.hostReadable = false
	c.sm.onHostEOF()
}

// readRecordLocked reads the host socket's next record into c.rec if the
// guest's credit covers all of it; otherwise it notes its length in
// c.seqNeed and leaves it in the socket (dataReady waits for the credit).
// A record larger than the guest's whole buffer could never be delivered
// (a Linux guest hands a message to the application only once all of it is
// in its buffer): the connection is reset. A read of 0 bytes is the end of
// the stream, or an empty record, which no packet can carry and which is
// dropped. Called with c.mu held, not rxMu.
func (c *conn) readRecordLocked(iov *iovecs, views *[][]byte) emitResult {
	n, _, err := iov.recvmsg(c.fd, nil, unix.MSG_PEEK|unix.MSG_TRUNC)
	switch {
	case isAgain(err):
		c.hostReadable = false
		return emitStop
	case err != nil:
		c.env.log.WithError(err).Debug("vsock: host read")
		return emitReset
	case n == 0:
		if hostSeqEOF(c.fd) {
			c.hostEOFLocked()
			return emitStop
		}
		if _, _, err := iov.recvmsg(c.fd, nil, 0); err != nil && !isAgain(err) {
			return emitReset
		}
		return emitStop
	case uint64(n) > uint64(c.peerBufAlloc):
		c.env.log.WithField("port", c.key.guestPort).Warnf("vsock: host record of %d bytes can never fit the guest's %d-byte buffer; resetting", n, c.peerBufAlloc)
		return emitReset
	case uint32(n) > c.peerCredit():
		c.seqNeed = uint32(n)
		return emitStop
	}
	c.seqNeed = 0
	if cap(c.rec) < n {
		c.rec = make([]byte, n)
	}
	c.rec = c.rec[:n]
	*views = append((*views)[:0], c.rec)
	got, flags, err := iov.recvmsg(c.fd, *views, 0)
	clear(*views)
	if err != nil || got != n || flags&unix.MSG_TRUNC != 0 {
		c.env.log.WithError(err).Debugf("vsock: host record: read %d of %d bytes (flags %#x)", got, n, flags)
		c.rec = c.rec[:0]
		return emitReset
	}
	c.recOff = 0
	// A SOCK_SEQPACKET Unix socket never reports MSG_EOR, yet each of its
	// records is a whole record: the guest sees MSG_EOR on every message.
	c.recEnd = SeqEOM | SeqEOR
	return emitSent
}

// hostSeqEOF tells the end of a SEQPACKET stream (the peer shut down
// writing and nothing is queued) from an empty record, which reads the
// same.
func hostSeqEOF(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	if n, err := unix.Poll(p, 0); err != nil || n == 0 || p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) == 0 {
		return false
	}
	q, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	return err == nil && q == 0
}
