package kvm

import (
	"encoding/binary"
	"fmt"
)

// Saving and restoring a VM (snapshots): VCPUState is everything KVM holds
// for one vCPU, VMState everything it holds for the VM outside its vCPUs
// and memory. Both are plain data (exported fields, no pointers into KVM or
// the kvm_run page) for the caller to encode; guest memory, device models and
// a userspace IOAPIC are the caller's to save.
//
// A snapshot of a running machine: stop every vCPU (its owner out of Run),
// call CompletePendingIO on each after handling its last exit, then
// VCPU.SaveState on each (by its owner) and VM.SaveState, and copy guest
// memory. A restore: create the VM with the same irqchip model, PIT and
// memory slots, create its vCPUs (same ids), fill guest memory, then
// VCPU.RestoreState on each and VM.RestoreState last, just before the vCPUs
// run again (the kvmclock then resumes where it was saved).

// VCPUState is the complete KVM state of one vCPU.
type VCPUState struct {
	MPState uint32 // MPState*
	Events  VCPUEvents
	Regs    Regs
	Sregs   Sregs
	// XSAVE holds the x87/SSE state (what FPU holds) and the extended
	// components; KVM_GET_FPU is not needed besides it.
	XSAVE     XSAVE
	XCRs      XCRs
	DebugRegs DebugRegs
	LAPIC     LAPICState
	// MSRs are the ones of the indices given to SaveState that KVM could
	// read, in that order; SkippedMSRs the ones it could not.
	MSRs        []MSR
	SkippedMSRs []uint32
	TSCKHz      uint32 // 0: leave the new vCPU's frequency alone on restore
	CPUID       CPUID
}

// SaveState reads the complete state of the vCPU, with the MSRs of
// msrIndices (normally System.MSRIndexList); the ones KVM cannot read on
// this vCPU are listed in SkippedMSRs rather than failing the save. Only the
// vCPU's owner calls it, while it is out of Run, after CompletePendingIO. It
// needs the in-kernel LAPIC (either irqchip model).
//
// The order matters where reading has side effects:
//   - MP state first: KVM_GET_MP_STATE makes the LAPIC accept a pending
//     INIT or SIPI, which resets or starts the vCPU and so changes the
//     registers read after it;
//   - vCPU events next: KVM_GET_VCPU_EVENTS moves queued NMIs and SMIs
//     into the state it reports and (without KVM_CAP_EXCEPTION_PAYLOAD)
//     delivers a pending #PF's or #DB's payload into CR2 or DR6, which
//     Sregs and DebugRegs must then see;
//   - then regs, sregs, XSAVE, XCRs, debug regs, LAPIC and MSRs, which
//     read without side effects, and the TSC frequency and CPUID, which the
//     guest cannot change.
func (v *VCPU) SaveState(msrIndices []uint32) (*VCPUState, error) {
	s := &VCPUState{}
	var err error
	if s.MPState, err = v.MPState(); err != nil {
		return nil, err
	}
	if s.Events, err = v.VCPUEvents(); err != nil {
		return nil, err
	}
	if s.Regs, err = v.Regs(); err != nil {
		return nil, err
	}
	if s.Sregs, err = v.Sregs(); err != nil {
		return nil, err
	}
	if s.XSAVE, err = v.XSAVE(); err != nil {
		return nil, err
	}
	if s.XCRs, err = v.XCRs(); err != nil {
		return nil, err
	}
	if s.DebugRegs, err = v.DebugRegs(); err != nil {
		return nil, err
	}
	if s.LAPIC, err = v.LAPIC(); err != nil {
		return nil, err
	}
	if s.MSRs, s.SkippedMSRs, err = v.ReadMSRs(msrIndices); err != nil {
		return nil, err
	}
	if s.TSCKHz, err = v.TSCKHz(); err != nil {
		return nil, err
	}
	if s.CPUID, err = v.CPUID(); err != nil {
		return nil, err
	}
	return s, nil
}

// RestoreState loads s into the vCPU, which must be new (never run) and in a
// VM set up like the saved one. The order follows what KVM checks each
// piece against and what each step resets:
//
//  1. CPUID first: KVM validates CR4 bits (SetSregs), XCR0 (SetXCRs), DR6
//     and DR7 bits and many MSRs against the guest's CPUID, and accepts
//     KVM_SET_CPUID2 only before the first KVM_RUN. (An empty table, from a
//     vCPU that never had one, is not set.)
//  2. TSC frequency, when s has one and it differs from the vCPU's: it
//     scales the TSC and the LAPIC's TSC-deadline timer, so it precedes the
//     MSRs (IA32_TSC, IA32_TSC_DEADLINE) and the LAPIC. A host without TSC
//     scaling refuses a frequency outside KVM's tolerance, and RestoreState
//     fails; a caller that accepts a different rate sets s.TSCKHz to 0.
//  3. Sregs: control registers, EFER and the APIC base, which sets the
//     LAPIC's mode (xAPIC or x2APIC) that SetLAPIC then interprets the
//     register page in. It may also make the vCPU runnable (a BSP at the
//     reset vector), so the MP state comes later.
//  4. Regs. KVM_SET_REGS drops a pending exception, so the events come
//     later.
//  5. XCRs, then XSAVE: XCR0 says which XSAVE components the guest
//     enabled, the area holds their contents.
//  6. Debug registers.
//  7. LAPIC, after sregs (APIC base) and before the MSRs: KVM_SET_LAPIC
//     restarts the LAPIC timer, and IA32_TSC_DEADLINE is only accepted
//     once the timer is in TSC-deadline mode.
//  8. MSRs, after CPUID, the TSC frequency and the LAPIC. KVM refusing
//     one is an error naming it. IA32_TSC is among them; older kernels
//     (6.1 among them) take a TSC write within one second of the count
//     they expect (from 0 at the VM's creation) for an attempt to
//     synchronize vCPUs and keep their own count: a guest saved in the
//     first second of its TSC resumes with the new VM's TSC instead.
//  9. vCPU events, after regs and sregs (which reset or queue events) and
//     the LAPIC (a latched INIT lives there), and before the MP state:
//     they set whether the vCPU is in SMM and has an INIT latched, which
//     KVM_SET_MP_STATE checks.
//  10. MP state last: nothing after it may change it again.
func (v *VCPU) RestoreState(s *VCPUState) error {
	if len(s.CPUID) > 0 {
		if err := v.SetCPUID(s.CPUID); err != nil {
			return err
		}
	}
	if s.TSCKHz != 0 {
		cur, err := v.TSCKHz()
		if err != nil {
			return err
		}
		if cur != s.TSCKHz {
			if err := v.SetTSCKHz(s.TSCKHz); err != nil {
				return fmt.Errorf("%w (saved at %d kHz, this vCPU runs at %d kHz)", err, s.TSCKHz, cur)
			}
		}
	}
	if err := v.SetSregs(s.Sregs); err != nil {
		return err
	}
	if err := v.SetRegs(s.Regs); err != nil {
		return err
	}
	if s.XCRs.NrXCRs > 0 { // none on a host without XSAVE, which refuses KVM_SET_XCRS
		if err := v.SetXCRs(s.XCRs); err != nil {
			return err
		}
	}
	if err := v.SetXSAVE(s.XSAVE); err != nil {
		return err
	}
	if err := v.SetDebugRegs(s.DebugRegs); err != nil {
		return err
	}
	if err := v.SetLAPIC(s.LAPIC); err != nil {
		return err
	}
	if err := v.SetMSRs(s.MSRs); err != nil {
		return err
	}
	if err := v.SetVCPUEvents(s.Events); err != nil {
		return err
	}
	return v.SetMPState(s.MPState)
}

// VMState is the KVM state of a VM outside its vCPUs and memory.
//
// With the full in-kernel irqchip (CreateIRQChip, and CreatePIT2) it holds
// the kvmclock, both PICs, the IOAPIC and the PIT. With the split irqchip
// only the kvmclock (and the PIT, if one was created): the IOAPIC and PIC are
// then userspace devices, saved by their owner, and the LAPICs are per vCPU
// (VCPUState.LAPIC).
type VMState struct {
	Clock ClockData
	// Mode is the irqchip model of the saved VM; RestoreState requires the
	// same of the VM it restores into.
	Mode IRQChipMode
	// PICMaster, PICSlave and IOAPIC are set when Mode is IRQChipFull.
	PICMaster IRQChip
	PICSlave  IRQChip
	IOAPIC    IRQChip
	// HasPIT says the VM had an in-kernel PIT (CreatePIT2), saved in PIT.
	HasPIT bool
	PIT    PITState2
}

// SaveState reads the VM's state, as far as its irqchip model (recorded
// from CreateIRQChip, EnableSplitIRQChip and CreatePIT2) has any in the
// kernel. Save it with the vCPUs stopped, after their SaveState, so the
// clock is read last.
func (vm *VM) SaveState() (*VMState, error) {
	vm.mu.Lock()
	mode, pit := vm.irqchip, vm.pit
	vm.mu.Unlock()
	s := &VMState{Mode: mode, HasPIT: pit}
	var err error
	if mode == IRQChipFull {
		for _, c := range []struct {
			id  uint32
			dst *IRQChip
		}{{IRQChipPICMaster, &s.PICMaster}, {IRQChipPICSlave, &s.PICSlave}, {IRQChipIOAPIC, &s.IOAPIC}} {
			if *c.dst, err = vm.IRQChip(c.id); err != nil {
				return nil, err
			}
		}
	}
	if pit {
		if s.PIT, err = vm.PIT2(); err != nil {
			return nil, err
		}
	}
	if s.Clock, err = vm.Clock(); err != nil {
		return nil, err
	}
	return s, nil
}

// RestoreState loads s into the VM, which must have the same irqchip model
// and PIT. Order: the PICs and the IOAPIC first, then the PIT (whose
// restarted counters raise IRQ 0 on the restored PIC and IOAPIC), the
// kvmclock last. The clock is set to the saved value without ClockRealtime,
// so the guest's kvmclock resumes where it stopped and the time the VM was
// not running does not count; a caller that wants it to (a live migration
// with synchronized host clocks) calls SetClock itself afterwards.
func (vm *VM) RestoreState(s *VMState) error {
	vm.mu.Lock()
	mode, pit := vm.irqchip, vm.pit
	vm.mu.Unlock()
	if mode != s.Mode {
		return fmt.Errorf("kvm: restoring a VM with a %v irqchip into one with a %v irqchip", s.Mode, mode)
	}
	if s.HasPIT != pit {
		return fmt.Errorf("kvm: restoring a VM with in-kernel PIT %v into one with %v", s.HasPIT, pit)
	}
	if mode == IRQChipFull {
		for _, c := range []struct {
			id  uint32
			src IRQChip
		}{{IRQChipPICMaster, s.PICMaster}, {IRQChipPICSlave, s.PICSlave}, {IRQChipIOAPIC, s.IOAPIC}} {
			if c.src.ChipID != c.id {
				return fmt.Errorf("kvm: KVM_SET_IRQCHIP: state for chip %d holds chip %d", c.id, c.src.ChipID)
			}
			if err := vm.SetIRQChip(c.src); err != nil {
				return err
			}
		}
	}
	if pit {
		if err := vm.SetPIT2(s.PIT); err != nil {
			return err
		}
	}
	return vm.SetClock(ClockData{Clock: s.Clock.Clock})
}

// PIC decodes c as an i8259 (chip IRQChipPICMaster or IRQChipPICSlave).
func (c *IRQChip) PIC() PICState {
	var p PICState
	_, _ = binary.Decode(c.Chip[:], binary.LittleEndian, &p) // fits: checked by the tests
	return p
}

// SetPIC encodes p into c, for chip IRQChipPICMaster or IRQChipPICSlave.
func (c *IRQChip) SetPIC(p PICState) {
	_, _ = binary.Encode(c.Chip[:], binary.LittleEndian, &p)
}

// IOAPIC decodes c as the IOAPIC (chip IRQChipIOAPIC).
func (c *IRQChip) IOAPIC() IOAPICState {
	var s IOAPICState
	_, _ = binary.Decode(c.Chip[:], binary.LittleEndian, &s)
	return s
}

// SetIOAPIC encodes s into c, for chip IRQChipIOAPIC.
func (c *IRQChip) SetIOAPIC(s IOAPICState) {
	_, _ = binary.Encode(c.Chip[:], binary.LittleEndian, &s)
}
