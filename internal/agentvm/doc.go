// Package agentvm is the host side of a VM that runs microvm's guest
// agent (guest/agent): what microvm exec, run --name --with-agent, agent
// exec and cp, restore of an agent VM's snapshot and the CI executor do
// with such a VM, beside the machine itself (package microvm) and the
// agent's wire API (guest/agentapi).
//
// Data flow, for a command in a fresh or restored VM:
//
//	Machine.Run (the caller's goroutine; vmDone closes when it returns)
//	  -> Wait: agentapi.ConnectVM, whose Machine.WaitAgent dials again
//	     until the agent listens, the timeout passes or the VM ends (the
//	     same wait as the Go API's embedders, examples/cijob and a Pool's
//	     Ready use)
//	  -> agentapi.AdoptMACs (Machine.AdoptMACs with the agent's SetMAC,
//	     as embedders call it): a restored clone's agent takes the
//	     clone's own MACs (CloneNets drew them for Restore)
//	  -> Supervise: the agent call runs in a context that ends when the VM
//	     does (ErrVMEnded) or when the guest outlives the command's limit
//	     (UnresponsiveError)
//	  -> End: how the VM ended, for messages
//
// and the call itself, in a fresh VM or a running one (RunCommand; Exec
// dials a running VM's Addr first, for agent exec): the
// host terminal opened when the command has a pty (Command.OpenTTY) ->
// agentapi.Client.Exec streams stdin, stdout and stderr -> the caller's
// signal status first (Command.Interrupted) -> the end as a shell's
// status: ShellStatus of the exit status, StatusNotFound and
// StatusCannotRun for what the guest could not run (one note on stderr
// each, as for a --timeout kill), a *CommandError when the agent or its
// VM failed;
//
// and for a copy into or out of a running VM (Copy): the host side is
// opened first, then Addr dials the agent through the VM's hybrid-vsock
// socket, and PutFile/GetFile (a file) or PutTree/GetTree (a directory
// tree, as tar through internal/dirtar) carry the bytes; GuestError and
// HostSideError tell which side a failure was on.
//
// Goroutines: Supervise starts one that ends when it returns; Copy's tree transfers run one producer or consumer of the tar
// stream that ends with the transfer. TailBuffer is safe from any
// goroutine.
package agentvm
