// Package microvm is the embedding API of the microvm virtual machine
// monitor: build a Config, create a Machine with New, Run it until the guest
// exits, Close it.
//
//	m, err := microvm.New(microvm.Config{Kernel: "bzImage", CPUs: 2, MemoryBytes: 256 << 20})
//	if err != nil { ... }
//	defer m.Close()
//	res, err := m.Run(ctx) // res.Status is what the microvm CLI exits with
//
// Data flow: New opens /dev/kvm, creates the VM, maps guest memory (package
// guestmem) and registers it as memory slots, creates the interrupt
// controllers (Config.IRQChip: by default KVM's split irqchip, local APICs in
// the kernel and the IOAPIC emulated in package devices; IRQChipKernel for
// KVM's PIC, IOAPIC and PIT), builds the port I/O and MMIO buses with the
// platform devices (package devices) and the virtio-mmio devices (packages
// virtio and vsock), loads the kernel, initrd and command line (package
// loader), and creates the vCPUs. Run starts one goroutine per vCPU, each
// locked to its OS thread; every exit KVM hands back is decoded and
// dispatched to a bus. A virtio queue kick never reaches these goroutines:
// KVM turns it into an ioeventfd signal that wakes the device's worker, and
// devices interrupt the guest through irqfds, which KVM injects through the
// GSI routes the emulated IOAPIC installs (one MSI route per unmasked pin,
// updated from the vCPU goroutine that reprograms a redirection entry).
//
// Goroutines and ownership: the goroutine calling Run owns the Machine; it
// starts the vCPU goroutines, the console input pump (when ConsoleInput is
// set; it may stay blocked in Read after Run returns) and the vsock device's
// Unix socket accept loop, and waits for all vCPU goroutines before
// returning. The first exit condition (debug-exit port, reset, triple fault,
// error, context cancellation) wins: it is recorded once (stopOnce), every
// vCPU is kicked out of KVM_RUN, and blocked paravirtual waits are released.
// The Machine has no mutex of its own: buses and devices are fixed before Run
// and each device has its own lock (package devices). Close tears down
// devices first (the vsock device before its Unix socket listener), then
// vCPUs, VM, guest memory and /dev/kvm.
//
// Metrics (metrics.go, docs/metrics.md): Machine.Metrics snapshots the
// counters, atomics bumped on the data paths: per vCPU, one add per exit
// in its goroutine (by KVM exit reason) and the thread's CPU time, read
// from the thread's CPU clock at snapshot time and frozen when the vCPU
// goroutine ends (its OS thread is never unlocked, so the clock is the
// vCPU's alone); per virtio device, its transport's virtio.TransportStats
// and the device's own Stats. With Config.MetricsSocket, New starts the
// metrics server as its last step (metrics_server.go: net/http's accept
// goroutine and one goroutine per client connection, each serving
// Machine.MetricsHandler); Close stops it first and waits for its
// goroutines, so no handler outlives Close. The server's mutex (guarding
// its closed flag) is a leaf.
//
// In-process vsock (vsockapi.go): DialVsock hands one end of a socket pair
// to the vsock device on a short-lived goroutine of its own (it ends by the
// attempt's deadline, or when the device closes) and waits for the OK line
// on the other end in the caller's goroutine. ListenVsock registers a
// listener with the machine's vsockRouter, the device's Dialer: the
// device's dial goroutines look the port up under the router's mutex (a
// leaf lock guarding the port map) and queue a socket pair end on the
// listener's bounded channel, which Accept drains; ports without a listener
// go to "<uds>_<port>". Close closes the router's listeners after the
// device.
package microvm
