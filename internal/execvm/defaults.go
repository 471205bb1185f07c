package execvm

import "strings"

// The defaults that exec's VMs and named VMs booted with the agent share.
const (
	// CID is the guest's vsock CID: exec's always, a named VM's unless
	// --vsock-cid chose another.
	CID = 3
	// AgentCmdline is the kernel command line of a VM that boots the
	// agent image when none is given.
	AgentCmdline = "console=ttyS0 reboot=k panic=-1 quiet"
)

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
