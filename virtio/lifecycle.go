package virtio

import (
	"errors"
	"sync"
	"time"
)

// Session is one activation of a device: the workers and the state tied to
// the driver's queues. Stop ends its workers and returns once they have.
type Session interface {
	Stop()
}

// ErrClosed is returned by Lifecycle.Activate and Lifecycle.Wait once the
// device is closed.
var ErrClosed = errors.New("device closed")

// Lifecycle is the Activate / Reset / Close state every device shares: at
// most one session at a time, none once closed, a session stopped outside
// the lock (its workers may take locks of their own on the way out), and
// waiters released when a session starts or the device closes. A device
// holds one and calls it from its Device methods; the zero value is ready.
//
// Lock: mu guards cur, closed, ready and done. It is held while a session
// starts (Activate's start), never while one stops; it is the device's
// outermost lock.
type Lifecycle[S Session] struct {
	// Name prefixes its errors ("vsock: device closed").
	Name string

	mu     sync.Mutex
	cur    S
	active bool
	closed bool
	ready  chan struct{} // closed once a session runs; replaced by Reset
	done   chan struct{} // closed by Close
}

// initLocked makes the channels of a zero Lifecycle.
func (l *Lifecycle[S]) initLocked() {
	if l.ready == nil {
		l.ready = make(chan struct{})
		l.done = make(chan struct{})
	}
}

func (l *Lifecycle[S]) errorf(err error) error {
	if l.Name == "" {
		return err
	}
	return &lifecycleError{name: l.Name, err: err}
}

type lifecycleError struct {
	name string
	err  error
}

func (e *lifecycleError) Error() string { return e.name + ": " + e.err.Error() }
func (e *lifecycleError) Unwrap() error { return e.err }

// errTwice is an Activate without a Reset since the last one (the
// transport never does that).
var errTwice = errors.New("activated twice without a reset")

// Activate starts a session with start, under the lock, unless the device
// is closed (ErrClosed) or a session runs.
func (l *Lifecycle[S]) Activate(start func() (S, error)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.initLocked()
	switch {
	case l.closed:
		return l.errorf(ErrClosed)
	case l.active:
		return l.errorf(errTwice)
	}
	s, err := start()
	if err != nil {
		return err
	}
	l.cur, l.active = s, true
	close(l.ready)
	return nil
}

// Reset stops the session, if one runs, and returns once its workers have.
func (l *Lifecycle[S]) Reset() { l.stop(false) }

// stop ends the session, if one runs, outside the lock: with Drain when
// drain is set and the session is a Drainer, else with Stop.
func (l *Lifecycle[S]) stop(drain bool) {
	l.mu.Lock()
	l.initLocked()
	s, active := l.cur, l.active
	var zero S
	l.cur, l.active = zero, false
	if active {
		l.ready = make(chan struct{})
	}
	l.mu.Unlock()
	if !active {
		return
	}
	if d, ok := any(s).(Drainer); ok && drain {
		d.Drain()
		return
	}
	s.Stop()
}

// Drainer is a Session that can stop without dropping work, for a pause
// (Quiescer): Drain stops its workers as Stop does, but first has them
// return every chain they popped (pushed, published and notified, as
// after normal completion) or put it back with Queue.Undo, so that the
// queues' positions are final and a later activation can take over at
// them. A session whose Stop already leaves no chain popped (its workers
// pop, serve and push without looking for the stop signal in between)
// need not implement it.
type Drainer interface {
	Session
	Drain()
}

// Quiesce stops the session, if one runs, for a pause rather than a
// driver reset: with Drain when the session is a Drainer, else with Stop.
// Like Reset it stops the session outside the lock and returns once its
// workers have; a later Activate starts a new session (MMIO.Resume, or a
// restore, hands it queues positioned where this one left them). A
// device's Quiescer.Quiesce is usually just this.
func (l *Lifecycle[S]) Quiesce() { l.stop(true) }

// Close refuses later activations, releases waiters and stops the session.
// It reports whether this call closed the device (false: closed before).
func (l *Lifecycle[S]) Close() bool {
	l.mu.Lock()
	l.initLocked()
	first := !l.closed
	if first {
		l.closed = true
		close(l.done)
	}
	l.mu.Unlock()
	l.Reset()
	return first
}

// Current returns the running session, if any. The session may be stopping
// by the time the caller uses it; sessions must allow that.
func (l *Lifecycle[S]) Current() (S, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur, l.active
}

// Closed says whether Close has been called.
func (l *Lifecycle[S]) Closed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// ErrNotReady is returned by Wait when the deadline passes with no session.
var ErrNotReady = errors.New("the guest driver is not ready")

// Wait returns the running session, waiting for one until deadline:
// ErrNotReady when the deadline passes first, ErrClosed once closed.
func (l *Lifecycle[S]) Wait(deadline time.Time) (S, error) {
	var zero S
	for {
		l.mu.Lock()
		l.initLocked()
		s, active, closed, ready, done := l.cur, l.active, l.closed, l.ready, l.done
		l.mu.Unlock()
		switch {
		case closed:
			return zero, l.errorf(ErrClosed)
		case active:
			return s, nil
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return zero, l.errorf(ErrNotReady)
		}
		t := time.NewTimer(wait)
		select {
		case <-ready:
		case <-t.C:
		case <-done:
		}
		t.Stop()
	}
}
