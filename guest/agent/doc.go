// Package agent is the guest agent's server: it implements
// agentapi.AgentServer (Exec, PutFile, GetFile, Info, Shutdown) and the
// standard grpc.health.v1 service on any net.Listener. The microvm-agent
// command (cmd/microvm-agent) serves it on vsock inside a guest; tests serve
// it on Unix sockets. It runs on Linux only. docs/agent.md states the API's
// guarantees.
//
// # Data flow of an Exec
//
//	client ExecStart -> validateStart -> pipes (or a pty) -> starter.start:
//	    fork+exec in a new process group (pgid = pid), or a new session
//	    with a pty
//	client stdin chunks -> receiver goroutine -> stdin pipe (blocking write:
//	    HTTP/2 flow control pushes back on the client)
//	stdout/stderr pipes -> one reader goroutine each -> 32 KiB chunks ->
//	    stream.Send (serialized; blocks while the client does not read, so
//	    the process blocks on a full pipe: nothing is buffered unbounded)
//	leader exits -> beforeReap (zombie still holds the pgid): SIGKILL to the
//	    rest of the group -> reap -> readers drain to EOF (bounded by
//	    drainTimeout) -> ExitStatus -> end of call
//
// Timeout and the end of the call (client cancel, broken connection, Stop)
// send SIGKILL to the process group at once, without a SIGTERM grace: the
// client can send a signal message itself first if it wants a grace period.
//
// # Containers
//
// An ExecStart with a container forks the agent's own binary as
// ContainerInitArg0 (startInContainer, container.go) with the request on
// a memfd. Creating: in new mount, PID, UTS and IPC namespaces; the step
// (ContainerInit, containerinit.go) binds the root, makes the mounts,
// pivot_roots, sets the hostname, then the process's rlimits, capabilities
// and credentials, and execs the program, which keeps the pid. Joining:
// the agent enters the init's PID, UTS and IPC namespaces on a locked
// thread it then throws away, forks the step there with the init's root as
// a descriptor, and the step chroots to it. containers maps ids to their
// init's pid; the init's beforeReap forgets it.
//
// # Waiting for children
//
// Exit statuses must reach the Exec that started the process, and as PID 1
// every other zombie must be reaped too. Both starters fork with
// syscall.ForkExec (not os/exec, whose Wait would race with a reaper) and
// wait with waitid(WNOWAIT) first, so beforeReap can signal the group while
// its id cannot be reused: directStarter waits for its own pids only;
// Reaper (PID 1) waits for all children, dispatching by pid under a lock
// that start holds from fork to registration.
//
// # Goroutines and locks
//
// Server: gRPC runs each call on its own goroutine; Exec owns its reader and
// receiver goroutines (see Exec). directStarter owns one waiting goroutine
// per child, ending when it exits. Reaper owns one goroutine, stopped by
// Close.
//
// Lock order: Reaper.mu, then containers.mu and group.mu (taken by
// beforeReap under Reaper.mu). Server.mu guards the count of running Execs only and is never
// held with another lock.
package agent
