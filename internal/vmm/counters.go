package vmm

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/kvm"
)

// ExitSlots is how many KVM exit reasons a vCPU counts apart; reasons from
// ExitSlots-1 up share the last slot (KVM defines about 40 today).
const ExitSlots = 64

// vcpuCounters are one vCPU's counters. Its goroutine (runVCPU) is the only
// writer: one atomic add per exit, the thread id when it starts, the
// thread's CPU time when it ends. Metrics reads them from any goroutine.
type vcpuCounters struct {
	exits [ExitSlots]atomic.Uint64 // by kvm.ExitReason
	tid   atomic.Int32             // the vCPU's OS thread while runVCPU runs; 0 before
	ended atomic.Bool              // runVCPU returned; cpu is final
	cpu   atomic.Int64             // the thread's CPU time (ns) when runVCPU returned
}

// bind records the calling thread, locked to the vCPU's goroutine.
func (c *vcpuCounters) bind() { c.tid.Store(int32(unix.Gettid())) }

// unbind records the thread's final CPU time, before the thread exits with
// the goroutine (runVCPU never unlocks it).
func (c *vcpuCounters) unbind() {
	if d, err := selfCPUTime(); err == nil {
		c.cpu.Store(int64(d))
	}
	c.ended.Store(true)
}

// exit counts one KVM exit.
func (c *vcpuCounters) exit(r kvm.ExitReason) {
	c.exits[min(uint32(r), ExitSlots-1)].Add(1)
}

// cpuTime is the CPU time of the vCPU's thread: guest time, KVM's time in
// the kernel for it and microvm's exit handling. While the vCPU runs it is
// read from the thread's CPU clock; once runVCPU returned, the value it
// recorded. A reading taken while ended was still false came from the
// vCPU's own thread (runVCPU sets ended before its thread can exit), so
// the value never goes down.
func (c *vcpuCounters) cpuTime() time.Duration {
	if c.ended.Load() {
		return time.Duration(c.cpu.Load())
	}
	tid := c.tid.Load()
	if tid == 0 {
		return 0 // not started
	}
	d, err := threadCPUTime(int(tid))
	if c.ended.Load() || err != nil {
		return time.Duration(c.cpu.Load())
	}
	return d
}

// VCPUMetrics are one vCPU's counters (microvm.VCPUMetrics documents
// them).
type VCPUMetrics struct {
	ID      int
	Exits   map[kvm.ExitReason]uint64
	CPUTime time.Duration
}

// Metrics are the machine floor's counters: per vCPU, the buses'
// unclaimed accesses, the paravirtual waits.
type Metrics struct {
	VCPUs                       []VCPUMetrics
	PIOUnclaimed, MMIOUnclaimed uint64
	PVWaits, PVWakeups          uint64
}

// Metrics returns a snapshot of the counters. Any goroutine may call it
// at any time after New returned, while the machine runs and after Close.
func (m *Machine) Metrics() Metrics {
	out := Metrics{PIOUnclaimed: m.pio.Unclaimed(), MMIOUnclaimed: m.mmio.Unclaimed()}
	out.PVWaits, out.PVWakeups = m.pvwait.Stats()
	for i, c := range m.vcpuCtrs {
		v := VCPUMetrics{ID: i, Exits: map[kvm.ExitReason]uint64{}, CPUTime: c.cpuTime()}
		for r := range c.exits {
			if n := c.exits[r].Load(); n > 0 {
				v.Exits[kvm.ExitReason(r)] = n
			}
		}
		out.VCPUs = append(out.VCPUs, v)
	}
	return out
}

// NewCountersOnly returns a Machine with the parts Metrics reads and
// nothing else, no KVM: for tests of what reads its metrics (the metrics
// server, the exposition).
func NewCountersOnly(vcpus int) *Machine {
	m := &Machine{pio: devices.NewBus("pio"), mmio: devices.NewBus("mmio"), pvwait: devices.NewPVWait(),
		stopped: make(chan struct{})}
	for range vcpus {
		m.vcpuCtrs = append(m.vcpuCtrs, &vcpuCounters{})
	}
	return m
}
