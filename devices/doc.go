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
// registers: S5 powers off, the reset value restarts).
//
// Concurrency: buses are built before the vCPUs start and are immutable
// afterwards, so dispatch takes no lock. Several vCPUs can reach one device at
// once, so every device guards its registers with its own mutex; a device
// never calls back into a bus. Lock order: a device's mutex is a leaf, except
// that Serial may take its output writer's lock while holding its own, and
// that IOAPIC calls its Update callback (the machine's KVM_SET_GSI_ROUTING)
// with its mutex held, so callbacks must take no device lock. Callbacks
// given to devices (I8042's reset, DebugExit's exit, PowerControl's power-off
// and reset, Serial's irq) run on
// the goroutine that made the access (a vCPU; for Serial's irq also the
// console input pump calling Input) and must not block. The only goroutine
// a device starts is Serial's line-flush timer (time.AfterFunc), which just
// writes buffered output; firing after Close, it finds nothing to write.
package devices
