package vsock

import (
	"fmt"
	"sync"
	"time"
)

// connKey identifies a connection: the host-side port and the guest's port.
type connKey struct {
	hostPort  uint32
	guestPort uint32
}

// String is "host<->guest", the ports as log lines show them.
func (k connKey) String() string { return fmt.Sprintf("%d<->%d", k.hostPort, k.guestPort) }

// conn is one connection between a guest socket and a host socket: a stream
// (typ TypeStream) or a SEQPACKET one (TypeSeqpacket), whose host socket is
// a SOCK_SEQPACKET socket and whose messages keep their boundaries.
//
// Locking: mu guards every field below it. The fd is only used under mu, so
// closing it can never race with a read or write. inReady is guarded by the
// session's rxMu instead (it mirrors membership of the RX ready list).
type conn struct {
	key connKey
	typ uint16   // TypeStream or TypeSeqpacket, fixed at creation
	env *connEnv // the session's muxer and settings (mux.go)

	mu sync.Mutex
	// sm is the protocol state (connsm.go): state, shutdown flags of
	// either side, control packets owed to the guest.
	sm connSM
	fd int // host socket (non-blocking), -1 when none

	// Guest -> host. Fields are named for the direction the bytes move
	// (fromGuest, toHost), or by the spec's name for our receive side
	// (bufAlloc: what we advertise, granted from the device's budget and
	// only ever grown; fwdCnt: bytes written to the host socket; grantFwd:
	// the fwd_cnt the budget lets us advertise, at most fwdCnt; lastFwd and
	// lastBufAlloc: what we last told the guest). fromGuest
	// counts payload bytes the guest sent; toHost holds those the host
	// socket has not taken yet, which the guest's credit keeps below
	// bufAlloc.
	bufAlloc     uint32
	fromGuest    uint32
	fwdCnt       uint32
	grantFwd     uint32
	lastFwd      uint32
	lastBufAlloc uint32
	toHost       byteQueue
	// window is the exposure the connection aims for (budget.go): set at
	// its first grant (base for a stream, ConnBuffer for SEQPACKET),
	// grown by growWindowLocked as the guest uses it, never below
	// bufAlloc; 0 before the first grant.
	window uint32

	// Host -> guest: the guest's receive window (peer*: the guest's own
	// buf_alloc and fwd_cnt) and toGuest, the payload bytes sent to it.
	// All counters wrap (u32 arithmetic).
	peerBufAlloc uint32
	peerFwdCnt   uint32
	toGuest      uint32

	// prefix holds host bytes that arrived with the CONNECT line; they go
	// to the guest before anything read from the socket.
	prefix []byte
	// hostReadable: the socket may have data (an EPOLLIN edge was seen and
	// no read has returned EAGAIN, or less than it asked for, since).
	// hostClosing: a hang-up edge was seen (EPOLLRDHUP, EPOLLHUP or
	// EPOLLERR); no edge will announce the end of the stream again, so a
	// short read no longer counts as drained.
	hostReadable bool
	hostClosing  bool
	// events is what the socket's epoll registration asks for
	// (interest.go); 0 while it is not registered.
	events uint32

	// SEQPACKET, guest -> host. msg holds the fragments of the message
	// the guest is sending (no EOM yet). Complete messages the host
	// socket has not taken wait in tx, one record after another, with
	// their lengths (and SeqEOR) in recs. All of it counts against the
	// credit, so it stays below bufAlloc (recs adds 4 bytes per message).
	msg  []byte
	recs seqRecords

	// SEQPACKET, host -> guest. rec[recOff:] is the rest of a record read
	// from the host socket and not yet sent to the guest (the credit for
	// all of it was there when it was read); recEnd the flags of its last
	// packet. seqNeed is the length of the next record, peeked while the
	// guest's credit was too small for it: the record waits for that
	// much credit (0: none waiting).
	rec     []byte
	recOff  int
	recEnd  uint32
	seqNeed uint32

	timer *time.Timer // connect or close timeout
	// wakeRX: the RX worker is to be woken once mu is released (unlock):
	// budget came back that a starved connection waits for, an RST was
	// queued, or RX buffers went to the spare list while other work waits.
	wakeRX bool

	inReady bool // guarded by session.rxMu
	starved bool // on the budget's starved list; guarded by budget.mu
}

// peerCredit is how many more payload bytes the guest can take.
// Guarded by mu.
func (c *conn) peerCredit() uint32 {
	inFlight := c.toGuest - c.peerFwdCnt
	if inFlight > c.peerBufAlloc {
		return 0 // the guest shrank its buffer, or lies: send nothing
	}
	return c.peerBufAlloc - inFlight
}

// guestViewFree is the free space the guest believes we have: what it may
// still send before it needs a credit update. Guarded by mu.
func (c *conn) guestViewFree() uint32 {
	used := c.fromGuest - c.lastFwd
	if used > c.bufAlloc {
		return 0
	}
	return c.bufAlloc - used
}

// updatePeerCredit takes the credit fields every guest packet carries.
func (c *conn) updatePeerCredit(h *Header) {
	c.peerBufAlloc = h.BufAlloc
	c.peerFwdCnt = h.FwdCnt
}

// hasRxWork reports whether the connection has something for the guest.
// Guarded by mu.
func (c *conn) hasRxWork() bool {
	if c.sm.state == stateClosed {
		return false
	}
	return c.sm.pend != 0 || c.dataReady()
}

// dataReady: host data could flow to the guest now. A SEQPACKET record
// peeked but not yet read waits until the guest's credit covers all of it,
// so that no record is ever cut by a credit stall.
func (c *conn) dataReady() bool {
	if !c.sm.guestReceives() {
		return false
	}
	if c.typ == TypeSeqpacket {
		if c.recOff < len(c.rec) {
			return true
		}
		return !c.sm.hostEOF && c.hostReadable && c.peerCredit() >= max(c.seqNeed, 1)
	}
	return !c.sm.hostEOF && (len(c.prefix) > 0 || c.hostReadable) && c.peerCredit() > 0
}

// idleQueueCap is the largest array an idle connection keeps for a
// SEQPACKET message or record; larger ones are let go of once used.
const idleQueueCap = 4096

// seqRecords is a FIFO of the lengths of complete guest messages waiting in
// conn.tx, each with the SeqEOR bit in bit 31 (a message is at most
// bufAlloc <= MaxConnBuffer < 2^31 bytes).
type seqRecords struct {
	v   []uint32
	off int
}

const seqRecEOR = 1 << 31

func (r *seqRecords) len() int { return len(r.v) - r.off }

func (r *seqRecords) push(n uint32, eor bool) {
	if eor {
		n |= seqRecEOR
	}
	if r.off > 0 && len(r.v) == cap(r.v) && r.off >= len(r.v)/2 {
		k := copy(r.v, r.v[r.off:])
		r.v, r.off = r.v[:k], 0
	}
	r.v = append(r.v, n)
}

// head returns the first record's length and EOR bit.
func (r *seqRecords) head() (n int, eor bool) {
	v := r.v[r.off]
	return int(v &^ seqRecEOR), v&seqRecEOR != 0
}

func (r *seqRecords) pop() {
	r.off++
	if r.off == len(r.v) {
		r.v, r.off = r.v[:0], 0
		if cap(r.v) > idleQueueCap/4 {
			r.v = nil
		}
	}
}

func (r *seqRecords) reset() { r.v, r.off = nil, 0 }
