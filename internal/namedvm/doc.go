// Package namedvm is the process of a named VM (`microvm run --name NAME`,
// `restore --name`) and its client side beyond package named's VM:
// starting one detached (run --detach), stopping one for good (the API, then its process), removing them (Remove), listing
// them with a running VM's own view of its state, looking a running one
// up (and its agent's address: Agent, for cp), and running a command in
// one (Exec, exec --vm).
//
// Data flow of the process (Run): vms.Store.Create takes the name (the
// record and the lock in the state directory) -> Launch.Build makes the
// machine with the state directory's vsock socket and the console log ->
// vmctl.Serve answers the control API through backend (info, metrics,
// pause, resume, stop, snapshot) -> Machine.Run until the guest ends, the
// API stops it, or the caller's context is cancelled -> the record says
// how it ended. With the agent, a detached process reports ready once the
// agent answers (and a restored clone's agent took its MACs:
// agentapi.AdoptMACs); a Launch.Setup (run --docker: Docker started in
// the guest) runs through the agent once it answers (backend.runSetup),
// before the main process and before a detached VM reports ready, and
// stops the VM when it fails (SetupError, with the status of the step that
// failed: stepStatus); an image VM's main process runs
// through the agent (backend.runMain), then, when it ended 0, the
// Launch.AfterMain (run --cache: the caches unmounted, written back), and
// the VM powers off.
//
// Data flow of run --name's boot (Boot, boot.go), in the process that
// will own the VM: the CLI's BootRequest (flags as plain data) ->
// prepareBoot adds run --docker's data disk (DockerDiskPath, in the state
// directory) to the configuration, then checks the caches out into it
// (CheckoutCaches; a failure is told on Options.Ready) -> bootLaunch makes
// the Launch: the record (vms.Record, with ImageDefaults for exec --vm),
// images.Use for --image, and a Build that writes the agent image to a
// temporary initrd -> dockerLaunch makes the disk at Build and starts
// Docker as the Setup; WithCaches mounts the caches before it -> Run ->
// FinishCaches -> a state directory without sockets is said as such. The
// CLI maps the typed errors (SetupError, ExitError, FailedError) to exit
// statuses.
//
// Data flow of restore --name (Restore, restore.go): the CLI's
// RestoreRequest -> microvm.ReadSnapshot -> restoreRecord makes the record
// from the snapshot's machine and labels (LabelAgent, LabelAgentPort) and
// the host resources given, with new MACs for a clone that has the agent
// -> microvm.CheckRestore refuses host resources the command line did not
// give, before any record or detached process exists -> StartDetached
// (restore --detach), else Run with a Build that restores the snapshot
// with what the VM's process owns (restoreHost).
//
// Data flow of a detached start (run --detach, restore --detach;
// detach.go, both ends of the ready line): StartDetached starts the same
// command again (os.Args through os.Executable) in a session of its own,
// its standard streams on /dev/null and a pipe's write end as descriptor
// 3, named by DetachFDEnv -> in that process IsDetached is true, TakeReady
// hands the descriptor to Options.Ready, and Run writes "ready" once the
// VM runs (its agent answering, its setup done, when it has them) or its
// failure (ReadyError: "error STATUS: MESSAGE" for a SetupError, else
// "error: MESSAGE"); a failure before Run (Boot's checkout of the caches)
// is written on Options.Ready the same way ->
// StartDetached reads the line (parseReadyLine) and returns nil, a
// SetupError or a FailedError; a process that ends without a line, or has
// none after 30 s more than the caller's wait (it is killed), is a
// FailedError naming its diagnostics file (vms.LogFile).
//
// Data flow of a named VM's caches (run --cache, caches.go), all in the
// process that owns the VM: CheckoutCaches opens the store
// (cachedisk.OpenDir) and clones each cache into a disk of the VM's
// config (execvm.AttachCaches) before the Launch is built -> WithCaches
// wraps the Launch: its Setup mounts them through the agent before the
// launch's own setup and gives their top directories to a main process
// that is not root (chownCaches), a failure there being a step of its own
// (withStep: the status WithCaches was given, never Docker's), its
// AfterMain unmounts them once the
// main process ended 0 -> Run -> FinishCaches commits them when the VM
// ended with status 0 after the unmount, else discards them with one
// warning naming them and why.
//
// An image's command (exec --image's, and the main process of run
// --image: BootRequest.Main) is ImageProcess: docker run's rules joining
// the image's Entrypoint, Cmd, environment, directory and user with the
// caller's arguments, variables and directory; WithDefaults is the part
// of it that a later exec --vm applies from the record.
//
// Data flow of a command in a running VM (Exec): Live finds the VM's
// record -> WithDefaults completes the caller's command with the image's
// defaults the record keeps (vms.Process: environment, directory, user;
// agentvm.BaseEnv and / without an image) -> AgentAddr dials the agent
// through the VM's vsock socket -> agentvm.RunCommand runs the command and
// returns its status.
//
// Goroutines of the process: Run's caller owns the machine and the lease;
// Run's goroutine for Machine.Run runs the vCPUs; the control API's server
// goroutines call the backend, whose methods only read counters, pause
// and resume, or cancel the run's context (stop), all safe from any
// goroutine; the setup, the main process and a foreground clone's MAC
// adoption each have a goroutine that ends with the VM (the setup's
// publishes its end by closing setupRun.done before it stops the VM).
package namedvm
