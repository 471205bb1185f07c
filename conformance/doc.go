// Package conformance holds the end-to-end conformance suite of microvm's
// virtio-vsock device: a real Linux 6.1 guest (build/kernel from make
// kernel) whose /init (guest/init) runs vsock scenarios that the tests drive
// and check from the host side. The same scenarios run against two targets:
//
//   - QEMU -M microvm (TCG) with a vhost-user-vsock-device whose back-end is
//     microvm vhost-user-vsock in a separate process (TestModern,
//     TestLegacyMMIO, TestQEMURestart, TestMalformedFrontEnd, TestAgentQEMU);
//   - microvm run itself, the device behind microvm's own virtio-mmio
//     transport with ioeventfd kicks and irqfd interrupts (TestMicrovm,
//     TestAgentMicrovm). These need a KVM that runs Linux: on other hosts
//     testenv.RequireKVM skips them, and make test runs them in the
//     nested-KVM box (docs/testing.md).
//
// TestAgentQEMU and TestAgentMicrovm boot the guest agent's image (what
// microvm exec boots) instead of guest/init and drive it from the host.
//
// The package has no non-test code beyond this comment. bin/microvm and the
// initramfs come from $MICROVM_BINARY and $MICROVM_INITRD when set (make
// test sets both; nothing may be built inside the box), otherwise from make
// bin/microvm and make initramfs (internal/testing/testenv). Missing prerequisites
// skip a test with a message, and fail it when CI=true. See
// docs/vhost-user.md for what each test checks and how to run the suite.
//
// Environment:
//
//	MICROVM_KERNEL            guest vmlinux (default: build/kernel/vmlinux)
//	MICROVM_BZIMAGE           guest bzImage (default: build/kernel/bzImage)
//	MICROVM_BINARY            microvm binary (default: bin/microvm, made)
//	MICROVM_INITRD            guest initramfs (default:
//	                          build/linux/initramfs.cpio.gz, made)
//	MICROVM_QEMU              QEMU binary (default: qemu-system-x86_64)
//	MICROVM_CONFORMANCE_ACCEL tcg (default) or kvm
//	MICROVM_CONFORMANCE=off   skip the suite (make go-test sets it: make
//	                          conformance runs it)
//	CI=true                   missing prerequisites fail the suite
package conformance
