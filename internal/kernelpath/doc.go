// Package kernelpath owns where a program finds its default guest kernel:
// the directory of the running binary (bin/), the default kernel
// build/kernel/bzImage beside that directory (make kernel builds it
// there), and $MICROVM_KERNEL, which names another.
//
// Data flow: a caller passes the kernel it was given ("" for none), its
// getenv and the binary's directory (BinDir for the running binary; the
// containerd shim passes the directory of the path it was started by) to
// Choose, which returns the given kernel, else $MICROVM_KERNEL, else
// Default(binDir) marked as the default. CheckDefault then says, for a
// default that is missing, how to build it. The package imports only the
// standard library, so the lean CLI, the full CLI's exec and named VMs and
// the shim share it without linking one another's packages.
package kernelpath
