package vmm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/microvm/microvm/kvm"
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
//
// A parked vCPU also runs the jobs onParked hands it (a snapshot's save of
// its state, which only the vCPU's owner may do), releasing pauseMu while
// the job runs.
type pauseState struct {
	pauseMu   sync.Mutex
	pauseCond *sync.Cond // on pauseMu
	paused    bool
	parked    int // vCPU goroutines in park

	job     func(v *kvm.VCPU) error // the job for every parked vCPU, nil when none
	jobGen  uint64                  // bumped for each job
	ran     map[int]uint64          // the last jobGen each vCPU (by id) ran
	jobDone int                     // vCPUs that ran the current job
	jobErrs []error
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
func (m *Machine) park(v *kvm.VCPU) (stopped bool) {
	m.pause.pauseMu.Lock()
	defer m.pause.pauseMu.Unlock()
	if !m.pause.paused {
		return false
	}
	cond := m.pauseCondLocked()
	m.pause.parked++
	cond.Broadcast()
	for m.pause.paused && !m.Stopped() {
		if job := m.pause.job; job != nil && m.pause.ran[v.ID()] != m.pause.jobGen {
			if m.pause.ran == nil {
				m.pause.ran = map[int]uint64{}
			}
			m.pause.ran[v.ID()] = m.pause.jobGen
			m.pause.pauseMu.Unlock()
			err := job(v)
			m.pause.pauseMu.Lock()
			if err != nil {
				m.pause.jobErrs = append(m.pause.jobErrs, fmt.Errorf("vCPU %d: %w", v.ID(), err))
			}
			m.pause.jobDone++
			cond.Broadcast()
			continue
		}
		cond.Wait()
	}
	m.pause.parked--
	cond.Broadcast()
	return m.Stopped()
}

// onParked runs f on every vCPU's own goroutine (KVM wants a vCPU's state
// read by the thread that runs it) while the machine is paused, and returns
// once all have, with their errors. The machine must be paused (Pause
// returned): every vCPU is parked, and none runs the guest while f runs.
func (m *Machine) onParked(f func(v *kvm.VCPU) error) error {
	m.pause.pauseMu.Lock()
	defer m.pause.pauseMu.Unlock()
	if !m.pause.paused || m.pause.parked < len(m.vcpus) {
		return fmt.Errorf("vmm: the machine is not paused (%d of %d vCPUs parked)", m.pause.parked, len(m.vcpus))
	}
	cond := m.pauseCondLocked()
	m.pause.jobGen++
	m.pause.job, m.pause.jobDone, m.pause.jobErrs = f, 0, nil
	cond.Broadcast()
	for m.pause.jobDone < len(m.vcpus) && !m.Stopped() {
		cond.Wait()
	}
	m.pause.job = nil
	if m.pause.jobDone < len(m.vcpus) {
		return ErrNotRunning
	}
	return errors.Join(m.pause.jobErrs...)
}

// wakeParked releases parked vCPUs when the machine stops.
func (m *Machine) wakeParked() {
	m.pause.pauseMu.Lock()
	m.pauseCondLocked().Broadcast()
	m.pause.pauseMu.Unlock()
}
