package vsock

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// A connection carrying out its own state machine's effects (mux.go says
// what it owns): connSM decides (connsm.go), applyLocked acts, in the
// connection's own lock, reaching the muxer only through c.env.mux.

// registerLocked makes fd, a connected host socket, the connection's own
// and has the muxer watch it. Called with c.mu held.
func (c *conn) registerLocked(fd int) error {
	// The workers read and write host sockets expecting EAGAIN, never a
	// block: whatever the Dialer or the host client handed over.
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("vsock: host socket: %w", err)
	}
	if c.env.opts.SendBuffer && c.typ == TypeStream {
		// Best effort: the kernel caps it at net.core.wmem_max (and
		// doubles it); a socket that refuses keeps its default.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, int(c.env.cfg.ConnBuffer)); err != nil {
			c.env.log.WithError(err).Debug("vsock: SO_SNDBUF")
		}
	}
	// The muxer indexes fd before the ADD (mux.watch says why); c.fd
	// is set before the caller unlocks c.mu, so the first edge finds it.
	events := c.env.initialEvents()
	if err := c.env.mux.watch(c, fd, events); err != nil {
		return err
	}
	c.fd, c.events = fd, events
	// Data may already be waiting: the edge for it may have come before
	// registration.
	c.hostReadable = true
	return nil
}

// applyLocked carries out what the connection's state machine decided
// (connsm.go), in the order of the act bits: counters, timers, the host
// socket's half-closes, then closing and the RST. actProtoErr, actFlush,
// actDropMsg and actDropLate concern the packet being handled and are the
// caller's. Called with c.mu held.
func (c *conn) applyLocked(a act) {
	if a&actCountRefused != 0 {
		c.env.ctr.connsRefused.Add(1)
	}
	if a&actCountReset != 0 {
		c.env.ctr.connsReset.Add(1)
	}
	if a&actCountEstablished != 0 {
		c.env.ctr.connsEstablished.Add(1)
	}
	if a&actStopTimer != 0 && c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if a&actWriteOK != 0 {
		if b := c.sm.onAccepted(c.acceptedLocked()); b != 0 {
			c.applyLocked(b)
		}
	}
	if a&actShutHostRead != 0 {
		c.hostReadShutLocked()
	}
	if a&actShutHostWrite != 0 && c.fd >= 0 {
		_ = unix.Shutdown(c.fd, unix.SHUT_WR)
	}
	if a&actStartCloseTimer != 0 && c.timer == nil {
		c.timer = time.AfterFunc(c.env.cfg.ConnectTimeout, func() { c.onTimer((*connSM).onCloseTimeout) })
	}
	if a&actClose != 0 {
		c.releaseLocked()
		c.env.mux.remove(c)
	}
	if a&actRst != 0 && c.env.mux.queueRst(Header{SrcPort: c.key.hostPort, DstPort: c.key.guestPort, Type: c.typ}) {
		c.wakeRX = true // after unlocking (conn.unlock)
	}
}

// acceptedLocked tells the host client of a host-initiated connection that
// the guest accepted it ("OK <port>\n", written before any data can flow:
// the TX worker is the only writer of the socket) and registers the socket
// with epoll. It reports false if either fails. Called with c.mu held.
func (c *conn) acceptedLocked() bool {
	fd := c.fd
	c.fd = -1
	line := fmt.Appendf(nil, "OK %d\n", c.key.hostPort)
	if n, err := writeSome(fd, line); err != nil || n != len(line) {
		closeFD(fd)
		return false
	}
	if err := c.registerLocked(fd); err != nil {
		closeFD(fd)
		return false
	}
	if uint64(c.bufAlloc) < c.windowLocked() {
		// The REQUEST went out while the budget was short: the guest
		// gets the rest of its window as soon as there is budget.
		c.sm.pend |= pendCredit
	}
	return true
}

// releaseLocked lets go of what a connection the state machine closed
// holds: its timer, its host socket (and epoll registration) and its
// buffers, whose credit goes back to the device's budget. The caller
// removes it from the table (mux.remove) unless Stop did.
// Called with c.mu held.
func (c *conn) releaseLocked() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.fd >= 0 {
		c.env.mux.unwatch(c, c.fd)
		closeFD(c.fd)
		c.fd, c.events = -1, 0
	}
	if exp := c.exposureLocked(); c.env.budget.shrink(exp, exp) {
		c.wakeRX = true
	}
	c.bufAlloc, c.grantFwd = 0, c.fwdCnt
	c.toHost.Reset()
	c.prefix = nil
	c.msg, c.rec, c.recOff, c.seqNeed = nil, nil, 0, 0
	c.recs.reset()
	c.env.ctr.connsOpen.Add(-1)
}

// resetLocked is the device giving up on c for a reason of its own
// (a host socket error, a broken guest packet, a transport reset): RST to
// the guest, host socket closed, counted by state. Called with c.mu held.
func (c *conn) resetLocked() {
	c.applyLocked(c.sm.onHostFailed())
}

// onTimer runs a connection's connect or close timer: event is
// onConnectTimeout or onCloseTimeout, which decide whether the connection
// still waits for it.
func (c *conn) onTimer(event func(*connSM) act) {
	c.mu.Lock()
	defer c.unlock()
	if a := event(&c.sm); a != 0 {
		c.env.log.WithField("port", c.key.guestPort).Debugf("vsock: %s connection timed out; resetting", c.key.String())
		c.applyLocked(a)
	}
}

// hostReadShutLocked applies the guest's SHUTDOWN(RCV) ("will not receive")
// to the host socket: shutdown(SHUT_RD), which on a Unix stream or SEQPACKET
// socket also shuts the peer's sending side, so the host's further writes
// fail with EPIPE, as a Linux vsock socket's do once its peer shut down
// receiving. Host data not yet given to the guest (the CONNECT prefix, a
// SEQPACKET record in flight, what waits in the socket) is dropped: the
// device never reads the socket again, and the kernel frees what it holds
// when the connection closes. Called with c.mu held.
func (c *conn) hostReadShutLocked() {
	if c.fd >= 0 {
		_ = unix.Shutdown(c.fd, unix.SHUT_RD)
	}
	c.hostReadable = false
	c.prefix = nil
	c.rec, c.recOff, c.seqNeed = nil, 0, 0
}

// hostEventLocked takes in what epoll said about the connection's host
// socket: data or a hang-up to read (the RX side reads it when the guest has
// room), the host's hang-up for the state machine, room to flush the byte
// queue into. Called with c.mu held.
func (c *conn) hostEventLocked(iov *iovecs, events uint32) {
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.hostReadable = true
	}
	if events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.hostClosing = true
	}
	if events&unix.EPOLLHUP != 0 {
		c.sm.onHostHangup()
	}
	if events&unix.EPOLLOUT != 0 && c.toHost.Len() > 0 {
		c.flushLocked(iov)
		c.creditCheckLocked()
	}
}

// unlock releases c.mu, then wakes the RX worker if work done under it left
// it something to do (wakeRX: budget given back that a starved connection
// waits for, an RST queued, RX buffers put on the spare list). Seed 000's
// rule: wake the other side after unlocking, or the RX worker, whose
// first step may be to lock this very connection (feedStarved), wakes only
// to wait for c.mu.
func (c *conn) unlock() {
	wake := c.wakeRX
	c.wakeRX = false
	c.mu.Unlock()
	if wake {
		c.env.mux.wakeRX()
	}
}
