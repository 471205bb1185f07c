package devices

import (
	"encoding/binary"
	"sync/atomic"
	"time"
)

// PVWaitPort is the paravirtual wait port (docs/machine.md).
const PVWaitPort = 0x600

// Bounds on one paravirtual wait.
const (
	PVWaitDefault = time.Millisecond
	PVWaitMax     = 100 * time.Millisecond
)

// PVWait lets a polling guest sleep in the VMM instead of spinning: a 32-bit
// write of N to the port blocks the writing vCPU until a device has raised an
// interrupt since the previous wait returned, or N microseconds (0: 1 ms,
// capped at 100 ms) have passed. Devices call Notify whenever they interrupt
// the guest; the "interrupt seen" flag is sticky, so a notification that lands
// between the guest's last ring check and its wait is never lost.
//
// With several vCPUs waiting, one notification wakes one of them; the others
// return at their timeout.
type PVWait struct {
	pending atomic.Bool
	waiters atomic.Int32
	wake    chan struct{} // one wake-up token
	stop    chan struct{} // closed by Close
	waits   atomic.Uint64
	wakeups atomic.Uint64
}

// NewPVWait returns the wait device.
func NewPVWait() *PVWait {
	return &PVWait{wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// Notify records that a device has work for the guest. Cheap enough for
// every interrupt: an atomic store, and a channel send only when a vCPU
// sleeps.
func (w *PVWait) Notify() {
	w.pending.Store(true)
	if w.waiters.Load() > 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Close wakes every waiter and makes later waits return at once; the VMM
// calls it when stopping.
func (w *PVWait) Close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
}

// Stats returns how many waits the guest made and how many of them a
// notification ended.
func (w *PVWait) Stats() (waits, wakeups uint64) { return w.waits.Load(), w.wakeups.Load() }

// Read returns 0.
func (w *PVWait) Read(_ uint64, data []byte) { clear(data) }

// Write performs the wait on the calling vCPU.
func (w *PVWait) Write(_ uint64, data []byte) {
	var us uint32
	if len(data) >= 4 {
		us = binary.LittleEndian.Uint32(data)
	} else if len(data) > 0 {
		us = uint32(data[0])
	}
	d := PVWaitDefault
	if us != 0 {
		d = min(time.Duration(us)*time.Microsecond, PVWaitMax)
	}
	w.waits.Add(1)
	if w.pending.Swap(false) {
		w.wakeups.Add(1)
		return
	}
	w.waiters.Add(1)
	defer w.waiters.Add(-1)
	if w.pending.Swap(false) { // a Notify raced with registering as a waiter
		w.wakeups.Add(1)
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.wake:
		w.pending.Store(false)
		w.wakeups.Add(1)
	case <-t.C:
	case <-w.stop:
	}
}

// PVWaitState is the snapshot form of a PVWait (see state.go): whether a
// notification is waiting for the guest's next wait. Fields are matched by
// name when decoded; a field added later must default (zero) to the
// behaviour of a snapshot that lacks it. The wait and wake-up counts
// (Stats) are the host's, not the guest's, and start again at zero.
type PVWaitState struct {
	// Pending: a device interrupted the guest since its last wait
	// returned, so the next wait returns at once.
	Pending bool
}

// SaveState returns the wait device's state.
func (w *PVWait) SaveState() PVWaitState { return PVWaitState{Pending: w.pending.Load()} }

// RestoreState replaces the wait device's state with st: a pending
// notification is restored as Notify records one (waking a waiter, were
// there one). Every PVWaitState is valid: the error is there to implement
// Stateful.
func (w *PVWait) RestoreState(st PVWaitState) error {
	if st.Pending {
		w.Notify()
	} else {
		w.pending.Store(false)
	}
	return nil
}
