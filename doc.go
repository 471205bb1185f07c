// Package microvm is the embedding API of the microvm virtual machine
// monitor: build a Config, create a Machine with New, Run it until the guest
// exits, Close it.
//
//	m, err := microvm.New(microvm.Config{Kernel: "bzImage", CPUs: 2, MemoryBytes: 256 << 20})
//	if err != nil { ... }
//	defer m.Close()
//	res, err := m.Run(ctx) // res.Status is what the microvm CLI exits with
//
// Data flow: New opens /dev/kvm, creates the VM with the in-kernel irqchip and
// PIT, maps guest memory (package guestmem) and registers it as memory slots,
// loads the kernel, initrd and command line (package loader), builds the port
// I/O and MMIO buses with the platform devices (package devices) and the
// virtio-mmio devices (packages virtio and vsock), and creates the vCPUs. Run
// starts one goroutine per vCPU, each locked to its OS thread; every exit
// KVM hands back is decoded and dispatched to a bus. A virtio queue kick never
// reaches these goroutines: KVM turns it into an ioeventfd signal that wakes the
// device's worker, and devices interrupt the guest through irqfds.
//
// Goroutines and ownership: the goroutine calling Run owns the Machine; it
// starts the vCPU goroutines and waits for all of them before returning. The
// first exit condition (debug-exit port, reset, triple fault, error, context
// cancellation) wins: it is recorded once, every vCPU is kicked out of
// KVM_RUN, and blocked paravirtual waits are released. Close tears down in
// reverse order of creation: devices, vCPUs, VM, guest memory, /dev/kvm.
package microvm
