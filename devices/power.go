package devices

import (
	"sync/atomic"

	"github.com/microvm/microvm/devices/acpi"
)

// The power control registers the FADT points at (docs/machine.md), one
// byte each, from PowerControlPort.
const (
	PowerControlPort  = 0x610
	PowerControlPorts = 3
	// Offsets from PowerControlPort.
	SleepControlReg = 0 // FADT SLEEP_CONTROL_REG (ACPI 6.5, 4.8.3.7)
	SleepStatusReg  = 1 // FADT SLEEP_STATUS_REG (4.8.3.8)
	ResetReg        = 2 // FADT RESET_REG (4.8.3.6)
	// ResetValue is the FADT's RESET_VALUE: written to ResetReg, it
	// restarts the machine.
	ResetValue = 0x01
)

// PowerControl is the hardware-reduced ACPI platform's power registers: a
// write of SLP_EN with SLP_TYP = acpi.SleepTypeS5 to the sleep control
// register powers the machine off, ResetValue written to the reset
// register restarts it. Other sleep states do not exist (the DSDT defines
// only \_S5), so other sleep writes are counted and ignored; the sleep
// status register reads 0 (no wake event) and ignores writes (the guest
// clears WAK_STS there before sleeping).
type PowerControl struct {
	// PowerOff and Reset are called on the matching write. They must not
	// block.
	PowerOff, Reset func()

	ignored atomic.Uint64
}

// Ignored counts writes that asked for something other than S5 or reset.
func (p *PowerControl) Ignored() uint64 { return p.ignored.Load() }

// Read returns 0 for every register.
func (p *PowerControl) Read(_ uint64, data []byte) { clear(data) }

// Write handles a byte written to one register (a wider write counts by
// its first byte, at offset).
func (p *PowerControl) Write(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	switch offset {
	case SleepControlReg:
		if v&acpi.SleepEnable != 0 && (v&acpi.SleepTypeMask)>>acpi.SleepTypeShift == acpi.SleepTypeS5 {
			if p.PowerOff != nil {
				p.PowerOff()
			}
			return
		}
		p.ignored.Add(1)
	case SleepStatusReg:
	case ResetReg:
		if v == ResetValue {
			if p.Reset != nil {
				p.Reset()
			}
			return
		}
		p.ignored.Add(1)
	}
}
