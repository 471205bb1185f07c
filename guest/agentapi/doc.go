// Package agentapi is the wire API of the microvm guest agent
// (guest/agent): the gRPC service in agent.proto, the Go code generated from
// it (agent.pb.go, agent_grpc.pb.go), and Client, a host-side helper that
// wires io.Reader/io.Writer to the streaming calls.
//
// # Data flow
//
// A host connects to the agent over vsock (or a Unix socket in tests) with
// Connect, which waits while the guest boots, and wraps the connection
// with NewClient. A program that runs the VM itself calls ConnectVM with
// its *microvm.Machine (the VM interface, so this package does not import
// the embedding API): the machine's WaitAgent does the waiting, gives up
// when the machine stops, and says how far the guest got; gRPC's later
// dials go through the machine's DialVsock. For a restored clone whose
// network devices have MACs of their own, AdoptMACs then has the agent take
// them: the machine (MACAdopter, Machine.AdoptMACs) hands each change not
// yet applied to Client.SetMAC.
//
//	Client.Exec: ExecStart -> agent forks the process in its own group
//	    Stdin (32 KiB chunks) -> ExecRequest.stdin -> process stdin pipe
//	    process stdout/stderr pipes -> ExecResponse.stdout/stderr -> Stdout/Stderr
//	    process exit -> ExecResponse.exit -> returned *ExitStatus
//	Client.PutFile: header, then Reader in 32 KiB chunks -> temp file -> rename
//	Client.GetFile: FileInfo, then 32 KiB chunks -> Writer
//
// Every direction is flow-controlled by HTTP/2: a slow reader blocks the
// writer on the other side instead of growing a buffer. The agent also
// serves the standard health service grpc.health.v1.Health; the service
// name of Agent is "microvm.agent.v1.Agent". docs/agent.md states the
// guarantees (what is killed when, limits, status codes).
//
// # Regenerating
//
// The generated files are committed. After editing agent.proto, run
// "go generate ./agentapi" with these tools on PATH:
//
//	apt-get install protobuf-compiler    # protoc (Debian 12: 3.21.12)
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
package agentapi

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative agent.proto
