// Package devices holds the platform devices of the microvm machine and the
// buses that route vCPU exits to them.
//
// Data flow: a vCPU goroutine takes a KVM_EXIT_IO or KVM_EXIT_MMIO, asks the
// matching Bus to dispatch the access, and the Bus calls the Device whose
// address range holds it with the offset inside that range. Accesses nobody
// claims are counted (Bus.Unclaimed) and read as all-ones, as on a PC.
//
// Devices: Serial (8250 UART on COM1, host stdin to the guest, guest output to
// a writer), I8042 (keyboard controller: only the reset line matters),
// DebugExit (port 0xf4: the guest chooses microvm's exit status), CMOS (time
// of day and memory size), PVWait (a paravirtual "sleep until a device has
// work" port for polling guests), and, for KVM's split irqchip, IOAPIC (an
// MMIO device whose redirection entries become MSI routes: the machine
// installs them as KVM GSI routes, so device irqfds still inject in the
// kernel), PortB (port 0x61 without an i8254: only the refresh toggle) and,
// with ACPI, PowerControl (the FADT's sleep control, sleep status and reset
// registers: S5 powers off, the reset value restarts) and VMGenID (the VM
// generation ID: 16 random bytes at VMGenIDAddr in guest memory, described
// by the DSDT, and an interrupt on VMGenIDGSI for the DSDT's Generic Event
// Device, which notifies the guest's driver to read them again; no bus
// device: it writes through guest memory and raises its interrupt through
// the callback the machine gives it).
//
// Saved state (snapshots): each device whose registers the guest can see
// has a plain state struct (SerialState, I8042State, CMOSState,
// PortBState, IOAPICState, PVWaitState, VMGenIDState; state.go) with
// SaveState and RestoreState, the Stateful interface. (VMGenIDState holds
// where the ID and its interrupt are, not the ID: that is in guest memory,
// and a restore writes a new one.) Saving: the machine stops the
// vCPUs and the console input pump, then SaveState copies the registers
// and queues under the device's mutex, and internal/snapshot encodes the
// structs as JSON parts. Restoring into a new process: the machine builds
// fresh devices as for a boot, restores KVM's state, then calls each
// RestoreState with the decoded struct, which checks every field (a
// corrupt or hostile file is refused with ErrBadState and the device left
// untouched) before replacing the registers, and redoes what the saved
// device had done to the host: IOAPIC calls Update with every pin's route
// (the new VM's GSI routing table is empty), and Serial raises its
// interrupt (an edge) once if the saved UART had one pending and OUT2 set,
// since a pending edge the kernel state may or may not hold is safer
// duplicated than lost. So devices are restored after KVM's interrupt
// controllers, the IOAPIC before Serial, and before the vCPUs run. Derived
// values (line status, routes) are recomputed, not saved; host-side things
// (callbacks, the console writer and its buffered output, counters, CMOS's
// clock, which reads the new host's wall clock) are not part of the state.
// DebugExit and PowerControl hold no guest-visible state and have none.
//
// Concurrency: buses are built before the vCPUs start and are immutable
// afterwards, so dispatch takes no lock. Several vCPUs can reach one device at
// once, so every device guards its registers with its own mutex; a device
// never calls back into a bus. Lock order: a device's mutex is a leaf, except
// that Serial may take its output writer's lock while holding its own, and
// that IOAPIC calls its Update callback (the machine's KVM_SET_GSI_ROUTING)
// with its mutex held, on a guest write or a RestoreState, so callbacks must
// take no device lock. Callbacks given to devices (I8042's reset, DebugExit's
// exit, PowerControl's power-off and reset, Serial's irq) run on the goroutine
// that made the access (a vCPU; for Serial's irq also the console input pump
// calling Input, and the caller of RestoreState) and must not block;
// VMGenID's notify runs on the caller of Notify (the machine's Run). The only
// goroutine a device starts is Serial's line-flush timer (time.AfterFunc),
// which just writes buffered output; firing after Close, it finds nothing to
// write.
package devices
