package vsock

import (
	"sync"
	"sync/atomic"
)

// budget is the device-wide bound on guest->host bytes the device may have
// to buffer (Config.MaxBuffered): the sum over connections of what each
// could still make the device hold if its host socket stopped reading.
//
// A connection's exposure is bufAlloc - (fwdCnt - grantFwd): the guest may
// send until it has bufAlloc bytes beyond the fwd_cnt it was told, which is
// at most grantFwd, and of those the host took fwdCnt - grantFwd. So the
// bytes a connection buffers (fromGuest - fwdCnt) never exceed its
// exposure, and the budget bounds the device's buffers whatever the guest
// and the host sockets do.
//
// Credit is granted, never taken back: the advertised buf_alloc only grows
// and fwd_cnt only moves forward (a Linux driver that saw buf_alloc shrink
// below what it has in flight would compute a wrapped credit). So what an
// idle connection was once granted it keeps, and the budget is split in
// two so that idle connections can never leave a new one without credit:
//
//   - the reserve, MaxConns x base (base: minWindow, at most ConnBuffer):
//     the first base bytes of every connection's exposure. The table holds
//     at most MaxConns connections, so this part is always there: every
//     connection gets a window of base at its REQUEST or RESPONSE and gets
//     its exposure back up to base whenever the host takes its bytes.
//   - the pool, MaxBuffered - reserve: every exposure above base. A stream
//     connection's window (conn.window) starts at base and doubles, up to
//     ConnBuffer, each time the guest fills most of it (growWindowLocked);
//     the growth comes from the pool, and when the pool has none the window
//     stays where it is until the guest fills it again. So only connections
//     that move data hold pool budget, and an idle one pins at most the
//     window it last grew to.
//
// Which part of an exposure e is in which is a function of e alone (up to
// base: reserve, the rest: pool), so grants and releases move both sums
// with no state of their own per connection.
//
// used and pooled are atomic (every connection's grants and releases, under
// different conn.mu); mu, a leaf below conn.mu and rxMu, guards the starved
// list.
type budget struct {
	limit uint64 // Config.MaxBuffered
	base  uint64 // the window every connection is sure of
	pool  uint64 // limit - MaxConns*base: what exposures above base share

	used   atomic.Uint64 // the sum of the exposures (Stats.BufferGranted)
	pooled atomic.Uint64 // the sum of the exposures' parts above base, <= pool

	mu      sync.Mutex
	starved []*conn // connections granted less than they wanted; conn.starved marks membership
	freed   atomic.Bool
}

// minWindow is the window every connection starts with and is always sure
// of (budget.base: at most Config.ConnBuffer). 4 KiB, one page, is enough
// for a request-sized message, and small enough that the reserve of the
// default 1023 connections is 4 MiB and 16,384 fit in the default 64 MiB.
const minWindow = 4096

// DefaultMaxBufferedFor is the MaxBuffered a Config with these limits gets
// when it leaves it 0: DefaultMaxBuffered, or MinMaxBuffered when that is
// more.
func DefaultMaxBufferedFor(maxConns int, connBuffer uint32) uint64 {
	return max(DefaultMaxBuffered, MinMaxBuffered(maxConns, connBuffer))
}

// MinMaxBuffered is the least MaxBuffered New accepts for these limits: the
// reserve that gives each of maxConns connections its minimum window
// (4 KiB, or connBuffer when smaller).
func MinMaxBuffered(maxConns int, connBuffer uint32) uint64 {
	return uint64(max(maxConns, 0)) * min(minWindow, uint64(connBuffer))
}

func newBudget(cfg *Config) budget {
	base := min(minWindow, uint64(cfg.ConnBuffer))
	return budget{limit: cfg.MaxBuffered, base: base, pool: cfg.MaxBuffered - MinMaxBuffered(cfg.MaxConns, cfg.ConnBuffer)}
}

// poolPart is the part of exposure e that the pool holds.
func (b *budget) poolPart(e uint64) uint64 {
	if e > b.base {
		return e - b.base
	}
	return 0
}

// grow raises an exposure of exp by up to want bytes and returns how many
// it got: all of what lies below base (the reserve), then what the pool
// has left.
func (b *budget) grow(exp, want uint64) uint64 {
	reserved := min(want, b.base-min(exp, b.base))
	rest := want - reserved
	var pooled uint64
	for rest > 0 {
		p := b.pooled.Load()
		if p >= b.pool {
			break
		}
		g := min(rest, b.pool-p)
		if b.pooled.CompareAndSwap(p, p+g) {
			pooled = g
			break
		}
	}
	b.used.Add(reserved + pooled)
	return reserved + pooled
}

// shrink lowers an exposure of exp by n (n <= exp) and reports whether the
// pool got budget back that a starved connection may now have.
func (b *budget) shrink(exp, n uint64) bool {
	if n == 0 {
		return false
	}
	b.used.Add(^(n - 1))
	p := b.poolPart(exp) - b.poolPart(exp-n)
	if p == 0 {
		// Reserve only: nobody waits for it (a grant always gets it).
		return false
	}
	b.pooled.Add(^(p - 1))
	b.mu.Lock()
	wake := len(b.starved) > 0
	b.mu.Unlock()
	if wake {
		b.freed.Store(true)
	}
	return wake
}

// starve puts c on the starved list (once). Called with c.mu held.
func (b *budget) starve(c *conn) {
	b.mu.Lock()
	if !c.starved {
		c.starved = true
		b.starved = append(b.starved, c)
	}
	b.mu.Unlock()
}

// takeStarved empties the starved list and returns what it held.
func (b *budget) takeStarved() []*conn {
	b.mu.Lock()
	l := b.starved
	b.starved = nil
	for _, c := range l {
		c.starved = false
	}
	b.mu.Unlock()
	return l
}

// exposureLocked is what c may still make the device buffer. Called with
// c.mu held.
func (c *conn) exposureLocked() uint64 {
	return uint64(c.bufAlloc) - uint64(c.fwdCnt-c.grantFwd)
}

// windowLocked is the window c aims for: SEQPACKET the full ConnBuffer
// (below), a stream the window it has grown to, at least base. Called with
// c.mu held.
func (c *conn) windowLocked() uint64 {
	if c.window == 0 {
		c.window = uint32(c.env.budget.base)
		if c.typ == TypeSeqpacket {
			// A Linux guest refuses (EMSGSIZE) a message larger than the
			// buf_alloc it was told, and never sends part of one to ask
			// for more, so a SEQPACKET window cannot start small and
			// grow with use: it aims for the full ConnBuffer from its
			// REQUEST or RESPONSE on.
			c.window = c.env.cfg.ConnBuffer
		}
	}
	return uint64(c.window)
}

// grantLocked tops up c's exposure, from the budget, to its target: its
// window (windowLocked), capped for streams at its share of the budget,
// MaxBuffered / open connections (never below base), so that busy
// connections share the pool fairly. The fwd_cnt held back goes first,
// then buf_alloc grows. The part up to base always comes (the reserve);
// above it, what the pool has left. When the pool leaves c short:
//   - of a fwd_cnt held back, or of a SEQPACKET window, c goes on the
//     starved list and is sent a CREDIT_UPDATE once the pool gets budget
//     back;
//   - of a stream window's growth, the window falls back to the buf_alloc
//     c has: it asks again when the guest fills it (growWindowLocked), and
//     an idle connection waits on no list.
//
// Called with c.mu held, before a packet carries c.bufAlloc and c.grantFwd
// to the guest.
func (c *conn) grantLocked() {
	if c.sm.state == stateClosed {
		return
	}
	target := c.windowLocked()
	if c.typ == TypeStream {
		open := uint64(max(c.env.ctr.connsOpen.Load(), 1))
		target = min(target, max(c.env.budget.limit/open, c.env.budget.base))
	}
	exp := c.exposureLocked()
	if exp >= target {
		return
	}
	// bufAlloc <= window, so held-back fwd_cnt and growth cover want.
	held := uint64(c.fwdCnt - c.grantFwd)
	want := target - exp
	got := c.env.budget.grow(exp, want)
	r := min(got, held)
	c.grantFwd += uint32(r)
	c.bufAlloc += uint32(got - r)
	if got == want {
		return
	}
	c.env.ctr.creditStalls.Add(1)
	if r < held || c.typ == TypeSeqpacket {
		c.env.budget.starve(c)
		return
	}
	c.window = max(c.bufAlloc, uint32(c.env.budget.base))
}

// growWindowLocked doubles a stream connection's window (up to ConnBuffer)
// once the guest has used half of it: sent that much beyond the fwd_cnt it
// was last told, the point where the device owes it a CREDIT_UPDATE anyway
// (creditCheckLocked). That update then carries the larger buf_alloc, as
// far as the pool allows (grantLocked). So a connection that streams
// reaches ConnBuffer within a few updates (4 KiB to 256 KiB: six), while
// one that only trickles request-sized messages, each answered (every
// packet to the guest tells it the fwd_cnt), or stays idle keeps base.
// Half, not all of it: an update that reaches the guest before its credit
// runs out leaves it never quite filling the window, and a sender kept
// from ever blocking would otherwise stop growing below ConnBuffer. Called
// with c.mu held, after the guest's bytes were counted in c.fromGuest.
func (c *conn) growWindowLocked() {
	if c.typ != TypeStream || c.window == 0 || c.window >= c.env.cfg.ConnBuffer {
		return
	}
	if c.fromGuest-c.lastFwd < c.window/2 {
		return
	}
	c.window = min(2*c.window, c.env.cfg.ConnBuffer) // ConnBuffer <= 2^30: no wrap
	c.sm.pend |= pendCredit
}

// forwardedLocked records n guest bytes the host socket took: they leave
// the device's buffers and the exposure. Called with c.mu held.
func (c *conn) forwardedLocked(n uint32) {
	exp := c.exposureLocked()
	c.fwdCnt += n
	if c.env.budget.shrink(exp, uint64(n)) {
		c.wakeRX = true // after unlocking (conn.unlock)
	}
}

// feedStarved gives the starved connections a CREDIT_UPDATE each, now that
// budget was freed. Called by the RX worker, holding no lock.
func (s *session) feedStarved() {
	if !s.budget.freed.Swap(false) {
		return
	}
	for _, c := range s.budget.takeStarved() {
		c.mu.Lock()
		if c.sm.state == stateEstablished {
			c.sm.pend |= pendCredit | pendCreditForced
			s.markReadyLocked(c)
		}
		c.unlock()
	}
}
