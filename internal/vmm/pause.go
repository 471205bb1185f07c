package vmm

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Pausing the vCPUs (microvm's control API: PUT /vm/state paused).
//
// Pause sets paused and kicks every vCPU out of KVM_RUN; each vCPU
// goroutine, at the top of its loop, parks until Resume clears paused or
// the machine stops. Pause returns once every vCPU has parked. Devices are
// not quiesced: their workers still move host data into buffers the guest
// posted, and the interrupts wait for the vCPUs. The guest's clock
// (kvmclock, the TSC) keeps running, so a paused guest sees the time jump
// when it resumes, as after a host suspend.
//
// Lock: pauseMu guards paused and parked; pauseCond is signalled whenever
// either changes or the machine stops. It is a leaf: nothing is taken under
// it, and no system call is made while it is held.
type pauseState struct {
	pauseMu   sync.Mutex
	pauseCond *sync.Cond // on pauseMu
	paused    bool
	parked    int // vCPU goroutines in park
}

// ErrNotRunning is returned by Pause and Resume when the machine is not
// running: not started, or stopped.
var ErrNotRunning = errors.New("the machine is not running")

func (m *Machine) pauseCondLocked() *sync.Cond {
	if m.pause.pauseCond == nil {
		m.pause.pauseCond = sync.NewCond(&m.pause.pauseMu)
	}
	return m.pause.pauseCond
}

// Pause stops every vCPU and returns once all have left the guest, or ctx
// ends (they are then still on their way: Resume undoes it). Pausing a
// paused machine does nothing.
func (m *Machine) Pause(ctx context.Context) error {
	if !m.running.Load() || m.Stopped() {
		return ErrNotRunning
	}
	m.pause.pauseMu.Lock()
	cond := m.pauseCondLocked()
	m.pause.paused = true
	m.pause.pauseMu.Unlock()
	for _, v := range m.vcpus {
		v.Kick()
	}
	// Wake the wait below when ctx ends.
	stopWake := context.AfterFunc(ctx, func() {
		m.pause.pauseMu.Lock()
		cond.Broadcast()
		m.pause.pauseMu.Unlock()
	})
	defer stopWake()
	m.pause.pauseMu.Lock()
	defer m.pause.pauseMu.Unlock()
	for m.pause.parked < len(m.vcpus) && m.pause.paused && !m.Stopped() {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("vmm: pause: %d of %d vCPUs stopped: %w", m.pause.parked, len(m.vcpus), err)
		}
		cond.Wait()
	}
	if m.Stopped() {
		return ErrNotRunning
	}
	return nil
}

// Resume lets the vCPUs run again after Pause.
func (m *Machine) Resume() error {
	if !m.running.Load() || m.Stopped() {
		return ErrNotRunning
	}
	m.pause.pauseMu.Lock()
	m.pause.paused = false
	m.pauseCondLocked().Broadcast()
	m.pause.pauseMu.Unlock()
	return nil
}

// Paused says whether the vCPUs are held (Pause called, Resume not yet).
func (m *Machine) Paused() bool {
	m.pause.pauseMu.Lock()
	defer m.pause.pauseMu.Unlock()
	return m.pause.paused
}

// park holds the calling vCPU goroutine while the machine is paused, and
// says whether the machine stopped meanwhile.
func (m *Machine) park() (stopped bool) {
	m.pause.pauseMu.Lock()
	defer m.pause.pauseMu.Unlock()
	if !m.pause.paused {
		return false
	}
	cond := m.pauseCondLocked()
	m.pause.parked++
	cond.Broadcast()
	for m.pause.paused && !m.Stopped() {
		cond.Wait()
	}
	m.pause.parked--
	cond.Broadcast()
	return m.Stopped()
}

// wakeParked releases parked vCPUs when the machine stops.
func (m *Machine) wakeParked() {
	m.pause.pauseMu.Lock()
	m.pauseCondLocked().Broadcast()
	m.pause.pauseMu.Unlock()
}
