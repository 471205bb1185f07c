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
// and the host sockets do. Each connection is granted up to its share of
// the budget (grantLocked). Credit is granted, never taken back: the
// advertised buf_alloc only grows (to Config.ConnBuffer) and fwd_cnt only
// moves forward (a Linux driver that saw buf_alloc shrink below what it has
// in flight would compute a wrapped credit). When the budget is spent a
// connection is advertised less buf_alloc (from its REQUEST or RESPONSE on)
// or a fwd_cnt behind the bytes its host took, and waits on the starved
// list: bytes the host sockets take, and connections that close, give
// budget back, and the RX worker then sends the starved connections a
// CREDIT_UPDATE with what they can now have.
//
// used is atomic (every connection's grants and releases, under different
// conn.mu); mu, a leaf below conn.mu and rxMu, guards the starved list.
type budget struct {
	limit uint64
	used  atomic.Uint64

	mu      sync.Mutex
	starved []*conn // connections granted less than they wanted; conn.starved marks membership
	freed   atomic.Bool
}

// take reserves up to want bytes and returns how many it got.
func (b *budget) take(want uint64) uint64 {
	for {
		u := b.used.Load()
		if u >= b.limit {
			return 0
		}
		got := min(want, b.limit-u)
		if b.used.CompareAndSwap(u, u+got) {
			return got
		}
	}
}

// release gives n bytes back and reports whether a starved connection may
// now get some.
func (b *budget) release(n uint64) bool {
	if n == 0 {
		return false
	}
	b.used.Add(^(n - 1))
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

// minGrant is the least window a connection aims for, however many share
// the budget.
const minGrant = 4096

// grantLocked tops up c's advertised credit, from the budget, to its share:
// Config.ConnBuffer, or less when MaxBuffered split among the open
// connections is smaller (at least minGrant). The share, not a full window,
// is what a connection may hold while idle, so connections that stop
// sending cannot pin the whole budget. The fwd_cnt held back goes first,
// then buf_alloc grows. A connection the budget leaves short goes on the
// starved list. Called with c.mu held, before a packet carries c.bufAlloc
// and c.grantFwd to the guest.
func (s *session) grantLocked(c *conn) {
	if c.state == stateClosed {
		return
	}
	open := uint64(max(s.d.ctr.connsOpen.Load(), 1))
	target := min(uint64(s.d.cfg.ConnBuffer), max(s.budget.limit/open, minGrant))
	if c.typ == TypeSeqpacket {
		// A message is forwarded only whole, so its fragments hold the
		// window until the last one: a window below the message size
		// would stall it for ever. SEQPACKET aims for the full buffer.
		target = uint64(s.d.cfg.ConnBuffer)
	}
	exp := c.exposureLocked()
	if exp >= target {
		return
	}
	held := uint64(c.fwdCnt - c.grantFwd)
	grow := uint64(s.d.cfg.ConnBuffer - c.bufAlloc)
	want := min(target-exp, held+grow)
	if want == 0 {
		return
	}
	got := s.budget.take(want)
	r := min(got, held)
	c.grantFwd += uint32(r)
	c.bufAlloc += uint32(got - r)
	if got < want {
		s.d.ctr.creditStalls.Add(1)
		s.budget.starve(c)
	}
}

// forwardedLocked records n guest bytes the host socket took: they leave
// the device's buffers and the exposure. Called with c.mu held.
func (s *session) forwardedLocked(c *conn, n uint32) {
	c.fwdCnt += n
	if s.budget.release(uint64(n)) {
		s.wakeRX()
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
		if c.state == stateEstablished {
			c.pend |= pendCredit | pendCreditForced
			s.markReadyLocked(c)
		}
		c.mu.Unlock()
	}
}
