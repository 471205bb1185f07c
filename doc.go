// Package microvm is the embedding API of the microvm virtual machine
// monitor: build a Config, create a Machine with New, Run it until the guest
// exits, Close it.
//
//	m, err := microvm.New(microvm.Config{Kernel: "bzImage", CPUs: 2, MemoryBytes: 256 << 20})
//	if err != nil { ... }
//	defer m.Close()
//	res, err := m.Run(ctx) // res.Status is what the microvm CLI exits with
//
// Data flow: New checks the Config (each device kind checks its own part),
// builds the machine floor (internal/vmm: the kernel checked,
// KVM's VM, guest memory, interrupt controllers, platform devices), then
// each device kind creates its devices and puts them in virtio-mmio slots
// in slot order (vsock, rng, disks, network devices), then the floor loads
// the kernel with the command line the kinds add to, and creates the vCPUs;
// last, with Config.MetricsSocket, it starts the metrics server. Run starts
// the vsock device's Unix socket accept loop and the vCPUs, and returns how
// the guest ended (Result).
//
// The device kinds: each kind of virtio device is one file (vsockdev.go,
// rng.go, disk.go, net.go, share.go) holding its config type and its
// entry of deviceKinds, all that New, Metrics and the CLI need to know
// about it: its checks, its construction, what it adds to the kernel
// command line, its metrics, and its command-line flags (DeviceFlags,
// which internal/clibase turns into the CLI's flags); devices.go is what
// the kinds share and walks them in slot order. The slot's interrupt, its
// virtio_mmio.device= entry and its ACPI description follow from the slot.
//
// Goroutines and ownership: the goroutine calling Run owns the Machine;
// internal/vmm's doc says which goroutines Run starts and how the first
// exit condition stops them. The Machine has no mutex of its own: its
// devices are fixed by New. Close stops the metrics server first (waiting
// for its handlers), then the floor's Close tears down the devices, in
// the reverse order of their creation (the vsock device before its Unix
// socket listener), then vCPUs, VM, guest memory and /dev/kvm.
//
// Metrics (metrics.go, docs/metrics.md): Machine.Metrics snapshots the
// counters, atomics bumped on the data paths: the floor's per vCPU, per
// bus and for the paravirtual waits; per virtio device, its transport's
// virtio.TransportStats and the device's own Stats. WritePrometheus writes
// a snapshot in the Prometheus text format; with Config.MetricsSocket, New
// starts a server of it (internal/metricsrv: an accept goroutine and one
// goroutine per client connection, each writing a snapshot); Close stops
// it first and waits for its goroutines, so no snapshot outlives Close.
// The server's mutex (guarding its closed flag and connections) is a
// leaf.
//
// In-process vsock (vsock.go): DialVsock hands one end of a socket pair
// to the vsock device on a short-lived goroutine of its own (it ends by the
// attempt's deadline, or when the device closes) and waits for the OK line
// on the other end in the caller's goroutine. ListenVsock registers a
// listener with the machine's vsockRouter, the device's Dialer: the
// device's dial goroutines look the port up under the router's mutex (a
// leaf lock guarding the port map) and queue a socket pair end on the
// listener's bounded channel, which Accept drains; ports without a listener
// go to "<uds>_<port>" (VsockConfig.UDSPath), or are refused without one.
// Close closes the router's listeners after the device.
//
// Waiting for a guest's agent (agent.go): WaitAgent, on the caller's
// goroutine, calls DialVsock until the guest accepts, backing off on a
// timer between refusals; the timer's select also watches the caller's
// ctx (with the timeout given) and runEnded, which Run closes when it
// returns, so a guest that ended is not waited for. A failure reads the
// vsock device's counters, DeviceStatuses and PeekVCPUs into its message.
// It returns a net.Conn: guest/agentapi's ConnectVM wraps it as the
// agent's gRPC client, so that this package links no gRPC.
//
// A clone's own MACs (clonemac.go): Restore records each network device
// its host Config gave a new MAC (MACChanges); AdoptMACs, on the caller's
// goroutine under macMu, passes each not yet applied to the caller's
// setter in device order and counts those it succeeded for, so repeated
// calls apply nothing twice. guest/agentapi's AdoptMACs supplies the
// agent's SetMAC as the setter, for the same reason as ConnectVM.
package microvm
