package vmm

import (
	"errors"

	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/kvm/eventfd"
)

// The VM generation ID (devices.VMGenID; docs/machine.md, "VM generation
// ID"; docs/snapshot.md, "Clone identity"). With ACPI, Boot creates it at
// devices.VMGenIDAddr with an irqfd on devices.VMGenIDGSI, writes a random
// ID and has the DSDT describe both (setupACPI). A snapshot saves where
// they are (MachineState.VMGenID). Restore recreates it there and writes a
// new ID into the clone's copy-on-write memory; Run, once it has started
// the vCPUs, raises the GSI once: the guest's Generic Event Device runs
// _EVT, which notifies the VMGENCTR device, and Linux's vmgenid driver
// reads the new ID and reseeds the kernel's RNG with it. The interrupt goes
// through an irqfd as every other source does, so it reaches the guest the
// same way with either irqchip: through the GSI route microvm's IOAPIC
// installed for the pin (split), or KVM's IOAPIC pin (kernel). Without
// ACPI there is none: no table could tell the guest where it is.

// setupVMGenID creates the VM generation ID, at st's place when restoring
// (nil: the defaults), with an irqfd on its GSI, and writes a first ID.
func (m *Machine) setupVMGenID(st *devices.VMGenIDState) error {
	irq, err := eventfd.New()
	if err != nil {
		return err
	}
	m.closers = append(m.closers, irq.Close)
	g := devices.NewVMGenID(m.mem, func() {
		_ = irq.Signal()
		m.pvwait.Notify()
	})
	if st != nil {
		if err := g.RestoreState(*st); err != nil {
			return err
		}
	}
	if err := m.registerIRQFD(irq.FD(), g.GSI()); err != nil {
		return err
	}
	if err := g.Generate(); err != nil {
		return err
	}
	m.vmgenid = g
	return nil
}

// saveVMGenID is the VM generation ID's part of a snapshot: nil without one.
func (m *Machine) saveVMGenID() *devices.VMGenIDState {
	if m.vmgenid == nil {
		return nil
	}
	st := m.vmgenid.SaveState()
	return &st
}

// restoreVMGenID gives a restored machine the saved one's VM generation
// ID, with a new value, and has Run announce it. A snapshot without one (no
// ACPI, or taken before microvm had it) gets none: its guest never learnt
// of one.
func (m *Machine) restoreVMGenID(st *devices.VMGenIDState) error {
	if st == nil {
		return nil
	}
	if m.cfg.NoACPI {
		return errors.New("vmgenid: a VM generation ID saved without ACPI")
	}
	if err := m.setupVMGenID(st); err != nil {
		return err
	}
	m.announceGeneration = true
	return nil
}

// announceGenerationOnRun raises the VM generation ID's interrupt once
// when Run starts the vCPUs of a restored machine: they have their saved
// state (LAPIC and IOAPIC included) by then, so the edge reaches the pin
// and vector the guest programmed.
func (m *Machine) announceGenerationOnRun() {
	if m.vmgenid != nil && m.announceGeneration {
		m.announceGeneration = false
		m.vmgenid.Notify()
	}
}

// VMGenID is the machine's VM generation ID (nil without ACPI, or when
// restored from a snapshot that had none).
func (m *Machine) VMGenID() *devices.VMGenID { return m.vmgenid }
