package vmm

import (
	"fmt"

	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/kvm/loader"
)

// MSRs given their power-on values at boot, as firmware would leave them
// (Intel SDM vol. 4). Fast strings on; MTRRs enabled with write-back default.
var bootMSRs = []kvm.MSR{
	{Index: 0x174},                  // IA32_SYSENTER_CS
	{Index: 0x175},                  // IA32_SYSENTER_ESP
	{Index: 0x176},                  // IA32_SYSENTER_EIP
	{Index: 0xc0000081},             // STAR
	{Index: 0xc0000082},             // LSTAR
	{Index: 0xc0000083},             // CSTAR
	{Index: 0xc0000084},             // SFMASK
	{Index: 0xc0000102},             // KERNEL_GS_BASE
	{Index: 0x1a0, Data: 1},         // IA32_MISC_ENABLE: fast strings
	{Index: 0x2ff, Data: 1<<11 | 6}, // IA32_MTRR_DEF_TYPE: enabled, write-back
}

// setupVCPU gives a vCPU its CPUID, MSRs and local APIC wiring, and the boot
// CPU its entry state. Application processors wait in KVM for the guest's
// INIT/SIPI (the in-kernel LAPIC handles it).
func (m *Machine) setupVCPU(v *kvm.VCPU, cpuid kvm.CPUID, b *loader.Boot) error {
	if err := v.SetCPUID(cpuid); err != nil {
		return err
	}
	for _, msr := range bootMSRs {
		// Some hosts (PVM among them) refuse a few of these; the guest
		// programs what it needs itself, so a refusal is only worth a note.
		if err := v.SetMSRs([]kvm.MSR{msr}); err != nil {
			m.log.WithField("msr", fmt.Sprintf("%#x", msr.Index)).Debug("boot MSR not set: ", err)
		}
	}
	if err := v.SetupLINT(); err != nil {
		return err
	}
	if v.ID() != 0 {
		return nil
	}
	sr, err := v.Sregs()
	if err != nil {
		return err
	}
	seg := func(s loader.Segment) kvm.Segment {
		return kvm.Segment{Base: s.Base, Limit: s.Limit, Selector: s.Selector, Type: s.Type,
			Present: b2u8(s.Present), DPL: s.DPL, DB: b2u8(s.DB), S: b2u8(s.S), L: b2u8(s.L),
			G: b2u8(s.G), AVL: b2u8(s.AVL)}
	}
	sr.CS = seg(b.CS)
	ds := seg(b.DS)
	sr.DS, sr.ES, sr.FS, sr.GS, sr.SS = ds, ds, ds, ds, ds
	sr.TR = seg(b.TR)
	sr.GDT = kvm.DTable{Base: b.GDT.Base, Limit: b.GDT.Limit}
	sr.IDT = kvm.DTable{}
	sr.CR0, sr.CR3, sr.CR4, sr.EFER = b.CR0, b.CR3, b.CR4, b.EFER
	if err := v.SetSregs(sr); err != nil {
		return err
	}
	if err := v.SetRegs(kvm.Regs{RIP: b.RIP, RSP: b.RSP, RBP: b.RSP, RSI: b.RSI, RBX: b.RBX, RFLAGS: b.RFLAGS}); err != nil {
		return err
	}
	// x87 control word and MXCSR at their reset values, masked exceptions.
	return v.SetFPU(kvm.FPU{FCW: 0x37f, MXCSR: 0x1f80})
}

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// handleExit dispatches one exit. It returns an error only for a condition
// that must stop the machine with an error; guest-caused stops go through
// m.stop.
func (m *Machine) handleExit(v *kvm.VCPU, reason kvm.ExitReason) error {
	switch reason {
	case kvm.ExitIO:
		io, err := v.IO()
		if err != nil {
			return err
		}
		for i := 0; i < io.Count; i++ {
			d := io.Data[i*io.Size : (i+1)*io.Size]
			if io.Out {
				m.pio.Write(uint64(io.Port), d)
			} else {
				m.pio.Read(uint64(io.Port), d)
			}
		}
	case kvm.ExitMMIO:
		mm, err := v.MMIO()
		if err != nil {
			return err
		}
		if mm.Write {
			m.mmio.Write(mm.Addr, mm.Data)
		} else {
			m.mmio.Read(mm.Addr, mm.Data)
		}
	case kvm.ExitIntr, kvm.ExitHLT, kvm.ExitIRQWindowOpen:
		// Kicked (the caller checks for stop), or nothing to do.
	case kvm.ExitShutdown:
		m.logShutdown(v)
		m.stop(Result{Kind: ExitTripleFault, Status: StatusTripleFault})
	case kvm.ExitSystemEvent:
		switch ev := v.SystemEvent(); ev {
		case kvm.SystemEventReset:
			m.stop(Result{Kind: ExitReset, Status: StatusOK})
		case kvm.SystemEventShutdown:
			m.stop(Result{Kind: ExitPowerOff, Status: StatusOK})
		default:
			m.logRegisters(v, fmt.Sprintf("guest system event %d", ev))
			return fmt.Errorf("vCPU %d: guest system event %d (crash)", v.ID(), ev)
		}
	case kvm.ExitInternalError:
		m.logRegisters(v, "KVM internal error")
		return fmt.Errorf("vCPU %d: KVM internal error: %s", v.ID(), v.InternalError())
	case kvm.ExitFailEntry:
		m.logRegisters(v, "VM entry failed")
		return fmt.Errorf("vCPU %d: VM entry failed, hardware reason %#x", v.ID(), v.FailEntryReason())
	default:
		m.logRegisters(v, "unexpected exit "+reason.String())
		return fmt.Errorf("vCPU %d: unexpected exit %v", v.ID(), reason)
	}
	return nil
}

// logRegisters logs a vCPU's registers with msg, for post-mortems.
func (m *Machine) logRegisters(v *kvm.VCPU, msg string) {
	m.logRegistersNote(v, msg, func(*kvm.Regs, *kvm.Sregs) string { return "" })
}

// logShutdown logs a triple fault (KVM_EXIT_SHUTDOWN). On AMD SVM, KVM
// re-initialises the vCPU's VMCB when it intercepts the shutdown, before
// exiting to us, so the registers read back are the processor's reset
// values (CS:IP f000:fff0, RDX the CPU signature), not the faulting state;
// the log line says so rather than pass them off as the fault's registers.
func (m *Machine) logShutdown(v *kvm.VCPU) {
	m.logRegistersNote(v, "guest triple fault (KVM_EXIT_SHUTDOWN)", func(r *kvm.Regs, s *kvm.Sregs) string {
		if isResetState(r, s) {
			return " (these are the processor's reset values, not the faulting state: " +
				"on AMD SVM KVM resets the vCPU when it intercepts a shutdown)"
		}
		return ""
	})
}

// isResetState reports whether the registers are the x86 power-on/INIT
// values (Intel SDM vol. 3, 9.1.1; AMD APM vol. 2, 14.1.3): execution at
// the reset vector f000:fff0 with CS based at ffff0000, in real mode.
func isResetState(r *kvm.Regs, s *kvm.Sregs) bool {
	const cr0PE = 1
	return r.RIP == 0xfff0 && s.CS.Selector == 0xf000 && s.CS.Base == 0xffff0000 && s.CR0&cr0PE == 0
}

// logRegistersNote logs msg with v's registers, followed by what note says
// about them.
func (m *Machine) logRegistersNote(v *kvm.VCPU, msg string, note func(*kvm.Regs, *kvm.Sregs) string) {
	r, err := v.Regs()
	if err != nil {
		m.log.WithError(err).Error(msg)
		return
	}
	s, _ := v.Sregs()
	m.log.Errorf("%s: vCPU %d rip=%#x rsp=%#x rflags=%#x rax=%#x rbx=%#x rcx=%#x rdx=%#x rsi=%#x rdi=%#x "+
		"cr0=%#x cr2=%#x cr3=%#x cr4=%#x efer=%#x cs=%#x/%#x%s",
		msg, v.ID(), r.RIP, r.RSP, r.RFLAGS, r.RAX, r.RBX, r.RCX, r.RDX, r.RSI, r.RDI,
		s.CR0, s.CR2, s.CR3, s.CR4, s.EFER, s.CS.Selector, s.CS.Base, note(&r, &s))
}
