// Package kvm is a typed interface to Linux KVM on x86-64.
//
// Three handle types own their file descriptors, and every ioctl is a method
// on the handle it applies to:
//
//	System  /dev/kvm: API version, capabilities, supported CPUID, creating VMs
//	VM      a VM fd: memory slots, the irqchip (KVM's full one with the PIT, or the
//	        split one: LAPICs only, GSI routes to MSIs), irqfd, ioeventfd, vCPUs
//	VCPU    a vCPU fd plus its mapped kvm_run page: registers, MSRs, CPUID, the run loop
//
// Close them in reverse order of creation (VCPU, then VM, then System); each
// Close is idempotent.
//
// Kernel layouts: every struct that mirrors a kernel structure names it in its
// comment and has a size test (kvm_test.go). Ioctl numbers are built in
// const.go from the _IO/_IOR/_IOW/_IOWR encoding, each named after its C macro.
// The only code that converts Go pointers for the kernel lives in
// ioctl_unsafe.go, run_unsafe.go and dirtylog_unsafe.go.
//
// Snapshots: VCPU.SaveState / RestoreState and VM.SaveState / RestoreState
// (state.go) read and load everything KVM holds for a vCPU and a VM, as plain
// data (VCPUState, VMState), in the orders the kernel needs; guest memory is
// the caller's, with dirty-page tracking per memory slot
// (SetMemoryRegionFlags with MemLogDirtyPages, VM.DirtyLog).
//
// The run loop: VCPU.Run enters the guest (KVM_RUN) and returns the decoded
// exit reason; the exit's details (port I/O, MMIO, system event, internal
// error) are read from the shared kvm_run page through accessor methods that
// hand out bounded views of it, valid until the next Run. A VCPU is used by one
// goroutine (its owner, locked to an OS thread, which calls BindThread before
// the first Run); the only method another goroutine may call is Kick, which
// makes a running vCPU leave KVM_RUN (kvm_run.immediate_exit plus a SIGURG to
// the owner's thread). VCPU.kickMu, a leaf lock, orders Kick against Close.
// System keeps no mutable state besides its fd, and VM only what it records
// of its set-up (irqchip model, PIT, memory slot sizes) under VM.mu, so their
// methods may be called from any goroutine (the machine's IOAPIC updates GSI
// routes from whichever vCPU goroutine reprograms it).
package kvm
