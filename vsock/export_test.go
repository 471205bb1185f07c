package vsock

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Probe is a snapshot of the active session's internals for the session
// fuzz targets (session_fuzz_test.go): what they check after every step
// (memory bounds, budget accounting) and whether the device has gone quiet.
type Probe struct {
	Active bool // a session runs
	Failed bool // the session called Activation.Fail
	// Idle: nothing is in flight inside the device: no dial goroutine,
	// no RX entry pushed but unpublished, the RX worker asleep in
	// epoll_wait with no event pending and either nothing to send or no
	// RX buffer to send it in. With the guest's TX ring drained too,
	// nothing changes until the guest, the host or a timer acts.
	Idle bool

	Conns         int   // connections in the table
	ClosedInTable int   // closed connections still in the table (must be 0)
	ConnsOpenStat int64 // Stats.ConnsOpen
	Dials         int64 // dial goroutines in flight
	Rsts          int   // RSTs queued for the guest
	// RxOut is how many guest RX buffers the device popped and did not
	// return; RxSpare how many of them wait on the spare list. At rest
	// (Idle) they are the same: a buffer popped for a host read and
	// neither filled nor kept is lost to the guest for good.
	RxOut, RxSpare int

	BudgetUsed, BudgetLimit uint64
	Exposure                uint64 // sum of every connection's exposure
	Buffered                uint64 // guest bytes the device holds (toHost and unfinished SEQPACKET messages)
	// Problems are per-connection invariants found broken.
	Problems []string
}

// Probe takes a Probe. The table's connections are all locked at once (in
// table order; the workers never hold two conn.mu, so this cannot deadlock
// with them) so that the budget and the exposures are read consistently.
func (d *Device) Probe() Probe {
	s, _ := d.life.Current()
	p := Probe{ConnsOpenStat: d.ctr.connsOpen.Load()}
	if s == nil {
		return p
	}
	p.Active = true
	p.Failed = s.failed.Load()
	s.connMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connMu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
	}
	// A connection closes and leaves the table under its own lock, so
	// with every lock held membership is settled: one the snapshot above
	// holds may have closed and left since (the RX worker may still be
	// finishing a pass the harness could not see: settle's Idle reads
	// rxSleeping, which the worker clears only after epoll_wait returns),
	// and that is no leak. Stats.ConnsOpen moves under the same locks.
	s.connMu.Lock()
	inTable := make([]bool, len(conns))
	for i, c := range conns {
		inTable[i] = s.conns[c.key] == c
		if inTable[i] {
			p.Conns++
		}
	}
	s.connMu.Unlock()
	p.ConnsOpenStat = d.ctr.connsOpen.Load()
	var pooled uint64
	for i, c := range conns {
		if c.sm.state == stateClosed && inTable[i] {
			p.ClosedInTable++
		}
		exp := c.exposureLocked()
		held := uint64(c.toHost.Len() + len(c.msg))
		p.Exposure += exp
		pooled += s.budget.poolPart(exp)
		if c.sm.state != stateClosed && (c.bufAlloc > c.window || c.window > d.cfg.ConnBuffer) {
			p.Problems = append(p.Problems, fmt.Sprintf("%d<->%d (%v): window %d, buf_alloc %d, ConnBuffer %d: want buf_alloc <= window <= ConnBuffer",
				c.key.hostPort, c.key.guestPort, c.sm.state, c.window, c.bufAlloc, d.cfg.ConnBuffer))
		}
		p.Buffered += held
		if held > exp {
			p.Problems = append(p.Problems, fmt.Sprintf("%d<->%d (%v): holds %d guest bytes, exposure %d (buf_alloc %d, fwd_cnt %d, granted fwd_cnt %d)",
				c.key.hostPort, c.key.guestPort, c.sm.state, held, exp, c.bufAlloc, c.fwdCnt, c.grantFwd))
		}
		if uint64(c.fromGuest-c.fwdCnt) < held {
			p.Problems = append(p.Problems, fmt.Sprintf("%d<->%d (%v): holds %d guest bytes but only %d were taken and not forwarded",
				c.key.hostPort, c.key.guestPort, c.sm.state, held, c.fromGuest-c.fwdCnt))
		}
		if c.bufAlloc > d.cfg.ConnBuffer {
			p.Problems = append(p.Problems, fmt.Sprintf("%d<->%d: buf_alloc %d over ConnBuffer %d",
				c.key.hostPort, c.key.guestPort, c.bufAlloc, d.cfg.ConnBuffer))
		}
	}
	p.BudgetUsed = s.budget.used.Load()
	p.BudgetLimit = s.budget.limit
	// The pool holds exactly the exposures' parts above the minimum
	// window, and never more than MaxBuffered less the reserve.
	if got := s.budget.pooled.Load(); got != pooled || got > s.budget.pool {
		p.Problems = append(p.Problems, fmt.Sprintf("pool in use %d, the exposures' parts above %d add up to %d, pool %d",
			got, s.budget.base, pooled, s.budget.pool))
	}
	for i := len(conns) - 1; i >= 0; i-- {
		conns[i].mu.Unlock()
	}
	p.Dials = s.dials.Load()
	s.rxMu.Lock()
	p.Rsts = len(s.rsts)
	p.RxOut, p.RxSpare = int(s.rx.LastAvail()-s.rx.NextUsed()), s.rxSpare.n
	work := len(s.ready) > 0 || len(s.rsts) > 0
	pushed := s.rxPushed
	avail := false
	if work && !p.Failed {
		avail, _ = s.rxAvailableLocked()
	}
	s.rxMu.Unlock()
	p.Idle = p.Dials == 0 && !pushed && !avail && s.rxSleeping.Load() && !s.budget.freed.Load() && !pollIn(s.epfd)
	return p
}

// pollIn reports whether fd (here the epoll set) is readable, without
// consuming anything.
func pollIn(fd int) bool {
	for {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
}

// FireTimers runs, now, the timeout of every connection that has one armed
// (the connect timeout of a host-initiated attempt, the close timeout after
// the device's SHUTDOWN(BOTH)), as if it had expired: the fuzz targets use
// a connect timeout of hours so that time never decides anything, and fire
// the timers at a point of the input's choosing instead.
func (d *Device) FireTimers() {
	s, _ := d.life.Current()
	if s == nil {
		return
	}
	s.connMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connMu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		armed := c.timer != nil
		c.mu.Unlock()
		if armed {
			// Each acts only in its own state: at most one does anything.
			c.onTimer((*connSM).onConnectTimeout)
			c.onTimer((*connSM).onCloseTimeout)
		}
	}
}

// SetRxReadHook makes f run between popping the RX buffers of a host read
// and the read (testHookRead) until the test ends. It applies to every
// device in the process: a test that sets it must not run in parallel.
func SetRxReadHook(tb interface{ Cleanup(func()) }, f func(txWorker bool)) {
	testHookRead.Store(&f)
	tb.Cleanup(func() { testHookRead.Store(nil) })
}

// ProbeRX is the part of a Probe that locks no connection (usable while a
// worker holds one): RX buffers popped and not returned, those on the
// spare list, and whether the RX worker has gone to sleep or is about to
// (it re-checks for work first).
func (d *Device) ProbeRX() (out, spare int, asleep bool) {
	s, _ := d.life.Current()
	if s == nil {
		return 0, 0, false
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	return int(s.rx.LastAvail() - s.rx.NextUsed()), s.rxSpare.n, s.rxSleeping.Load()
}

// SessionBudget returns a function that reads the budget in use
// (Stats.BufferGranted) of the session running now, and goes on reading
// that session's after it stops: for checking what a stopped session gave
// back. Nil when no session runs.
func (d *Device) SessionBudget() func() uint64 {
	s, ok := d.life.Current()
	if !ok {
		return nil
	}
	return s.budget.used.Load
}

// SetBatchHooks has the TX worker call tx after each batch it publishes,
// and the datagram worker dgram after each batch of guest datagrams, on
// their own goroutines (nil: none).
func (d *Device) SetBatchHooks(tx, dgram func()) {
	for _, h := range []struct {
		p *atomic.Pointer[func()]
		f func()
	}{{&d.afterTXBatch, tx}, {&d.afterDgramBatch, dgram}} {
		if h.f == nil {
			h.p.Store(nil)
		} else {
			h.p.Store(&h.f)
		}
	}
}
