package virtio9p

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hugelgupf/p9/p9"
)

// drainTimeout bounds how long ending a connection waits for the server
// to answer the requests it holds (a driver reset or Close; a Quiesce
// waits for every answer, unbounded, in Drain).
const drainTimeout = 2 * time.Second

// conn is one 9P connection: a p9 server session (Server.Handle) over two
// pipes. The server's state for the guest, its fids and the files they
// hold open, lives in that session, so the connection is the device's
// rather than an activation's: a Quiesce ends the virtio session that
// feeds it and leaves it running, and the next session (MMIO.Resume)
// carries on with the guest's fids. A driver reset or Close ends it
// (end), and the server then closes every file the guest had.
//
// Goroutines, owned by the connection and ended by end: the server's
// (Handle, plus the ones it starts per request, which it owns) and the
// reader (read), which takes whole replies off the reply pipe and hands
// each to the session receiving from replies, or drops it once end has
// begun. Neither touches a queue or guest memory; only a session does.
// While the device is quiesced nothing is in flight, so both wait on
// their pipes.
type conn struct {
	// toServer carries requests; one session's request loop writes it
	// at a time (the Lifecycle runs one session at a time).
	toServer *io.PipeWriter
	// replies carries whole replies to the running session's reply loop;
	// closed by the reader once the server has ended.
	replies chan []byte
	// closing is closed by end: replies no session takes are dropped.
	closing chan struct{}
	// served is closed once Handle has returned (every handler done,
	// every file closed); readDone once the reader has.
	served, readDone chan struct{}

	// Requests written and replies read: the server answers every
	// request it takes, decoded or not, so the difference is what its
	// handlers still hold.
	toServerN, fromServerN atomic.Uint64
	// broken is set when a session on the connection failed (a guest
	// error): a reply may still be owed to a request that session
	// dropped, so the next activation starts a new connection.
	broken atomic.Bool

	endOnce sync.Once
}

// newConn starts a p9 server session over attacher (the share, or what
// tests wrap around it).
func newConn(d *Device) *conn {
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	c := &conn{toServer: reqW, replies: make(chan []byte), closing: make(chan struct{}),
		served: make(chan struct{}), readDone: make(chan struct{})}
	srv := p9.NewServer(d.attacher, p9.WithServerLogger(traceLog{d}))
	go func() {
		defer close(c.served)
		// Handle returns once the request pipe ends and every handler
		// has answered; it closes both pipes' server ends and every file
		// the guest had open. It also returns when a request breaks the
		// connection (longer than the msize the guest negotiated, or not
		// a message): the reader then closes replies, and the session
		// receiving reports the guest error.
		serve(srv, reqR, repW, d)
	}()
	go c.read(repR)
	return c
}

// serve runs the server's session. A panic from it (the WaitGroup race
// end works around) is logged, not fatal: the connection is ending anyway,
// and its pipes are closed so the reader ends too.
func serve(srv *p9.Server, reqR *io.PipeReader, repW *io.PipeWriter, d *Device) {
	defer func() {
		if r := recover(); r != nil {
			d.log.WithField("panic", r).Error("9p: the server's session ended in a panic; its open files may leak")
			reqR.Close()
			repW.Close()
		}
	}()
	_ = srv.Handle(reqR, repW)
}

// traceLog passes the server's own messages, about two lines per guest
// request, to the device's log at trace level: at debug they drowned every
// other line of a VM that reads files (containerd copies its shims' logs
// into its own). A logger without a trace level gets none of them.
type traceLog struct{ d *Device }

func (l traceLog) Printf(format string, v ...any) {
	if t, ok := l.d.log.(interface{ Tracef(string, ...any) }); ok {
		t.Tracef("9p server: "+format, v...)
	}
}

// write hands one request to the server. It returns once the server has
// read it, or with an error once the server has ended.
func (c *conn) write(msg []byte) error {
	if _, err := c.toServer.Write(msg); err != nil {
		return fmt.Errorf("9p: request to the server: %w", err)
	}
	c.toServerN.Add(1)
	return nil
}

// read is the reader: it splits the reply pipe into messages and hands
// each to the session receiving on replies. The server writes a reply
// whole under its send lock, so the pipe holds one message after another.
func (c *conn) read(r *io.PipeReader) {
	defer close(c.readDone)
	defer close(c.replies)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return // the server ended
		}
		size := binary.LittleEndian.Uint32(hdr[:])
		if size < hdrLen || size > MaxMessage+hdrLen {
			// The server wrote what it must not: a host invariant broke.
			panic(fmt.Sprintf("virtio9p: server reply of %d bytes", size))
		}
		msg := make([]byte, size)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(r, msg[4:]); err != nil {
			return
		}
		c.fromServerN.Add(1)
		select {
		case c.replies <- msg:
		case <-c.closing:
		}
	}
}

// ended says whether the server's session has returned (end, or a request
// that broke the connection).
func (c *conn) ended() bool {
	select {
	case <-c.served:
		return true
	default:
		return false
	}
}

// end closes the connection and waits for its goroutines: the server
// closes every file the guest had open. Replies still owed are read and
// dropped (no session is running: the caller stopped it first). Calls
// after the first return at once.
func (c *conn) end() {
	c.endOnce.Do(func() {
		close(c.closing)
		// Let the server answer what it holds before its request pipe
		// ends: hugelgupf/p9 v0.3.0's Handle waits for its handlers with
		// a WaitGroup that a receiver goroutine it spawned may still Add
		// to, a data race (and, rarely, a "WaitGroup is reused" panic)
		// when that Wait has to block. Ending the pipe once the handlers
		// are done keeps the Wait from blocking; the bound keeps a reset
		// from waiting long on a slow host file.
		deadline := time.Now().Add(drainTimeout)
	drain:
		for c.toServerN.Load() > c.fromServerN.Load() && time.Now().Before(deadline) {
			select {
			case <-c.served: // the server is gone: nothing more will come
				break drain
			case <-time.After(time.Millisecond):
			}
		}
		time.Sleep(2 * time.Millisecond) // the handlers return after their replies
		c.toServer.CloseWithError(io.EOF)
		<-c.served
		<-c.readDone
	})
}
