package microvm

import "github.com/microvm/microvm/devices"

// Test-only access to unexported state for the external tests (package
// microvm_test), compiled into the test binary only. Each entry is
// something an external test checks that the public API does not show.

// VMGenIDOf is m's VM generation ID device, nil without ACPI: the ID it
// last wrote to guest memory and how many times it raised its interrupt.
// TestSnapshotNewGenerationID checks both across restores.
func VMGenIDOf(m *Machine) *devices.VMGenID { return m.vm.VMGenID() }
