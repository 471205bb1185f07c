package vsock

import (
	"golang.org/x/sys/unix"
)

// What a host socket's epoll registration asks for (Options.ReadinessGate).
//
// Every host socket is registered edge-triggered with EPOLLRDHUP (hang-ups
// always reach the RX worker). Without the gate it also asks for EPOLLIN
// and EPOLLOUT for its whole life, so the RX worker wakes for every host
// write, even into a connection whose guest has no credit left (nothing
// can be read for it), and for every host read of what the device wrote,
// even with nothing waiting to be written (a host socket's send buffer
// sized from the window, SendBuffer, takes what the guest sends at once).
// With the gate the registration follows the connection:
//
//   - EPOLLIN is dropped when host data is known to wait (hostReadable)
//     and the guest has no credit for it, and asked for again only once a
//     read has drained the socket (EAGAIN, a short read, the end of the
//     stream): while data is known to wait, an edge says nothing new, and
//     the data is read as soon as credit comes back (a guest packet, on
//     the TX worker or the RX worker). Re-arming reports data that came
//     in between, so no edge is lost. Two epoll_ctl per credit stall, and
//     none while credit lasts.
//   - EPOLLOUT only while guest bytes wait in the byte queue (toHost);
//     asking for it on a writable socket reports it at once, so bytes
//     queued by a partial write are flushed as soon as there is room.
//
// SEQPACKET connections keep EPOLLIN: a record waits for credit to cover
// all of it, a different rule. Each change is one epoll_ctl
// (Stats.InterestChanges), made by the worker that holds the connection's
// lock at the end of its work on it: the TX worker's endRun, the RX
// worker's turn for the connection and its hostEvent.

// baseEvents are asked for on every host socket.
const baseEvents = unix.EPOLLRDHUP | unix.EPOLLET

// initialEvents is what a host socket is registered with: data may already
// wait (hostReadable starts true), and no guest bytes do.
func (e *connEnv) initialEvents() uint32 {
	if e.opts.ReadinessGate {
		return baseEvents | unix.EPOLLIN
	}
	return baseEvents | unix.EPOLLIN | unix.EPOLLOUT
}

// wantEvents is what c's registration should ask for now.
func (c *conn) wantEvents() uint32 {
	if !c.env.opts.ReadinessGate {
		return c.events
	}
	want := uint32(baseEvents)
	in := c.events&unix.EPOLLIN != 0
	switch {
	case c.typ == TypeSeqpacket || !c.hostReadable:
		in = true
	case c.peerCredit() == 0:
		in = false
	}
	if in {
		want |= unix.EPOLLIN
	}
	if c.toHost.Len() > 0 {
		want |= unix.EPOLLOUT
	}
	return want
}

// interestLocked brings c's epoll registration to what it should ask for.
// Called with c.mu held.
func (c *conn) interestLocked() {
	if c.events == 0 || c.sm.state == stateClosed {
		return // not registered (yet: a host client's socket waits for the guest's answer first)
	}
	want := c.wantEvents()
	if want == c.events {
		return
	}
	if err := c.env.mux.rearm(c.fd, want); err != nil {
		// The descriptor is registered and open while c.fd holds it:
		// a failure here is the host's, not the guest's. Without the
		// events the connection would stall, so give it up.
		c.env.log.WithError(err).Warn("vsock: epoll interest")
		c.resetLocked()
		return
	}
	c.events = want
	c.env.ctr.interestChanges.Add(1)
}
