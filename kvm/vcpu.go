package kvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// VCPU is one virtual CPU: its fd and its mapped kvm_run page.
//
// Owner: exactly one goroutine, locked to its OS thread, calls every method
// except Kick, which any goroutine may call to make that owner's Run return.
type VCPU struct {
	id   int
	f    *os.File
	once sync.Once
	run  []byte // the mmap'd struct kvm_run; read through the run* offsets
	tid  atomic.Int32

	// kickMu orders Kick against Close, so that a Kick never touches an
	// unmapped kvm_run. It guards closed.
	kickMu sync.Mutex
	closed bool
}

// ID is the vCPU index given at creation (also its APIC id).
func (v *VCPU) ID() int { return v.id }

func (v *VCPU) fd() uintptr { return v.f.Fd() }

// Close unmaps kvm_run and closes the vCPU fd. The owner goroutine must have
// returned from Run.
func (v *VCPU) Close() error {
	var err error
	v.once.Do(func() {
		v.kickMu.Lock()
		v.closed = true
		v.kickMu.Unlock()
		if v.run != nil {
			err = unix.Munmap(v.run)
			v.run = nil
		}
		err = errors.Join(err, v.f.Close())
	})
	return err
}

// Regs reads the general-purpose registers.
func (v *VCPU) Regs() (Regs, error) {
	var r Regs
	if _, err := ioctlPtr(v.fd(), kvmGetRegs, &r); err != nil {
		return r, fmt.Errorf("kvm: vCPU %d KVM_GET_REGS: %w", v.id, err)
	}
	return r, nil
}

// SetRegs writes the general-purpose registers.
func (v *VCPU) SetRegs(r Regs) error {
	if _, err := ioctlPtr(v.fd(), kvmSetRegs, &r); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_REGS: %w", v.id, err)
	}
	return nil
}

// Sregs reads the special registers (segments, control registers, EFER).
func (v *VCPU) Sregs() (Sregs, error) {
	var s Sregs
	if _, err := ioctlPtr(v.fd(), kvmGetSregs, &s); err != nil {
		return s, fmt.Errorf("kvm: vCPU %d KVM_GET_SREGS: %w", v.id, err)
	}
	return s, nil
}

// SetSregs writes the special registers.
func (v *VCPU) SetSregs(s Sregs) error {
	if _, err := ioctlPtr(v.fd(), kvmSetSregs, &s); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_SREGS: %w", v.id, err)
	}
	return nil
}

// FPU reads the FPU/SSE state.
func (v *VCPU) FPU() (FPU, error) {
	var f FPU
	if _, err := ioctlPtr(v.fd(), kvmGetFPU, &f); err != nil {
		return f, fmt.Errorf("kvm: vCPU %d KVM_GET_FPU: %w", v.id, err)
	}
	return f, nil
}

// SetFPU writes the FPU/SSE state.
func (v *VCPU) SetFPU(f FPU) error {
	if _, err := ioctlPtr(v.fd(), kvmSetFPU, &f); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_FPU: %w", v.id, err)
	}
	return nil
}

// LAPIC reads the local APIC register page.
func (v *VCPU) LAPIC() (LAPICState, error) {
	var l LAPICState
	if _, err := ioctlPtr(v.fd(), kvmGetLAPIC, &l); err != nil {
		return l, fmt.Errorf("kvm: vCPU %d KVM_GET_LAPIC: %w", v.id, err)
	}
	return l, nil
}

// SetLAPIC writes the local APIC register page.
func (v *VCPU) SetLAPIC(l LAPICState) error {
	if _, err := ioctlPtr(v.fd(), kvmSetLAPIC, &l); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_LAPIC: %w", v.id, err)
	}
	return nil
}

// Local APIC register offsets and LVT delivery modes used to wire LINT0/LINT1
// the way a PC firmware leaves them (Intel SDM vol. 3, 11.5.1).
const (
	lapicLVT0         = 0x350
	lapicLVT1         = 0x360
	lvtDeliveryMask   = 0x700
	lvtDeliveryNMI    = 0x400
	lvtDeliveryExtINT = 0x700
)

// SetupLINT programs LINT0 as ExtINT (the PIC) and LINT1 as NMI.
func (v *VCPU) SetupLINT() error {
	l, err := v.LAPIC()
	if err != nil {
		return err
	}
	set := func(off int, mode uint32) {
		r := binary.LittleEndian.Uint32(l.Regs[off:])
		binary.LittleEndian.PutUint32(l.Regs[off:], r&^lvtDeliveryMask|mode)
	}
	set(lapicLVT0, lvtDeliveryExtINT)
	set(lapicLVT1, lvtDeliveryNMI)
	return v.SetLAPIC(l)
}

// SetMSRs writes the given MSRs. KVM stops at the first one it refuses; the
// error names it.
func (v *VCPU) SetMSRs(ms []MSR) error {
	for len(ms) > 0 {
		n := min(len(ms), maxMSRs)
		var m msrs
		m.NMSRs = uint32(n)
		copy(m.Entries[:], ms[:n])
		done, err := ioctlPtr(v.fd(), kvmSetMSRs, &m)
		if err != nil {
			return fmt.Errorf("kvm: vCPU %d KVM_SET_MSRS: %w", v.id, err)
		}
		if int(done) != n {
			return fmt.Errorf("kvm: vCPU %d: KVM refused MSR %#x", v.id, ms[done].Index)
		}
		ms = ms[n:]
	}
	return nil
}

// MSRs reads the MSRs with the given indices.
func (v *VCPU) MSRs(indices ...uint32) ([]MSR, error) {
	if len(indices) > maxMSRs {
		return nil, fmt.Errorf("kvm: at most %d MSRs per read", maxMSRs)
	}
	var m msrs
	m.NMSRs = uint32(len(indices))
	for i, idx := range indices {
		m.Entries[i].Index = idx
	}
	done, err := ioctlPtr(v.fd(), kvmGetMSRs, &m)
	if err != nil {
		return nil, fmt.Errorf("kvm: vCPU %d KVM_GET_MSRS: %w", v.id, err)
	}
	if int(done) != len(indices) {
		return nil, fmt.Errorf("kvm: vCPU %d: KVM cannot read MSR %#x", v.id, indices[done])
	}
	return append([]MSR(nil), m.Entries[:done]...), nil
}

// SetCPUID sets the vCPU's CPUID table (KVM_SET_CPUID2).
func (v *VCPU) SetCPUID(c CPUID) error {
	if len(c) > maxCPUIDEntries {
		return fmt.Errorf("kvm: %d CPUID entries, at most %d", len(c), maxCPUIDEntries)
	}
	var t cpuid2
	t.Nent = uint32(len(c))
	copy(t.Entries[:], c)
	if _, err := ioctlPtr(v.fd(), kvmSetCPUID2, &t); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_CPUID2: %w", v.id, err)
	}
	return nil
}

// MPState reads the vCPU's multiprocessing state (KVM_MP_STATE_*).
func (v *VCPU) MPState() (uint32, error) {
	var s mpState
	if _, err := ioctlPtr(v.fd(), kvmGetMPState, &s); err != nil {
		return 0, fmt.Errorf("kvm: vCPU %d KVM_GET_MP_STATE: %w", v.id, err)
	}
	return s.State, nil
}

// TSCKHz returns the guest TSC frequency KVM uses, in kHz.
func (v *VCPU) TSCKHz() (uint32, error) {
	r, err := ioctl(v.fd(), kvmGetTSCKHz, 0)
	if err != nil {
		return 0, fmt.Errorf("kvm: vCPU %d KVM_GET_TSC_KHZ: %w", v.id, err)
	}
	return uint32(r), nil
}

// BindThread records the calling OS thread as the one running this vCPU, so
// Kick can signal it. The owner goroutine calls it after
// runtime.LockOSThread and before the first Run.
func (v *VCPU) BindThread() { v.tid.Store(int32(unix.Gettid())) }

// Kick makes the owner's current or next Run return ExitIntr. Safe from any
// goroutine. It sets kvm_run.immediate_exit (covering a Kick that lands just
// before KVM_RUN) and signals the owner's thread to interrupt a running
// KVM_RUN. The signal is SIGURG, which the Go runtime always handles (it uses
// it for preemption) and otherwise ignores.
func (v *VCPU) Kick() {
	v.kickMu.Lock()
	defer v.kickMu.Unlock()
	if v.closed {
		return
	}
	v.setImmediateExit(true)
	if tid := v.tid.Load(); tid != 0 {
		_ = unix.Tgkill(unix.Getpid(), int(tid), unix.SIGURG)
	}
}

// Run enters the guest until the next exit and returns its reason. An
// interrupted KVM_RUN returns ExitIntr: after a Kick, but also after any
// signal the Go runtime delivers to the thread, so callers check their own
// stop condition and otherwise run again. The exit details
// (IO, MMIO, ...) are valid until the next Run.
func (v *VCPU) Run() (ExitReason, error) {
	_, err := ioctlOnce(v.fd(), kvmRun, 0)
	if err != nil {
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			v.setImmediateExit(false)
			return ExitIntr, nil
		}
		return 0, fmt.Errorf("kvm: vCPU %d KVM_RUN: %w", v.id, err)
	}
	return ExitReason(binary.LittleEndian.Uint32(v.run[runExitReason:])), nil
}

// IOExit is a decoded KVM_EXIT_IO.
type IOExit struct {
	Port  uint16
	Size  int  // bytes per access: 1, 2 or 4
	Count int  // repetitions (string I/O)
	Out   bool // guest wrote (out) rather than read (in)
	// Data is the transfer buffer inside kvm_run: Size*Count bytes. For an
	// out it holds what the guest wrote; for an in the handler fills it.
	Data []byte
}

// IO decodes the current KVM_EXIT_IO.
func (v *VCPU) IO() (IOExit, error) {
	r := v.run
	e := IOExit{
		Out:   r[runIODirection] == 1,
		Size:  int(r[runIOSize]),
		Port:  binary.LittleEndian.Uint16(r[runIOPort:]),
		Count: int(binary.LittleEndian.Uint32(r[runIOCount:])),
	}
	off := binary.LittleEndian.Uint64(r[runIODataOffset:])
	n := uint64(e.Size) * uint64(e.Count)
	if off > uint64(len(r)) || n > uint64(len(r))-off {
		return e, fmt.Errorf("kvm: vCPU %d: I/O exit data %#x+%d outside kvm_run", v.id, off, n)
	}
	e.Data = r[off : off+n : off+n]
	return e, nil
}

// MMIOExit is a decoded KVM_EXIT_MMIO.
type MMIOExit struct {
	Addr  uint64
	Write bool
	// Data is the access: len bytes inside kvm_run. For a write it holds what
	// the guest wrote; for a read the handler fills it.
	Data []byte
}

// MMIO decodes the current KVM_EXIT_MMIO.
func (v *VCPU) MMIO() (MMIOExit, error) {
	r := v.run
	n := binary.LittleEndian.Uint32(r[runMMIOLen:])
	if n > 8 {
		return MMIOExit{}, fmt.Errorf("kvm: vCPU %d: MMIO exit of %d bytes", v.id, n)
	}
	return MMIOExit{
		Addr:  binary.LittleEndian.Uint64(r[runMMIOPhysAddr:]),
		Write: r[runMMIOIsWrite] != 0,
		Data:  r[runMMIOData : runMMIOData+int(n) : runMMIOData+int(n)],
	}, nil
}

// SystemEvent returns the type of the current KVM_EXIT_SYSTEM_EVENT.
func (v *VCPU) SystemEvent() SystemEvent {
	return SystemEvent(binary.LittleEndian.Uint32(v.run[runSystemEventType:]))
}

// InternalError describes the current KVM_EXIT_INTERNAL_ERROR.
func (v *VCPU) InternalError() string {
	r := v.run
	sub := binary.LittleEndian.Uint32(r[runInternalSuberr:])
	nd := min(binary.LittleEndian.Uint32(r[runInternalNData:]), 16)
	s := fmt.Sprintf("suberror %d", sub)
	for i := uint32(0); i < nd; i++ {
		s += fmt.Sprintf(" %#x", binary.LittleEndian.Uint64(r[runInternalData+8*int(i):]))
	}
	return s
}

// FailEntryReason returns the hardware reason of a KVM_EXIT_FAIL_ENTRY.
func (v *VCPU) FailEntryReason() uint64 {
	return binary.LittleEndian.Uint64(v.run[runFailEntryReason:])
}

func (v *VCPU) mapRun(size int) error {
	b, err := unix.Mmap(int(v.fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	v.run = b
	return nil
}
