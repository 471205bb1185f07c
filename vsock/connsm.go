package vsock

// This file is the per-connection protocol state machine, kept apart from
// the muxer (session.go: the connection table, host sockets, epoll, the RX
// queue) and the workers (tx.go, rx.go), as Firecracker keeps its
// connection state machine apart from its muxer.
//
// connSM is pure: it holds no descriptor, lock, timer or queue, starts no
// goroutine and reads no clock. Each event is a method (a guest packet, the
// end of a dial, a host socket's EOF or hang-up, a timeout, a packet sent);
// it moves the state and returns the actions the event calls for as act
// bits, which the session carries out in a fixed order (applyLocked). So
// every transition can be tested alone, without goroutines or sockets
// (connsm_test.go), and a reader sees the whole life cycle of a connection
// in one place.
//
// The data path (credit, the buffers of bytes either way, SEQPACKET
// records) stays in conn and the workers; it asks the state machine only
// whether data may flow (canForward, and the fields dataReady reads).

// connState is the life cycle of a connection (stream or SEQPACKET). The
// transitions (each an on* method below):
//
//	guest REQUEST -> guest-connecting -- dial ok, RESPONSE owed --> established
//	host CONNECT  -> host-connecting  -- guest RESPONSE, "OK" sent -> established
//	either connecting state -- dial failed, guest RST, timeout (RST) --> closed
//	established -- host EOF and hang-up, SHUTDOWN(BOTH) sent --> closing
//	established -- guest SHUTDOWN(BOTH), host has it all (RST) --> closed
//	established, closing -- guest RST; error or close timeout (RST) --> closed
type connState int

const (
	// stateGuestConnecting: the guest sent REQUEST to a host port; the
	// device is connecting to <uds>_<port> in the background.
	stateGuestConnecting connState = iota + 1
	// stateHostConnecting: a host client sent CONNECT; REQUEST is (being)
	// sent to the guest and the device waits for RESPONSE or RST.
	stateHostConnecting
	// stateEstablished: data flows both ways, subject to the shutdown
	// flags of each side.
	stateEstablished
	// stateClosing: the device sent SHUTDOWN(BOTH) (the host is gone
	// both ways) and waits for the guest's RST. Nothing is sent to the
	// guest any more except RST; data the guest queued before it saw the
	// shutdown is dropped.
	stateClosing
	// stateClosed: removed from the table; the host socket is closed.
	stateClosed
)

func (s connState) String() string {
	switch s {
	case stateGuestConnecting:
		return "guest-connecting"
	case stateHostConnecting:
		return "host-connecting"
	case stateEstablished:
		return "established"
	case stateClosing:
		return "closing"
	case stateClosed:
		return "closed"
	}
	return "?"
}

// Pending control packets a connection owes the guest (connSM.pend bits).
// The state machine sets REQUEST, RESPONSE and SHUTDOWN; the credit logic
// (tx.go, budget.go) sets pendCredit; the RX path clears each bit once the
// packet is in the guest's ring.
const (
	pendRequest  = 1 << iota // host-initiated: REQUEST
	pendResponse             // guest-initiated: RESPONSE
	pendCredit               // CREDIT_UPDATE (our fwd_cnt moved or the guest asked)
	pendShutdown             // SHUTDOWN with connSM.shutFlags
)

// pendCreditForced: the guest asked for our credit (CREDIT_REQUEST), so the
// update is sent even if fwd_cnt did not move.
const pendCreditForced = 1 << 8

// act is the set of actions an event calls for. applyLocked carries them
// out in the order of the constants: counting first, closing and the RST
// last.
type act uint32

const (
	// actProtoErr: the guest broke the protocol; the caller logs and
	// counts it (it knows the packet), and the bits that come with it say
	// what happens to the connection.
	actProtoErr act = 1 << iota
	// actCountRefused, actCountReset, actCountEstablished: Stats counters.
	actCountRefused
	actCountReset
	actCountEstablished
	// actStopTimer: stop the connect timer (the guest answered).
	actStopTimer
	// actWriteOK: write "OK <port>\n" to the host client and register its
	// socket with epoll, then report how that went (onAccepted).
	actWriteOK
	// actShutHostRead: shutdown(SHUT_RD) on the host socket and drop the
	// host data the guest has not been given.
	actShutHostRead
	// actFlush: give the host everything the guest sent before its
	// SHUTDOWN, then report onHostDrained once nothing is left.
	actFlush
	// actShutHostWrite: shutdown(SHUT_WR) on the host socket.
	actShutHostWrite
	// actDropMsg: drop the unfinished SEQPACKET message the guest was
	// sending (it will never end).
	actDropMsg
	// actDropLate: drop an RW payload that arrived after the device's
	// SHUTDOWN(BOTH); counted as Stats.LateRW, no error.
	actDropLate
	// actStartCloseTimer: reset the connection if the guest does not
	// answer SHUTDOWN(BOTH) with RST in time (onCloseTimeout).
	actStartCloseTimer
	// actClose: close the host socket, stop timers, give the buffers back
	// to the budget and remove the connection from the table.
	actClose
	// actRst: send the guest an RST for the connection's ports.
	actRst
)

// connSM is one connection's protocol state. Guarded by the owning
// conn.mu; pure otherwise (see the top of this file).
type connSM struct {
	state connState
	// guestShut: SHUTDOWN flags the guest sent.
	guestShut uint32
	// hostEOF: the host shut down its sending side (a read returned 0, or
	// the socket hung up while the device no longer read it).
	hostEOF bool
	// hostHup: the host closed the socket entirely (EPOLLHUP).
	hostHup bool
	// hostWriteShut: the device shut down writing on the host socket
	// (after the guest's SHUTDOWN SEND, once the host had all its data).
	hostWriteShut bool
	// pend: control packets owed to the guest (pend* bits).
	pend uint32
	// shutFlags: the flags of the pending or last SHUTDOWN to the guest.
	shutFlags uint32
}

// newGuestSM is the state of a connection the guest asked for (REQUEST):
// the device dials the host next.
func newGuestSM() connSM { return connSM{state: stateGuestConnecting} }

// newHostSM is the state of a connection a host client asked for
// (CONNECT): the guest is sent REQUEST.
func newHostSM() connSM { return connSM{state: stateHostConnecting, pend: pendRequest} }

// live reports whether the connection is still in the table.
func (m *connSM) live() bool { return m.state != stateClosed }

// canForward reports whether guest data has somewhere to go: the device
// has not shut down writing and the host has not hung up.
func (m *connSM) canForward() bool { return !m.hostWriteShut && !m.hostHup }

// guestReceives reports whether host data may go to the guest: the
// connection is established and the guest has not shut down receiving.
// (After the host's EOF what was read before it still goes.)
func (m *connSM) guestReceives() bool {
	return m.state == stateEstablished && m.guestShut&ShutdownRcv == 0
}

// abort is the device giving up on the connection: an RST to the guest,
// the host socket closed, counted by state (an attempt never established
// was refused; an established or closing connection reset).
func (m *connSM) abort() act {
	var a act
	switch m.state {
	case stateClosed:
		return 0
	case stateGuestConnecting, stateHostConnecting:
		a = actCountRefused
	case stateEstablished, stateClosing:
		a = actCountReset
	}
	m.close()
	return a | actClose | actRst
}

// close ends the connection without telling the guest. Whatever it still
// owed the guest is dropped.
func (m *connSM) close() {
	m.state = stateClosed
	m.pend = 0
}

// onDialed is the end of the dial for a guest-initiated connection. It
// returns keep false when the connection no longer wants the socket (the
// guest gave up, or the device was reset): the caller closes it.
func (m *connSM) onDialed(dialErr bool) (a act, keep bool) {
	if m.state != stateGuestConnecting {
		return 0, false
	}
	if dialErr {
		return m.abort(), false
	}
	m.state = stateEstablished
	m.pend |= pendResponse
	return actCountEstablished, true
}

// onAccepted is the end of actWriteOK: the host client was told "OK" and
// its socket joined the epoll set (ok), and the connection is established;
// or that failed (the client went away), and the attempt is refused.
func (m *connSM) onAccepted(ok bool) act {
	if m.state != stateHostConnecting {
		return 0
	}
	if !ok {
		return m.abort()
	}
	m.state = stateEstablished
	return actCountEstablished
}

// onHostFailed: the host socket failed (a read or write error, or the OK
// line could not be written): the device resets the connection.
func (m *connSM) onHostFailed() act { return m.abort() }

// onGuestOp is a guest packet for this connection, after the session
// checked its addresses, type and length. For OpRW the caller goes on with
// the payload only when rwAdmitted says so.
func (m *connSM) onGuestOp(op Op, flags uint32) act {
	if m.state == stateClosed {
		return 0
	}
	switch op {
	case OpResponse:
		if m.state != stateHostConnecting {
			return actProtoErr | m.abort()
		}
		return actStopTimer | actWriteOK
	case OpRst:
		// After the device's SHUTDOWN(BOTH) (closing) this is the
		// orderly end and counts nothing; before, the guest refused or
		// reset the connection.
		var a act
		switch m.state {
		case stateGuestConnecting, stateHostConnecting:
			a = actCountRefused
		case stateEstablished:
			a = actCountReset
		}
		m.close()
		return a | actClose
	case OpShutdown:
		if m.state != stateEstablished && m.state != stateClosing {
			return m.abort()
		}
		var a act
		if flags&ShutdownRcv != 0 && m.guestShut&ShutdownRcv == 0 {
			a |= actShutHostRead
		}
		m.guestShut |= flags & ShutdownBoth
		if m.guestShut&ShutdownSend != 0 {
			a |= actDropMsg
		}
		return a | actFlush
	case OpRW:
		if m.state == stateClosing && m.guestShut&ShutdownSend == 0 {
			// The host went away and the device sent SHUTDOWN(BOTH);
			// the guest queued this before it saw that: no error.
			return actDropLate
		}
		if m.state != stateEstablished || m.guestShut&ShutdownSend != 0 {
			return actProtoErr | m.abort()
		}
		return 0
	case OpCreditUpdate:
		return 0 // the credit fields are all it carries
	case OpCreditRequest:
		// Answered only on an open connection: before RESPONSE the
		// connection is not open yet (REQUEST and RESPONSE carry the
		// credit), and after SHUTDOWN(BOTH) the device sends nothing
		// but RST. No error: the guest may not have seen either.
		if m.state == stateEstablished {
			m.pend |= pendCredit | pendCreditForced
		}
		return 0
	}
	return actProtoErr | m.abort()
}

// rwAdmitted reports whether the result of onGuestOp(OpRW) lets the
// payload through to the credit check and the host.
func rwAdmitted(a act) bool { return a&(actProtoErr|actDropLate|actClose) == 0 }

// onWrongType is a packet whose socket type is not the connection's (Linux
// resets a socket on one too): an RST from the guest just closes, anything
// else is reset.
func (m *connSM) onWrongType(op Op) act {
	if m.state == stateClosed {
		return 0
	}
	if op == OpRst {
		return m.onGuestOp(OpRst, 0)
	}
	return m.abort()
}

// onHostDrained: the host socket has taken everything the guest sent. The
// guest's SHUTDOWN takes effect now: SEND half-closes the host socket;
// both flags end the connection with the RST the guest waits for (the
// orderly end, counted as nothing).
func (m *connSM) onHostDrained() act {
	if m.state == stateClosed {
		return 0
	}
	var a act
	if m.guestShut&ShutdownSend != 0 && !m.hostWriteShut {
		m.hostWriteShut = true
		a |= actShutHostWrite
	}
	if m.guestShut == ShutdownBoth {
		m.close()
		a |= actClose | actRst
	}
	return a
}

// onHostEOF: a read from the host socket returned the end of the stream.
// The guest is told SHUTDOWN(SEND), or BOTH if the host also hung up. Only
// an established connection reads its socket (or has it in the epoll set).
func (m *connSM) onHostEOF() {
	if m.state != stateEstablished {
		return
	}
	m.hostEOF = true
	m.shutFlags = ShutdownSend
	if m.hostHup {
		m.shutFlags = ShutdownBoth
	}
	m.pend |= pendShutdown
}

// onHostHangup: epoll reported EPOLLHUP, the host closed both ways.
func (m *connSM) onHostHangup() {
	if m.state != stateEstablished || m.hostHup {
		return
	}
	m.hostHup = true
	switch {
	case m.guestShut&ShutdownRcv != 0 && !m.hostEOF:
		// The device no longer reads this socket (the guest shut down
		// receiving), so no read will see the host's EOF: the hang-up is
		// all the news there is.
		m.hostEOF = true
		m.shutFlags = ShutdownBoth
		m.pend |= pendShutdown
	case m.hostEOF && m.shutFlags != ShutdownBoth:
		// The guest was told the host stopped sending; now it has
		// stopped receiving too.
		m.shutFlags = ShutdownBoth
		m.pend |= pendShutdown
	}
}

// onShutdownSent: the pending SHUTDOWN is in the guest's ring. After
// SHUTDOWN(BOTH) the guest answers with RST; one that does not is reset
// after the close timeout, so its host descriptor is not held for ever
// (Firecracker waits 2 s too).
func (m *connSM) onShutdownSent() act {
	m.pend &^= pendShutdown
	if m.shutFlags != ShutdownBoth || m.state != stateEstablished {
		return 0
	}
	m.state = stateClosing
	return actStartCloseTimer
}

// onConnectTimeout: the connect timer fired. A connection still not
// established is refused.
func (m *connSM) onConnectTimeout() act {
	if m.state == stateHostConnecting || m.state == stateGuestConnecting {
		return m.abort()
	}
	return 0
}

// onCloseTimeout: the close timer fired. A connection the guest has not
// answered with RST is reset.
func (m *connSM) onCloseTimeout() act {
	if m.state == stateClosing {
		return m.abort()
	}
	return 0
}
