package microvm_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/devices/acpi"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/kvm/loader"
)

// TestACPIPowerControl drives the FADT's registers from a tiny guest: S5
// ends the machine as a power-off, the reset value as a reset, and with
// NoACPI the ports are not there (the write is ignored, the guest goes on).
func TestACPIPowerControl(t *testing.T) {
	testenv.RequireKVM(t)
	s5 := byte(acpi.SleepEnable | acpi.SleepTypeS5<<acpi.SleepTypeShift)
	ctl := uint16(devices.PowerControlPort + devices.SleepControlReg)
	rst := uint16(devices.PowerControlPort + devices.ResetReg)
	for _, tc := range []struct {
		name   string
		noACPI bool
		prog   testenv.Program
		want   microvm.Result
	}{
		{"S5 powers off", false, testenv.Program{}.Out(ctl, s5).Exit(9).Halt(), microvm.Result{Kind: microvm.ExitPowerOff, Status: microvm.StatusOK}},
		{"S3 is ignored", false, testenv.Program{}.Out(ctl, acpi.SleepEnable|3<<acpi.SleepTypeShift).Exit(9).Halt(), microvm.Result{Kind: microvm.ExitDebugPort, Status: 9}},
		{"reset register", false, testenv.Program{}.Out(rst, devices.ResetValue).Exit(9).Halt(), microvm.Result{Kind: microvm.ExitReset, Status: microvm.StatusOK}},
		{"acpi=off: no power control", true, testenv.Program{}.Out(ctl, s5).Out(rst, devices.ResetValue).Exit(9).Halt(), microvm.Result{Kind: microvm.ExitDebugPort, Status: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _, err := runGuest(t, microvm.Config{Kernel: testenv.TinyGuest(t, tc.prog), MemoryBytes: 16 << 20, NoACPI: tc.noACPI}, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, res, resultOpts); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

// TestACPITablesInGuestMemory: New puts the RSDP at acpi.TablesAddr and its
// address in boot_params; with NoACPI neither is there.
func TestACPITablesInGuestMemory(t *testing.T) {
	testenv.RequireKVM(t)
	kernel := testenv.TinyGuest(t, testenv.Program{}.Exit(0).Halt())
	for _, noACPI := range []bool{false, true} {
		m, err := microvm.New(microvm.Config{Kernel: kernel, MemoryBytes: 16 << 20, CPUs: 2, NoACPI: noACPI, Log: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		rsdp := make([]byte, acpi.RSDPSize)
		zp := make([]byte, 8)
		err1 := m.ReadMemory(acpi.TablesAddr, rsdp)
		err2 := m.ReadMemory(loader.BootParamsAddr+0x70, zp)
		m.Close()
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		gotAddr := binary.LittleEndian.Uint64(zp)
		if noACPI {
			if string(rsdp[:8]) == "RSD PTR " || gotAddr != 0 {
				t.Errorf("NoACPI: RSDP %q, acpi_rsdp_addr %#x; want none", rsdp[:8], gotAddr)
			}
			continue
		}
		if string(rsdp[:8]) != "RSD PTR " || acpi.Checksum(rsdp) != 0 || gotAddr != acpi.TablesAddr {
			t.Errorf("RSDP % x, acpi_rsdp_addr %#x; want a valid RSDP at %#x", rsdp, gotAddr, acpi.TablesAddr)
		}
	}
}
