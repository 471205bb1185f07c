// Package vmm is the machine floor under the microvm embedding API: one
// KVM virtual machine with its memory, interrupt controllers, platform
// devices, virtio-mmio slots and vCPUs. Package microvm (the root) puts the
// virtio devices in its slots and owns its configuration and metrics;
// nothing outside this module imports vmm.
//
// Data flow: New opens the kernel (and initrd) and checks its headers,
// opens /dev/kvm, creates the VM, maps guest memory (package kvm/guestmem)
// and registers it as memory slots, creates the interrupt controllers
// (Config.IRQChip: by default KVM's split irqchip, local APICs in the
// kernel and the IOAPIC emulated in package devices; IRQChipKernel for
// KVM's PIC, IOAPIC and PIT) and builds the port I/O and MMIO buses with the
// platform devices (package devices). AddVirtio puts a virtio device behind
// the next virtio-mmio window (virtio.MMIO), with an irqfd for its
// interrupt and, from the driver's first DRIVER_OK, an ioeventfd per queue
// it uses (registered on the vCPU goroutine that wrote the status). Boot
// writes the ACPI tables (one entry per slot, and the VM generation ID
// with its Generic Event Device: vmgenid.go, whose ID a restore renews
// and Run announces), loads the kernel, initrd and
// command line (package kvm/loader; one virtio_mmio.device= entry per slot)
// and creates the vCPUs.
// Run starts one goroutine per vCPU, each locked to its OS thread; every
// exit KVM hands back is decoded and dispatched to a bus. A virtio queue
// kick never reaches these goroutines: KVM turns it into an ioeventfd
// signal that wakes the device's worker, and devices interrupt the guest
// through irqfds, which KVM injects through the GSI routes the emulated
// IOAPIC installs (one MSI route per unmasked pin, updated from the vCPU
// goroutine that reprograms a redirection entry).
//
// Goroutines and ownership: the goroutine calling Run owns the Machine; it
// starts the vCPU goroutines and the console input pump (when ConsoleInput
// is set; it may stay blocked in Read after Run returns), and waits for all
// vCPU goroutines before returning. The first exit condition (debug-exit
// port, reset, power-off, triple fault, error, context cancellation) wins:
// it is recorded once (stopOnce), every vCPU is kicked out of KVM_RUN, and
// blocked paravirtual waits are released. Devices never stop the machine
// themselves; they call the callbacks it gave them (I8042's reset,
// DebugExit's exit, PowerControl's), which call stop. The Machine has no
// mutex of its own: buses and devices are fixed before Run and each device
// has its own lock (package devices). Close runs what OnClose and AddVirtio
// registered, in reverse order, then closes the vCPUs, the VM, guest memory
// and /dev/kvm. Pause (pause.go) parks every vCPU goroutine at the top of
// its loop until Resume, and hands parked vCPUs jobs (a snapshot's save of
// their state); PeekVCPUs (peek.go) instead publishes one request, kicks
// the vCPUs, and each answers it with its registers between two exits and
// runs on.
//
// Counters (counters.go): per vCPU, one atomic add per exit in its
// goroutine (by KVM exit reason) and the thread's CPU time, read from the
// thread's CPU clock at snapshot time and frozen when the vCPU goroutine
// ends (its OS thread is never unlocked, so the clock is the vCPU's alone).
package vmm
