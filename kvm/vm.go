package kvm

import (
	"fmt"
	"os"
	"sync"
)

// VM is a KVM virtual machine. It owns the VM file descriptor.
type VM struct {
	f        *os.File
	once     sync.Once
	mmapSize int

	// mu guards what the VM records of its own set-up, for SaveState and
	// DirtyLog: its irqchip, whether it has a PIT, and its memory slots.
	mu      sync.Mutex
	irqchip IRQChipMode
	pit     bool
	slots   map[uint32]memSlot
}

// memSlot is what the VM records of a memory slot.
type memSlot struct {
	size  uint64
	flags MemoryFlags
}

// IRQChipMode says which interrupt controllers KVM emulates for a VM.
type IRQChipMode uint8

// Irqchip models.
const (
	// IRQChipNone: no in-kernel irqchip (and no in-kernel LAPICs).
	IRQChipNone IRQChipMode = iota
	// IRQChipFull: KVM_CREATE_IRQCHIP, the PICs, the IOAPIC and the LAPICs
	// in the kernel.
	IRQChipFull
	// IRQChipSplit: KVM_CAP_SPLIT_IRQCHIP, the LAPICs in the kernel, the
	// IOAPIC (and any PIC) in userspace.
	IRQChipSplit
)

func (m IRQChipMode) String() string {
	switch m {
	case IRQChipNone:
		return "none"
	case IRQChipFull:
		return "full"
	case IRQChipSplit:
		return "split"
	}
	return fmt.Sprintf("IRQChipMode(%d)", uint8(m))
}

// IRQChipMode returns the irqchip model the VM was given (CreateIRQChip or
// EnableSplitIRQChip).
func (vm *VM) IRQChipMode() IRQChipMode {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.irqchip
}

func (vm *VM) fd() uintptr { return vm.f.Fd() }

// Close closes the VM fd. Close every VCPU first.
func (vm *VM) Close() error {
	var err error
	vm.once.Do(func() { err = vm.f.Close() })
	return err
}

// SetMemoryRegion maps host memory at hostAddr into the guest at gpa as memory
// slot slot (KVM_SET_USER_MEMORY_REGION). A size of 0 deletes the slot.
func (vm *VM) SetMemoryRegion(slot uint32, gpa, size uint64, hostAddr uintptr) error {
	return vm.SetMemoryRegionFlags(slot, gpa, size, hostAddr, 0)
}

// SetMemoryRegionFlags is SetMemoryRegion with slot flags: MemLogDirtyPages
// to track the guest's writes for DirtyLog. Calling it again for an existing
// slot with the same gpa, size and hostAddr changes only its flags (turns
// dirty logging on or off).
func (vm *VM) SetMemoryRegionFlags(slot uint32, gpa, size uint64, hostAddr uintptr, flags MemoryFlags) error {
	r := userspaceMemoryRegion{Slot: slot, Flags: uint32(flags), GuestPhysAddr: gpa, MemorySize: size, UserspaceAddr: uint64(hostAddr)}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if _, err := ioctlPtr(vm.fd(), kvmSetUserMemoryRegion, &r); err != nil {
		return fmt.Errorf("kvm: KVM_SET_USER_MEMORY_REGION slot %d (%#x+%#x, flags %#x): %w", slot, gpa, size, flags, err)
	}
	if size == 0 {
		delete(vm.slots, slot)
		return nil
	}
	if vm.slots == nil {
		vm.slots = make(map[uint32]memSlot)
	}
	vm.slots[slot] = memSlot{size: size, flags: flags}
	return nil
}

// PageSize is the granularity of the dirty log: one bit per 4 KiB page.
const PageSize = 4096

// DirtyLog returns the dirty bitmap of memory slot slot (KVM_GET_DIRTY_LOG):
// bit i%64 of word i/64 is set when the guest wrote to page i of the slot (the
// page at the slot's gpa + i*PageSize) since the slot was registered or the
// previous DirtyLog. Reading clears the log and write-protects the pages
// again. pages is the number of pages the bitmap covers; it must be at least
// the slot's size in pages (KVM writes that many bits). The slot must have
// been registered with MemLogDirtyPages. The bitmap is the caller's.
func (vm *VM) DirtyLog(slot uint32, pages uint64) ([]uint64, error) {
	// Held across the ioctl, so that the slot cannot grow under the bitmap.
	vm.mu.Lock()
	defer vm.mu.Unlock()
	s, ok := vm.slots[slot]
	switch {
	case !ok:
		return nil, fmt.Errorf("kvm: KVM_GET_DIRTY_LOG slot %d: no such memory slot", slot)
	case s.flags&MemLogDirtyPages == 0:
		return nil, fmt.Errorf("kvm: KVM_GET_DIRTY_LOG slot %d: slot registered without MemLogDirtyPages", slot)
	case pages < (s.size+PageSize-1)/PageSize:
		return nil, fmt.Errorf("kvm: KVM_GET_DIRTY_LOG slot %d: %d pages, the slot has %d", slot, pages, (s.size+PageSize-1)/PageSize)
	}
	// The kernel writes ALIGN(npages, 64)/8 bytes: whole words.
	bitmap := make([]uint64, (pages+63)/64)
	if err := vm.getDirtyLog(slot, bitmap); err != nil {
		return nil, fmt.Errorf("kvm: KVM_GET_DIRTY_LOG slot %d: %w", slot, err)
	}
	return bitmap, nil
}

// SetTSSAddr places the three pages KVM needs for real-mode emulation on
// Intel (KVM_SET_TSS_ADDR); they must not overlap RAM or MMIO the guest uses.
func (vm *VM) SetTSSAddr(addr uint32) error {
	if _, err := ioctl(vm.fd(), kvmSetTSSAddr, uintptr(addr)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_TSS_ADDR %#x: %w", addr, err)
	}
	return nil
}

// CreateIRQChip creates the in-kernel PIC, IOAPIC and per-vCPU local APICs
// (KVM_CREATE_IRQCHIP). Call it before creating vCPUs.
func (vm *VM) CreateIRQChip() error {
	if _, err := ioctl(vm.fd(), kvmCreateIRQChip, 0); err != nil {
		return fmt.Errorf("kvm: KVM_CREATE_IRQCHIP: %w", err)
	}
	vm.mu.Lock()
	vm.irqchip = IRQChipFull
	vm.mu.Unlock()
	return nil
}

// CreatePIT2 creates the in-kernel i8254 timer (KVM_CREATE_PIT2) with a dummy
// PC speaker port.
func (vm *VM) CreatePIT2() error {
	c := pitConfig{Flags: pitSpeakerDummy}
	if _, err := ioctlPtr(vm.fd(), kvmCreatePIT2, &c); err != nil {
		return fmt.Errorf("kvm: KVM_CREATE_PIT2: %w", err)
	}
	vm.mu.Lock()
	vm.pit = true
	vm.mu.Unlock()
	return nil
}

// IRQLine sets the level of an interrupt line of the in-kernel irqchip
// (KVM_IRQ_LINE).
func (vm *VM) IRQLine(gsi uint32, high bool) error {
	l := irqLevel{IRQ: gsi}
	if high {
		l.Level = 1
	}
	if _, err := ioctlPtr(vm.fd(), kvmIRQLine, &l); err != nil {
		return fmt.Errorf("kvm: KVM_IRQ_LINE %d=%v: %w", gsi, high, err)
	}
	return nil
}

// RegisterIRQFD makes every write to the eventfd efd inject an edge on gsi
// (KVM_IRQFD), without a trip through the VMM.
func (vm *VM) RegisterIRQFD(efd int, gsi uint32) error {
	r := irqfd{FD: uint32(efd), GSI: gsi}
	if _, err := ioctlPtr(vm.fd(), kvmIRQFD, &r); err != nil {
		return fmt.Errorf("kvm: KVM_IRQFD fd %d gsi %d: %w", efd, gsi, err)
	}
	return nil
}

// UnregisterIRQFD removes an irqfd registered with RegisterIRQFD.
func (vm *VM) UnregisterIRQFD(efd int, gsi uint32) error {
	r := irqfd{FD: uint32(efd), GSI: gsi, Flags: irqfdFlagDeassign}
	if _, err := ioctlPtr(vm.fd(), kvmIRQFD, &r); err != nil {
		return fmt.Errorf("kvm: KVM_IRQFD deassign fd %d gsi %d: %w", efd, gsi, err)
	}
	return nil
}

// IOEventFD describes a guest write that KVM turns into an eventfd signal
// instead of an exit (KVM_IOEVENTFD).
type IOEventFD struct {
	FD   int    // eventfd to signal
	Addr uint64 // MMIO address or I/O port
	Len  uint32 // access width in bytes: 1, 2, 4 or 8 (0: any, with KVM_CAP_IOEVENTFD_ANY_LENGTH)
	PIO  bool   // port I/O instead of MMIO
	// Datamatch, when set, limits the match to writes of this value.
	Datamatch *uint64
}

func (e IOEventFD) raw(deassign bool) ioeventfd {
	r := ioeventfd{Addr: e.Addr, Len: e.Len, FD: int32(e.FD)}
	if e.Datamatch != nil {
		r.Flags |= ioeventfdFlagDatamatch
		r.Datamatch = *e.Datamatch
	}
	if e.PIO {
		r.Flags |= ioeventfdFlagPIO
	}
	if deassign {
		r.Flags |= ioeventfdFlagDeassign
	}
	return r
}

// RegisterIOEventFD registers e.
func (vm *VM) RegisterIOEventFD(e IOEventFD) error {
	r := e.raw(false)
	if _, err := ioctlPtr(vm.fd(), kvmIOEventFD, &r); err != nil {
		return fmt.Errorf("kvm: KVM_IOEVENTFD %#x/%d: %w", e.Addr, e.Len, err)
	}
	return nil
}

// UnregisterIOEventFD removes e, registered earlier with the same fields.
func (vm *VM) UnregisterIOEventFD(e IOEventFD) error {
	r := e.raw(true)
	if _, err := ioctlPtr(vm.fd(), kvmIOEventFD, &r); err != nil {
		return fmt.Errorf("kvm: KVM_IOEVENTFD deassign %#x/%d: %w", e.Addr, e.Len, err)
	}
	return nil
}

// CreateVCPU creates vCPU id and maps its kvm_run page.
func (vm *VM) CreateVCPU(id int) (*VCPU, error) {
	fd, err := ioctl(vm.fd(), kvmCreateVCPU, uintptr(id))
	if err != nil {
		return nil, fmt.Errorf("kvm: create vCPU %d: %w", id, err)
	}
	v := &VCPU{id: id, f: os.NewFile(fd, fmt.Sprintf("kvm-vcpu-%d", id))}
	if err := v.mapRun(vm.mmapSize); err != nil {
		v.f.Close()
		return nil, fmt.Errorf("kvm: map kvm_run of vCPU %d: %w", id, err)
	}
	return v, nil
}

// EnableSplitIRQChip puts the local APICs in the kernel and leaves the
// IOAPIC and PIC to userspace (KVM_CAP_SPLIT_IRQCHIP), with pins IOAPIC
// routes reserved. Interrupts then reach the LAPICs as MSIs: through
// KVM_SET_GSI_ROUTING (for irqfds) or KVM_SIGNAL_MSI. There is no in-kernel
// PIT in this mode. Call it before creating vCPUs.
func (vm *VM) EnableSplitIRQChip(pins int) error {
	c := enableCap{Cap: uint32(CapSplitIRQChip)}
	c.Args[0] = uint64(pins)
	if _, err := ioctlPtr(vm.fd(), kvmEnableCap, &c); err != nil {
		return fmt.Errorf("kvm: enable KVM_CAP_SPLIT_IRQCHIP: %w", err)
	}
	vm.mu.Lock()
	vm.irqchip = IRQChipSplit
	vm.mu.Unlock()
	return nil
}

// MSIRoute routes a GSI to a message-signalled interrupt: an irqfd bound to
// GSI then delivers the MSI in the kernel.
type MSIRoute struct {
	GSI    uint32
	AddrLo uint32
	AddrHi uint32
	Data   uint32
}

// SetGSIRouting replaces the whole GSI routing table (KVM_SET_GSI_ROUTING).
// A GSI without a route drops what is signalled on it.
func (vm *VM) SetGSIRouting(routes []MSIRoute) error {
	if len(routes) > maxRoutes {
		return fmt.Errorf("kvm: %d routes, at most %d", len(routes), maxRoutes)
	}
	var r irqRouting
	r.Nr = uint32(len(routes))
	for i, rt := range routes {
		r.Entries[i] = irqRoutingEntry{GSI: rt.GSI, Type: irqRoutingTypeMSI, AddrLo: rt.AddrLo, AddrHi: rt.AddrHi, Data: rt.Data}
	}
	if _, err := ioctlPtr(vm.fd(), kvmSetGSIRouting, &r); err != nil {
		return fmt.Errorf("kvm: KVM_SET_GSI_ROUTING (%d routes): %w", len(routes), err)
	}
	return nil
}

// SignalMSI injects one MSI (KVM_SIGNAL_MSI). It reports whether the
// interrupt was delivered (false: it was blocked, e.g. by a masked LAPIC).
func (vm *VM) SignalMSI(addrLo, addrHi, data uint32) (bool, error) {
	m := kvmMSI{AddrLo: addrLo, AddrHi: addrHi, Data: data}
	r, err := ioctlPtr(vm.fd(), kvmSignalMSI, &m)
	if err != nil {
		return false, fmt.Errorf("kvm: KVM_SIGNAL_MSI: %w", err)
	}
	return r > 0, nil
}

// Clock reads the VM's kvmclock (KVM_GET_CLOCK), in ns.
func (vm *VM) Clock() (ClockData, error) {
	var c ClockData
	if _, err := ioctlPtr(vm.fd(), kvmGetClock, &c); err != nil {
		return c, fmt.Errorf("kvm: KVM_GET_CLOCK: %w", err)
	}
	return c, nil
}

// SetClock sets the VM's kvmclock (KVM_SET_CLOCK). With ClockRealtime in
// c.Flags KVM also adds the CLOCK_REALTIME time elapsed since c.Realtime;
// without it the clock resumes at c.Clock. ClockTSCStable and ClockHostTSC
// are ignored.
func (vm *VM) SetClock(c ClockData) error {
	if _, err := ioctlPtr(vm.fd(), kvmSetClock, &c); err != nil {
		return fmt.Errorf("kvm: KVM_SET_CLOCK: %w", err)
	}
	return nil
}

// IRQChip reads the state of in-kernel interrupt controller chip
// (IRQChipPICMaster, IRQChipPICSlave or IRQChipIOAPIC) with KVM_GET_IRQCHIP.
// Only a VM with the full in-kernel irqchip (CreateIRQChip) has them.
func (vm *VM) IRQChip(chip uint32) (IRQChip, error) {
	c := IRQChip{ChipID: chip}
	if _, err := ioctlPtr(vm.fd(), kvmGetIRQChip, &c); err != nil {
		return c, fmt.Errorf("kvm: KVM_GET_IRQCHIP chip %d: %w", chip, err)
	}
	return c, nil
}

// SetIRQChip writes the state of the in-kernel interrupt controller
// c.ChipID (KVM_SET_IRQCHIP).
func (vm *VM) SetIRQChip(c IRQChip) error {
	if _, err := ioctlPtr(vm.fd(), kvmSetIRQChip, &c); err != nil {
		return fmt.Errorf("kvm: KVM_SET_IRQCHIP chip %d: %w", c.ChipID, err)
	}
	return nil
}

// PIT2 reads the in-kernel i8254 (KVM_GET_PIT2).
func (vm *VM) PIT2() (PITState2, error) {
	var p PITState2
	if _, err := ioctlPtr(vm.fd(), kvmGetPIT2, &p); err != nil {
		return p, fmt.Errorf("kvm: KVM_GET_PIT2: %w", err)
	}
	return p, nil
}

// SetPIT2 writes the in-kernel i8254 (KVM_SET_PIT2); each counter restarts
// from its Count at the time of the call.
func (vm *VM) SetPIT2(p PITState2) error {
	if _, err := ioctlPtr(vm.fd(), kvmSetPIT2, &p); err != nil {
		return fmt.Errorf("kvm: KVM_SET_PIT2: %w", err)
	}
	return nil
}
