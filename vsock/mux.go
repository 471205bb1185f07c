package vsock

import (
	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/virtio"
)

// The seam between one connection and the muxer.
//
// A conn owns its host socket, its credit counters, the guest bytes it
// buffers, its timer and its state machine, and carries out that state
// machine's effects itself (connfx.go): half-closes, the "OK" line, closing
// its socket, giving its buffers back. Guest bytes reach its socket through
// its own methods too (connwrite.go), and it sizes its own window from the
// budget (budget.go) and its own epoll interest (interest.go). What belongs
// to all connections together it reaches only through mux: the table and
// its descriptor index, the epoll set, the RX side's ready list and RST
// queue. The session is the muxer and mux's only implementation; it routes
// guest packets and host events to connections (tx.go, rx.go) and never
// changes a connection's state itself.

// mux is what a connection asks of the muxer. Every method but wakeRX is
// called with the connection's mu held and takes only locks below it
// (connMu, rxMu: leaves); none blocks or moves data.
type mux interface {
	// watch indexes c under its host socket fd and adds fd to the
	// epoll set, asking for events.
	watch(c *conn, fd int, events uint32) error
	// rearm changes what fd's registration asks for.
	rearm(fd int, events uint32) error
	// unwatch drops fd from the index, if c is what it names; closing
	// fd then takes it out of the epoll set.
	unwatch(c *conn, fd int)
	// remove drops closed c from the connection table.
	remove(c *conn)
	// queueRst queues an RST to the guest for ports that have no
	// connection any more (h's ports and type) and reports whether the RX
	// worker must be woken for it: the caller does that once it holds no
	// connection lock (conn.unlock, through conn.wakeRX).
	queueRst(h Header) (wake bool)
	// wakeRX wakes the RX worker if it sleeps (budget came back); the
	// connection calls it after releasing mu (conn.unlock).
	wakeRX()
	// guestError counts and logs a protocol violation by the guest that
	// resets the connection, not the device.
	guestError(kind virtio.GuestErrorKind, format string, args ...any)
}

// connEnv is what every connection of one session shares: the muxer, and
// the device's configuration, options, counters and log, and the session's
// budget. Read-only after newSession (budget and counters synchronise
// themselves).
type connEnv struct {
	mux    mux
	cfg    *Config
	opts   Options
	ctr    *counters
	log    logrus.FieldLogger
	budget *budget
}
