package vmm

import (
	"fmt"

	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/devices/acpi"
	"github.com/microvm/microvm/kvm/loader"
	"github.com/microvm/microvm/virtio"
)

// addPowerControl puts the ACPI power control registers on the port bus
// (with ACPI: at Boot, or at Restore, where the tables are in the
// snapshot's memory already).
func (m *Machine) addPowerControl() error {
	if m.cfg.NoACPI {
		return nil
	}
	pc := &devices.PowerControl{
		PowerOff: func() { m.stop(Result{Kind: ExitPowerOff, Status: StatusOK}) },
		Reset:    func() { m.stop(Result{Kind: ExitReset, Status: StatusOK}) },
	}
	return m.pio.Register(devices.PowerControlPort, devices.PowerControlPorts, "acpi-power", pc)
}

// setupACPI adds the power control registers to the port bus, creates the
// VM generation ID (vmgenid.go), writes the ACPI tables describing the
// machine (docs/machine.md, "ACPI") at acpi.TablesAddr and returns the
// RSDP's address for the loader. With Config.NoACPI it does nothing and
// returns 0. It runs after the devices exist (the DSDT lists the
// virtio-mmio slots).
func (m *Machine) setupACPI() (uint64, error) {
	if m.cfg.NoACPI {
		return 0, nil
	}
	if err := m.addPowerControl(); err != nil {
		return 0, err
	}
	if err := m.setupVMGenID(nil); err != nil {
		return 0, err
	}
	d := acpi.Machine{
		CPUs:             m.cfg.CPUs,
		LAPICAddr:        loader.LAPICAddr,
		IOAPICAddr:       loader.IOAPICAddr,
		IOAPICID:         uint8(m.cfg.CPUs), // as the MP table says
		PCAT:             m.cfg.IRQChip == IRQChipKernel,
		SleepControlPort: devices.PowerControlPort + devices.SleepControlReg,
		SleepStatusPort:  devices.PowerControlPort + devices.SleepStatusReg,
		ResetPort:        devices.PowerControlPort + devices.ResetReg,
		ResetValue:       devices.ResetValue,
		VMGenID:          &acpi.VMGenID{Addr: m.vmgenid.Addr(), GSI: m.vmgenid.GSI()},
	}
	d.Serial.Port, d.Serial.IRQ = devices.COM1Port, devices.COM1IRQ
	for _, s := range m.slots {
		d.Virtio = append(d.Virtio, acpi.MMIODevice{Base: uint32(s.base), Size: virtio.MMIOSize, GSI: s.irq})
	}
	t, err := acpi.Build(acpi.TablesAddr, d)
	if err != nil {
		return 0, err
	}
	if uint64(len(t.Bytes)) > acpi.TablesEnd-acpi.TablesAddr {
		return 0, fmt.Errorf("acpi: %d bytes of tables do not fit in %#x-%#x", len(t.Bytes), acpi.TablesAddr, acpi.TablesEnd)
	}
	if err := m.mem.Write(t.Base, t.Bytes); err != nil {
		return 0, fmt.Errorf("acpi: writing the tables: %w", err)
	}
	return t.RSDP, nil
}
