// Package execvm is microvm exec's VM: boot a VM from a kernel and the
// guest agent's image (or restore a clone of an exec snapshot, the warm
// start), wait for its agent, run one command in it supervised against the
// VM's end and an unresponsive guest, and end the VM. The pieces are
// internal/agentvm's; this package composes them with the machine's
// construction. What only the command line has (the progress line, the
// signals, --chroot and the seccomp filter, the terminal, how the command
// runs through the agent and its exit statuses) comes in as Options' hooks.
//
// Data flow (Run):
//
//	Options.Config (+ the agent's initramfs, written to a temporary file
//	that is removed once New has loaded it; none with a root disk)
//	  -> microvm.New, or with a WarmStart holding a snapshot,
//	     microvm.Restore of a clone (agentvm.CloneNets draws its MACs)
//	  -> Hooks.Interruptible, Hooks.Confine, then Machine.Run in a goroutine
//	  -> agentvm.Wait; a WarmStart without a snapshot saves one now
//	     (Machine.Snapshot, labelled with the machine's key) and waits again
//	  -> agentapi.AdoptMACs
//	  -> agentvm.Supervise(Hooks.Command): the command's own error is
//	     returned as it is; the VM's end or an unresponsive guest becomes
//	     an error with the guest console's tail (agentvm.TailBuffer)
//
// Defaults (defaults.go), shared with named VMs that boot the agent (the
// kernel is internal/kernelpath's: --kernel, else $MICROVM_KERNEL, else
// build/kernel/bzImage beside bin/): AgentCmdline is the kernel
// command line, WithInit adds init=/init for a root disk; CID is the
// guest's vsock CID.
//
// CheckWarmStart reads an exec snapshot directory and computes the key
// (a digest of what shapes the machine) that it must carry.
//
// Goroutines: Run starts the one running the machine, which ends before
// Run returns, and Supervise's.
package execvm
