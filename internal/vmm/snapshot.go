package vmm

import (
	"errors"
	"fmt"
	"time"

	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/internal/snapshot"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/virtio"
)

// Snapshots of a machine. The machine floor saves what it owns:
// KVM's state (each vCPU's, by its own goroutine, and the VM's), the
// platform devices, every virtio-mmio transport (which carries its
// device's state) and guest memory. What the devices are and how they are
// configured is the caller's (package microvm saves its Config beside it).
//
// Saving (SaveSnapshot, with the machine paused):
//
//	each transport quiesced (virtio.MMIO.Quiesce: the device finishes or
//	puts back every chain it popped)
//	-> each parked vCPU: CompletePendingIO (the instruction behind its last
//	   I/O exit), then VCPU.SaveState with the host's MSR list
//	-> VM.SaveState (the kvmclock last), the platform devices, each
//	   transport's SaveState, all in the "machine" state part, with the
//	   host's wall clock
//	-> each transport's bulk data, for a device that has some
//	   (virtio.DataDevice: a copy-on-write disk's overlay), one part per
//	   slot ("virtio2-data")
//	-> guest memory, one sparse part per range ("mem0", "mem1")
//	-> ResumeDevices restarts the transports when the machine goes on.
//
// Restoring (Config.Restore): New maps each memory part copy-on-write in
// place of anonymous memory and opens no kernel; the caller adds the same
// virtio devices in the same order, then Restore, in place of Boot: the
// vCPUs are created and given their saved state, the VM's state follows
// (the clock last, moved on by the wall-clock time since the save), then the IOAPIC (which installs the routes the other
// devices interrupt through), the other platform devices and each
// transport (its device's bulk data first, then its state, which
// activates the device at the saved queue positions).
// Run then starts the vCPUs where they stopped.

// snapshotMachinePart is the name of the state part SaveSnapshot writes.
const snapshotMachinePart = "machine"

// MachineState is the machine floor's state part.
type MachineState struct {
	// CPUs, MemoryBytes and IRQChip are the machine's shape, which the
	// restoring machine's Config must repeat.
	CPUs        int
	MemoryBytes uint64
	IRQChip     IRQChip
	NoACPI      bool

	VM    *kvm.VMState
	VCPUs []*kvm.VCPUState
	// SavedAt is the host's wall clock when VM.Clock was read (Unix
	// nanoseconds): a restore moves the guest's kvmclock on by the time
	// since, so the guest's wall clock is right after a restore as after
	// a host suspend.
	SavedAt int64

	Serial devices.SerialState
	I8042  devices.I8042State
	CMOS   devices.CMOSState
	PVWait devices.PVWaitState
	// PortB and IOAPIC exist with the split irqchip only.
	PortB  *devices.PortBState  `json:",omitempty"`
	IOAPIC *devices.IOAPICState `json:",omitempty"`
	// VMGenID exists with ACPI, in snapshots of microvm from the VM
	// generation ID on (vmgenid.go); Restore gives the guest a new ID.
	VMGenID *devices.VMGenIDState `json:",omitempty"`

	// Virtio holds each slot's transport, in slot order.
	Virtio []virtio.MMIOState
}

// memoryPart names guest memory range i's part.
func memoryPart(i int) string { return fmt.Sprintf("mem%d", i) }

// dataPart names the part of virtio slot i's bulk data (virtio.DataDevice),
// which only devices that have some write.
func dataPart(i int) string { return fmt.Sprintf("virtio%d-data", i) }

// SaveSnapshot writes the machine's state and memory into w. The machine
// must be paused (Pause); its devices are quiesced and stay so until
// ResumeDevices, which the caller calls before Resume if the machine is to
// go on. The caller commits or aborts w.
//
// With base, the digest of the machine's previous snapshot (or of the one
// it was restored from), memory is written as a diff against it: the
// pages written since, as the dirty logs say (Config.TrackDirty). With
// TrackDirty, every snapshot restarts the logs, whatever becomes of w: a
// failed snapshot cannot be the base of the next diff.
func (m *Machine) SaveSnapshot(w *snapshot.Writer, base string) error {
	if !m.Paused() {
		return errors.New("vmm: snapshot: the machine is not paused")
	}
	if base != "" && !m.cfg.TrackDirty {
		return fmt.Errorf("%w: a diff snapshot needs dirty page tracking, which this machine was built without", ErrConfig)
	}
	for i, s := range m.slots {
		if err := s.t.Quiesce(); err != nil {
			return fmt.Errorf("vmm: snapshot: virtio slot %d: %w", i, err)
		}
	}
	msrs, err := m.msrIndices()
	if err != nil {
		return err
	}
	st := &MachineState{CPUs: m.cfg.CPUs, MemoryBytes: m.cfg.MemoryBytes, IRQChip: m.irqChip(), NoACPI: m.cfg.NoACPI,
		VCPUs: make([]*kvm.VCPUState, len(m.vcpus))}
	if err := m.onParked(func(v *kvm.VCPU) error {
		if err := m.completePendingIO(v); err != nil {
			return err
		}
		vs, err := v.SaveState(msrs)
		if err != nil {
			return err
		}
		st.VCPUs[v.ID()] = vs // each vCPU writes its own element
		return nil
	}); err != nil {
		return fmt.Errorf("vmm: snapshot: %w", err)
	}
	if st.VM, err = m.vm.SaveState(); err != nil {
		return fmt.Errorf("vmm: snapshot: %w", err)
	}
	st.SavedAt = time.Now().UnixNano()
	m.serial.Flush()
	st.Serial, st.I8042, st.CMOS, st.PVWait = m.serial.SaveState(), m.kbd.SaveState(), m.cmos.SaveState(), m.pvwait.SaveState()
	if m.portB != nil {
		pb := m.portB.SaveState()
		st.PortB = &pb
	}
	if m.ioapic != nil {
		io := m.ioapic.SaveState()
		st.IOAPIC = &io
	}
	st.VMGenID = m.saveVMGenID()
	for i, s := range m.slots {
		ts, err := s.t.SaveState()
		if err != nil {
			return fmt.Errorf("vmm: snapshot: virtio slot %d: %w", i, err)
		}
		st.Virtio = append(st.Virtio, ts)
	}
	if err := w.AddState(snapshotMachinePart, st); err != nil {
		return err
	}
	for i, s := range m.slots {
		r, err := s.t.SaveData()
		if err == nil && r != nil {
			err = w.AddFile(dataPart(i), r)
		}
		if err != nil {
			return fmt.Errorf("vmm: snapshot: virtio slot %d: %w", i, err)
		}
	}
	for i, r := range m.mem.Ranges() {
		dirty, err := m.takeDirty(i, r)
		if err != nil {
			return fmt.Errorf("vmm: snapshot: %w", err)
		}
		b, err := m.mem.ReadView(r.GPA, r.Size)
		if err != nil {
			return err
		}
		if base != "" {
			err = w.AddMemoryDiff(memoryPart(i), base, b, dirty)
		} else {
			err = w.AddMemory(memoryPart(i), b)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// takeDirty returns, and restarts, the log of the pages of memory range i
// (slot i) written since the previous call, by the guest or the devices;
// nil without Config.TrackDirty. Only with the vCPUs parked and the
// devices quiesced does it see every write.
func (m *Machine) takeDirty(slot int, r guestmem.Range) ([]uint64, error) {
	if !m.cfg.TrackDirty {
		return nil, nil
	}
	guest, err := m.vm.DirtyLog(uint32(slot), r.Size/kvm.PageSize)
	if err != nil {
		return nil, err
	}
	dev, err := m.mem.TakeDirty(r.GPA)
	if err != nil {
		return nil, err
	}
	for i := range guest {
		guest[i] |= dev[i]
	}
	return guest, nil
}

// msrIndices is the host's list of MSRs a vCPU's state includes, read
// once (the first snapshot, or Boot: a confined process may not ask KVM
// for it later).
func (m *Machine) msrIndices() ([]uint32, error) {
	if m.msrs == nil {
		l, err := m.sys.MSRIndexList()
		if err != nil {
			return nil, err
		}
		m.msrs = l
	}
	return m.msrs, nil
}

// completePendingIO finishes the instruction behind v's last exit (see
// kvm.VCPU.CompletePendingIO), handling any further exit it makes (the
// second half of a split MMIO access). Run by v's owner.
func (m *Machine) completePendingIO(v *kvm.VCPU) error {
	for range 16 {
		reason, err := v.CompletePendingIO()
		if err != nil {
			return err
		}
		if reason == kvm.ExitIntr {
			return nil
		}
		if err := m.handleExit(v, reason); err != nil {
			return err
		}
	}
	return fmt.Errorf("vmm: vCPU %d kept exiting while completing its last I/O", v.ID())
}

// ResumeDevices restarts the virtio devices SaveSnapshot quiesced, at the
// queue positions they stopped at, so the machine can go on (Resume).
func (m *Machine) ResumeDevices() error {
	var errs []error
	for i, s := range m.slots {
		if err := s.t.Resume(); err != nil {
			errs = append(errs, fmt.Errorf("vmm: virtio slot %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// StopSnapshotted ends the machine after a snapshot it is not to go on
// from: Run returns ExitSnapshot, status 0. Its devices stay quiesced.
func (m *Machine) StopSnapshotted() {
	m.stop(Result{Kind: ExitSnapshot, Status: StatusOK})
}

// irqChip is the machine's interrupt controller model.
func (m *Machine) irqChip() IRQChip {
	if m.cfg.IRQChip == IRQChipKernel {
		return IRQChipKernel
	}
	return IRQChipSplit
}

// restoreMemory maps guest memory from the snapshot (Config.Restore)
// copy-on-write, one part per range.
func (m *Machine) restoreMemory(ranges []guestmem.Range) (*guestmem.Memory, error) {
	s := m.cfg.Restore
	regs := make([]guestmem.Region, 0, len(ranges))
	fail := func(err error) (*guestmem.Memory, error) {
		for _, r := range regs {
			_ = r.Unmap()
		}
		return nil, err
	}
	for i, r := range ranges {
		p, ok := s.Part(memoryPart(i))
		if !ok {
			return fail(fmt.Errorf("%w: snapshot %s has no memory part %s for %d MiB at %#x", ErrConfig, s.Dir(), memoryPart(i), r.Size>>20, r.GPA))
		}
		size := p.Size
		if p.Kind == snapshot.KindMemoryDiff {
			size = p.MemorySize
		}
		if uint64(size) != r.Size {
			return fail(fmt.Errorf("%w: snapshot %s: memory part %s holds %d bytes; the machine's range at %#x has %d", ErrConfig, s.Dir(), p.Name, size, r.GPA, r.Size))
		}
		chain := append(m.cfg.RestoreBases, s)
		b, err := snapshot.MapMemoryChain(p.Name, chain...)
		if err != nil {
			return fail(err)
		}
		if m.cfg.Prefault {
			if err := chain[0].Prefault(b, p.Name); err != nil {
				_ = snapshot.Unmap(b)
				return fail(err)
			}
		}
		regs = append(regs, guestmem.Region{GPA: r.GPA, Data: b, Unmap: func() error { return snapshot.Unmap(b) }})
	}
	if _, ok := s.Part(memoryPart(len(ranges))); ok {
		return fail(fmt.Errorf("%w: snapshot %s has more memory than the machine (%d MiB)", ErrConfig, s.Dir(), m.cfg.MemoryBytes>>20))
	}
	return guestmem.New(regs...)
}

// Restore finishes a machine built from a snapshot (Config.Restore), in
// place of Boot, once the caller has added the same virtio devices in the
// same order: vCPUs, KVM's state, platform devices and transports as they
// were saved, then a new VM generation ID (vmgenid.go), which Run
// announces. An error leaves the machine unusable (Close it); nothing of
// it has run.
func (m *Machine) Restore() error {
	s := m.cfg.Restore
	if s == nil {
		return errors.New("vmm: Restore on a machine not built from a snapshot")
	}
	var st MachineState
	if err := s.State(snapshotMachinePart, &st); err != nil {
		return err
	}
	if err := m.checkShape(&st); err != nil {
		return fmt.Errorf("%w: snapshot %s: %w", ErrConfig, s.Dir(), err)
	}
	if err := m.addPowerControl(); err != nil {
		return err
	}
	host, err := m.sys.SupportedCPUID()
	if err != nil {
		return err
	}
	if _, err := m.msrIndices(); err != nil {
		return err
	}
	for i := range m.cfg.CPUs {
		v, err := m.vm.CreateVCPU(i)
		if err != nil {
			return err
		}
		// What the vCPU reports once given KVM's table is offered too: a
		// PVM host reports the host CPU's own bits there (its guests see
		// them), as it did when the snapshot was saved.
		if err := v.SetCPUID(host); err != nil {
			return err
		}
		reported, err := v.CPUID()
		if err != nil {
			return err
		}
		if err := checkCPUID(st.VCPUs[i].CPUID, host, reported); err != nil {
			v.Close()
			return fmt.Errorf("%w: snapshot %s: vCPU %d: %w", ErrConfig, s.Dir(), i, err)
		}
		m.vcpus = append(m.vcpus, v)
		m.vcpuCtrs = append(m.vcpuCtrs, &vcpuCounters{})
		if i == 0 {
			if err := unsyncTSC(v, st.VCPUs[0]); err != nil {
				return err
			}
		}
		if err := v.RestoreState(st.VCPUs[i]); err != nil {
			return fmt.Errorf("snapshot %s: %w", s.Dir(), err)
		}
	}
	if err := m.vm.RestoreState(st.VM); err != nil {
		return fmt.Errorf("snapshot %s: %w", s.Dir(), err)
	}
	if elapsed := time.Now().UnixNano() - st.SavedAt; st.SavedAt > 0 && elapsed > 0 {
		if err := m.vm.SetClock(kvm.ClockData{Clock: st.VM.Clock.Clock + uint64(elapsed)}); err != nil {
			return err
		}
	}
	if m.ioapic != nil {
		if err := m.ioapic.RestoreState(*st.IOAPIC); err != nil {
			return fmt.Errorf("snapshot %s: %w", s.Dir(), err)
		}
		if err := m.portB.RestoreState(*st.PortB); err != nil {
			return fmt.Errorf("snapshot %s: %w", s.Dir(), err)
		}
	}
	for _, r := range []func() error{
		func() error { return m.kbd.RestoreState(st.I8042) },
		func() error { return m.cmos.RestoreState(st.CMOS) },
		func() error { return m.pvwait.RestoreState(st.PVWait) },
		func() error { return m.serial.RestoreState(st.Serial) },
	} {
		if err := r(); err != nil {
			return fmt.Errorf("snapshot %s: %w", s.Dir(), err)
		}
	}
	for i, slot := range m.slots {
		if _, ok := s.Part(dataPart(i)); ok {
			r, err := s.File(dataPart(i))
			if err == nil {
				err = slot.t.RestoreData(r)
			}
			if err != nil {
				return fmt.Errorf("snapshot %s: virtio slot %d: %w", s.Dir(), i, err)
			}
		}
		if err := slot.t.RestoreState(st.Virtio[i]); err != nil {
			return fmt.Errorf("snapshot %s: virtio slot %d: %w", s.Dir(), i, err)
		}
	}
	if err := m.restoreVMGenID(st.VMGenID); err != nil {
		return fmt.Errorf("snapshot %s: %w", s.Dir(), err)
	}
	return nil
}

// msrTSC is IA32_TSC.
const msrTSC = 0x10

// unsyncTSC keeps KVM from taking the boot vCPU's saved TSC for an attempt
// to synchronise with the VM's start. Linux before 6.5 treats a TSC write
// within one second's worth of cycles of what it expects (for a new vCPU:
// about 0) as a sync and keeps the old offset, so a guest saved less than
// a second after it started came back with its TSC near 0: behind the
// values it had read, which a guest that subtracts TSC readings (the test
// guest's timeouts) sees as a huge interval. Writing a value far from the
// saved one first makes the saved one's write exact; the other vCPUs'
// writes, within a second of it, are then synced to it, as KVM intends,
// which keeps the TSCs matched.
func unsyncTSC(v *kvm.VCPU, st *kvm.VCPUState) error {
	for _, msr := range st.MSRs {
		if msr.Index == msrTSC {
			return v.SetMSRs([]kvm.MSR{{Index: msrTSC, Data: msr.Data + 1<<40}})
		}
	}
	return nil
}

// checkShape refuses a snapshot of another machine than this one: other
// CPUs, memory, interrupt controller model or virtio devices.
func (m *Machine) checkShape(st *MachineState) error {
	switch {
	case st.CPUs != m.cfg.CPUs || len(st.VCPUs) != st.CPUs:
		return fmt.Errorf("it has %d vCPUs (%d saved); the machine has %d", st.CPUs, len(st.VCPUs), m.cfg.CPUs)
	case st.MemoryBytes != m.cfg.MemoryBytes:
		return fmt.Errorf("it has %d MiB of memory; the machine has %d MiB", st.MemoryBytes>>20, m.cfg.MemoryBytes>>20)
	case st.IRQChip != m.irqChip():
		return fmt.Errorf("it has the %s irqchip; the machine has the %s one", st.IRQChip, m.irqChip())
	case st.NoACPI != m.cfg.NoACPI:
		return fmt.Errorf("its ACPI setting (off: %v) differs from the machine's (off: %v)", st.NoACPI, m.cfg.NoACPI)
	case st.VM == nil:
		return errors.New("it has no VM state")
	case (st.IOAPIC != nil) != (m.ioapic != nil) || (st.PortB != nil) != (m.portB != nil):
		return errors.New("its platform devices do not match its irqchip")
	case len(st.Virtio) != len(m.slots):
		return fmt.Errorf("it has %d virtio devices; the machine has %d", len(st.Virtio), len(m.slots))
	}
	for i, v := range st.VCPUs {
		if v == nil {
			return fmt.Errorf("vCPU %d has no state", i)
		}
	}
	return nil
}

// cpuidFeatureRegs are the CPUID registers that list features a guest may
// use once it has seen them: leaf 1 ECX and EDX, leaf 7.0 EBX, ECX and
// EDX, leaf 0x80000001 ECX and EDX.
var cpuidFeatureRegs = []struct {
	leaf, sub uint32
	reg       kvm.Reg
	name      string
}{
	{1, 0, kvm.ECX, "1.ECX"}, {1, 0, kvm.EDX, "1.EDX"},
	{7, 0, kvm.EBX, "7.0.EBX"}, {7, 0, kvm.ECX, "7.0.ECX"}, {7, 0, kvm.EDX, "7.0.EDX"},
	{0x8000_0001, 0, kvm.ECX, "0x80000001.ECX"}, {0x8000_0001, 0, kvm.EDX, "0x80000001.EDX"},
}

// cpuidGranted are bits a guest's CPUID may hold although KVM does not
// report them as supported: those Boot sets itself, TSC deadline (leaf 1
// ECX bit 24, which KVM emulates), the hypervisor bit (ECX bit 31) and HTT
// (EDX bit 28, which says the logical processor count is valid; kvm's
// CPUID.ForVCPU); and the bits KVM keeps in step with the guest's own
// settings, OSXSAVE (leaf 1 ECX bit 27, from CR4), MONITOR (ECX bit 3, from
// IA32_MISC_ENABLE) and OSPKE (leaf 7 ECX bit 4, from CR4), which the
// restored registers set again.
var cpuidGranted = map[string]uint32{"1.ECX": 1<<24 | 1<<31 | 1<<27 | 1<<3, "1.EDX": 1 << 28, "7.0.ECX": 1 << 4}

// checkCPUID refuses saved CPUID that lists a feature this host's KVM
// cannot give the guest: the guest checked its CPUID at boot and uses the
// feature without asking again, so it would fault (or worse) on this host.
// offered is the union of the tables given: what KVM reports it supports,
// and what a vCPU reports once given that.
func checkCPUID(saved kvm.CPUID, offered ...kvm.CPUID) error {
	for _, r := range cpuidFeatureRegs {
		s := saved.Find(r.leaf, r.sub)
		if s == nil {
			continue
		}
		var have uint32
		for _, host := range offered {
			if h := host.Find(r.leaf, r.sub); h != nil {
				have |= h.Get(r.reg)
			}
		}
		if missing := s.Get(r.reg) &^ have &^ cpuidGranted[r.name]; missing != 0 {
			return fmt.Errorf("the guest uses CPUID %s bits %#x that this host's KVM does not offer", r.name, missing)
		}
	}
	return nil
}
