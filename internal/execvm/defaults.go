package execvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The defaults that exec's VMs and named VMs booted with the agent share.
const (
	// CID is the guest's vsock CID: exec's always, a named VM's unless
	// --vsock-cid chose another.
	CID = 3
	// AgentCmdline is the kernel command line of a VM that boots the
	// agent image when none is given.
	AgentCmdline = "console=ttyS0 reboot=k panic=-1 quiet"
	// KernelEnv names the variable that gives the kernel when no --kernel
	// does.
	KernelEnv = "MICROVM_KERNEL"
)

// DefaultKernelPath is the kernel booted without --kernel or
// $MICROVM_KERNEL: build/kernel/bzImage beside the running binary's
// directory, bin/ (make kernel builds it there).
func DefaultKernelPath() string {
	exe, _ := os.Executable()
	return filepath.Clean(filepath.Join(filepath.Dir(exe), "..", "build", "kernel", "bzImage"))
}

// Kernel is the kernel to boot: given (--kernel) when not "", else
// $MICROVM_KERNEL when set, else DefaultKernelPath, with isDefault true.
// Only the default is checked for (CheckDefaultKernel): a kernel the user
// named fails where it is opened, with its own path.
func Kernel(given string) (path string, isDefault bool) {
	if given != "" {
		return given, false
	}
	if env := os.Getenv(KernelEnv); env != "" {
		return env, false
	}
	return DefaultKernelPath(), true
}

// CheckDefaultKernel says, when the default kernel path is not there,
// that it was the default and how to build it: a user who named no
// kernel would otherwise see only a path beside the binary.
func CheckDefaultKernel(path string) error {
	if _, err := os.Stat(path); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the message names the path already
		}
		return fmt.Errorf("kernel %s: %w (no --kernel and no $%s, so this is the default: build it with make kernel, or give one)",
			path, err, KernelEnv)
	}
	return nil
}

// WithInit adds init=/init to cmdline unless it names an init= of its
// own: a root disk (--root) holds the agent as /init, which the kernel
// would not look for there. Only the init= parameter counts: rdinit=
// names the initramfs's program, not the root disk's.
func WithInit(cmdline string) string {
	fields := strings.Fields(cmdline)
	for i, f := range fields {
		if f == "--" {
			// What follows is init's own arguments: the kernel's
			// parameter goes before it.
			return strings.Join(append(append(fields[:i:i], "init=/init"), fields[i:]...), " ")
		}
		if strings.HasPrefix(f, "init=") {
			return cmdline
		}
	}
	return strings.TrimSpace(cmdline + " init=/init")
}
