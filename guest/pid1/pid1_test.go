//go:build linux

package pid1

import (
	"testing"

	"github.com/microvm/microvm/devices/acpi"
)

// TestHasS5: microvm's own DSDT says it can power off; a DSDT without \_S5
// does not.
func TestHasS5(t *testing.T) {
	m := acpi.Machine{CPUs: 1, SleepControlPort: 0x610, SleepStatusPort: 0x611, ResetPort: 0x612}
	tb, err := acpi.Build(acpi.TablesAddr, m)
	if err != nil {
		t.Fatal(err)
	}
	dsdt := tb.Bytes[tb.Offsets["DSDT"]:]
	if !HasS5(dsdt) {
		t.Error("microvm's DSDT: HasS5 = false")
	}
	if HasS5([]byte("DSDT\x24\x00\x00\x00 no sleep states here")) {
		t.Error("a DSDT without _S5_: HasS5 = true")
	}
}
