// Package conformance holds the end-to-end conformance suite of the
// vhost-user vsock backend (microvm vhost-user-vsock): a real Linux 6.1 guest
// (build/kernel/vmlinux from make kernel) runs under QEMU -M microvm with a
// vhost-user-vsock-device whose back-end is our binary in a separate process,
// and the guest's /init (guest/init) runs vsock scenarios that the tests
// drive and check from the host side.
//
// The package has no non-test code beyond this comment. The tests build
// what they need (bin/microvm, the guest /init and its initramfs) into a
// temporary directory. They skip with a message when the kernel or QEMU is
// missing, and fail instead when CI=true. See docs/vhost-user.md for what
// each test checks and how to run the suite.
//
// Environment:
//
//	MICROVM_KERNEL            guest kernel (default: build/kernel/vmlinux)
//	MICROVM_QEMU              QEMU binary (default: qemu-system-x86_64)
//	MICROVM_CONFORMANCE_ACCEL tcg (default) or kvm
//	MICROVM_CONFORMANCE=off   skip the suite (make go-test sets it: make
//	                          conformance runs it)
//	CI=true                   missing prerequisites fail the suite
package conformance
