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

// SetMSRs writes the given MSRs (KVM_SET_MSRS), in batches of maxMSRs. KVM
// stops at the first one it refuses; the error names it, and the MSRs before
// it have been written.
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
		if done > uintptr(n) {
			return fmt.Errorf("kvm: vCPU %d KVM_SET_MSRS: %d of %d MSRs written", v.id, done, n)
		}
		if int(done) != n {
			return fmt.Errorf("kvm: vCPU %d KVM_SET_MSRS: KVM refused MSR %#x (value %#x)", v.id, ms[done].Index, ms[done].Data)
		}
		ms = ms[n:]
	}
	return nil
}

// MSRs reads the MSRs with the given indices, any number of them. An MSR KVM
// cannot read is an error; ReadMSRs skips those instead.
func (v *VCPU) MSRs(indices ...uint32) ([]MSR, error) {
	ms, skipped, err := v.ReadMSRs(indices)
	if err != nil {
		return nil, err
	}
	if len(skipped) > 0 {
		return nil, fmt.Errorf("kvm: vCPU %d KVM_GET_MSRS: KVM cannot read MSRs %#x", v.id, skipped)
	}
	return ms, nil
}

// ReadMSRs reads the MSRs with the given indices (KVM_GET_MSRS), in batches
// of maxMSRs. KVM stops a batch at the first MSR it cannot read (one the host
// or the vCPU's CPUID lacks); ReadMSRs leaves that one out, lists it in
// skipped and goes on with the next. read is in the order of indices, less
// the skipped ones.
func (v *VCPU) ReadMSRs(indices []uint32) (read []MSR, skipped []uint32, err error) {
	read = make([]MSR, 0, len(indices))
	for len(indices) > 0 {
		n := min(len(indices), maxMSRs)
		var m msrs
		m.NMSRs = uint32(n)
		for i, idx := range indices[:n] {
			m.Entries[i].Index = idx
		}
		done, err := ioctlPtr(v.fd(), kvmGetMSRs, &m)
		if err != nil {
			return nil, nil, fmt.Errorf("kvm: vCPU %d KVM_GET_MSRS: %w", v.id, err)
		}
		if done > uintptr(n) {
			return nil, nil, fmt.Errorf("kvm: vCPU %d KVM_GET_MSRS: %d of %d MSRs read", v.id, done, n)
		}
		read = append(read, m.Entries[:done]...)
		if int(done) < n {
			skipped = append(skipped, indices[done])
			done++
		}
		indices = indices[done:]
	}
	return read, skipped, nil
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

// SetMPState sets the vCPU's multiprocessing state (KVM_SET_MP_STATE), one
// of MPState*. KVM refuses INIT/SIPI-received states while the vCPU is in
// SMM or has an INIT latched (set VCPUEvents first).
func (v *VCPU) SetMPState(state uint32) error {
	s := mpState{State: state}
	if _, err := ioctlPtr(v.fd(), kvmSetMPState, &s); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_MP_STATE %d: %w", v.id, state, err)
	}
	return nil
}

// cpuidUnwritten marks the entries KVM_GET_CPUID2 did not fill: no entry
// KVM holds has every flag bit set.
const cpuidUnwritten = ^uint32(0)

// CPUID reads back the vCPU's CPUID table (KVM_GET_CPUID2): what SetCPUID
// set, with the bits KVM keeps up to date (OSXSAVE, the XSAVE area size, ...)
// as they are now; empty before any SetCPUID.
func (v *VCPU) CPUID() (CPUID, error) {
	t := &cpuid2{Nent: maxCPUIDEntries}
	// Older kernels (6.1 among them) copy the entries but leave nent as it
	// was given: mark every entry, and count the ones KVM overwrote.
	for i := range t.Entries {
		t.Entries[i].Flags = cpuidUnwritten
	}
	if _, err := ioctlPtr(v.fd(), kvmGetCPUID2, t); err != nil {
		return nil, fmt.Errorf("kvm: vCPU %d KVM_GET_CPUID2 (room for %d entries): %w", v.id, maxCPUIDEntries, err)
	}
	if t.Nent > maxCPUIDEntries {
		return nil, fmt.Errorf("kvm: vCPU %d KVM_GET_CPUID2 returned %d entries", v.id, t.Nent)
	}
	n := int(t.Nent)
	for n > 0 && t.Entries[n-1].Flags == cpuidUnwritten {
		n--
	}
	return append(CPUID{}, t.Entries[:n]...), nil
}

// XSAVE reads the vCPU's XSAVE area (KVM_GET_XSAVE): x87, SSE, AVX and the
// other XSAVE-managed state, a superset of FPU. KVM answers EINVAL when the
// area is larger than 4096 bytes, which happens only when the process was
// granted dynamic XSAVE features for guests (AMX, through arch_prctl
// ARCH_REQ_XCOMP_GUEST_PERM, which microvm never asks for); such a VMM needs
// KVM_GET_XSAVE2 and a larger buffer.
func (v *VCPU) XSAVE() (XSAVE, error) {
	var x XSAVE
	if _, err := ioctlPtr(v.fd(), kvmGetXSAVE, &x); err != nil {
		return x, fmt.Errorf("kvm: vCPU %d KVM_GET_XSAVE: %w", v.id, err)
	}
	return x, nil
}

// SetXSAVE writes the vCPU's XSAVE area (KVM_SET_XSAVE). KVM checks the
// components in XSTATE_BV against what the host supports, not against the
// vCPU's XCR0. (KVM reads as many bytes as the vCPU's XSAVE area has, 4096
// unless dynamic features were granted: see XSAVE.)
func (v *VCPU) SetXSAVE(x XSAVE) error {
	if _, err := ioctlPtr(v.fd(), kvmSetXSAVE, &x); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_XSAVE: %w", v.id, err)
	}
	return nil
}

// XCRs reads the extended control registers (KVM_GET_XCRS): XCR0, on a host
// with XSAVE (NrXCRs is 0 on one without).
func (v *VCPU) XCRs() (XCRs, error) {
	var x XCRs
	if _, err := ioctlPtr(v.fd(), kvmGetXCRs, &x); err != nil {
		return x, fmt.Errorf("kvm: vCPU %d KVM_GET_XCRS: %w", v.id, err)
	}
	if x.NrXCRs > maxXCRs {
		return x, fmt.Errorf("kvm: vCPU %d KVM_GET_XCRS returned %d registers", v.id, x.NrXCRs)
	}
	return x, nil
}

// SetXCRs writes the extended control registers (KVM_SET_XCRS). KVM checks
// XCR0 against the vCPU's CPUID, so set that first.
func (v *VCPU) SetXCRs(x XCRs) error {
	if _, err := ioctlPtr(v.fd(), kvmSetXCRs, &x); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_XCRS: %w", v.id, err)
	}
	return nil
}

// VCPUEvents reads the vCPU's pending and in-flight events
// (KVM_GET_VCPU_EVENTS). Reading has a side effect on the rest of the
// state: unless the VM enabled KVM_CAP_EXCEPTION_PAYLOAD (microvm does not),
// KVM first delivers a pending exception's payload into CR2 (#PF) or DR6
// (#DB), so read these events before Sregs and DebugRegs (SaveState does).
func (v *VCPU) VCPUEvents() (VCPUEvents, error) {
	var e VCPUEvents
	if _, err := ioctlPtr(v.fd(), kvmGetVCPUEvents, &e); err != nil {
		return e, fmt.Errorf("kvm: vCPU %d KVM_GET_VCPU_EVENTS: %w", v.id, err)
	}
	return e, nil
}

// SetVCPUEvents writes the vCPU's pending and in-flight events
// (KVM_SET_VCPU_EVENTS); the optional members apply as e.Flags says.
func (v *VCPU) SetVCPUEvents(e VCPUEvents) error {
	if _, err := ioctlPtr(v.fd(), kvmSetVCPUEvents, &e); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_VCPU_EVENTS: %w", v.id, err)
	}
	return nil
}

// DebugRegs reads DR0-DR3, DR6 and DR7 (KVM_GET_DEBUGREGS).
func (v *VCPU) DebugRegs() (DebugRegs, error) {
	var d DebugRegs
	if _, err := ioctlPtr(v.fd(), kvmGetDebugRegs, &d); err != nil {
		return d, fmt.Errorf("kvm: vCPU %d KVM_GET_DEBUGREGS: %w", v.id, err)
	}
	return d, nil
}

// SetDebugRegs writes DR0-DR3, DR6 and DR7 (KVM_SET_DEBUGREGS). d.Flags must
// be 0.
func (v *VCPU) SetDebugRegs(d DebugRegs) error {
	if _, err := ioctlPtr(v.fd(), kvmSetDebugRegs, &d); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_DEBUGREGS: %w", v.id, err)
	}
	return nil
}

// SetTSCKHz sets the guest TSC frequency in kHz (KVM_SET_TSC_KHZ). A
// frequency other than the host's needs TSC scaling (CapTSCControl), except
// within KVM's tolerance of 250 ppm; KVM refuses it otherwise.
func (v *VCPU) SetTSCKHz(khz uint32) error {
	if _, err := ioctl(v.fd(), kvmSetTSCKHz, uintptr(khz)); err != nil {
		return fmt.Errorf("kvm: vCPU %d KVM_SET_TSC_KHZ %d: %w", v.id, khz, err)
	}
	return nil
}

// CompletePendingIO finishes the instruction behind the last I/O or MMIO
// exit without running the guest further: KVM completes such an instruction
// (advances RIP, stores what an IN or MMIO read returned) only on the next
// KVM_RUN, and keeps that pending step in no state a VMM can read. Call it
// after handling an exit and before SaveState, so the saved state is past the
// instruction. It sets kvm_run.immediate_exit and enters KVM_RUN once:
// ExitIntr means done. Any other reason is a new exit (a multi-part MMIO
// access) to handle like one from Run before calling again.
func (v *VCPU) CompletePendingIO() (ExitReason, error) {
	v.setImmediateExit(true)
	reason, err := v.Run()
	v.setImmediateExit(false)
	return reason, err
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
