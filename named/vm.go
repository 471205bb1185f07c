package named

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/vmctl"
	"github.com/microvm/microvm/internal/vms"
	"github.com/microvm/microvm/vsock/hybrid"
)

// VM is a running or ended named VM.
type VM struct {
	// Name is the VM's name; Dir its state directory.
	Name, Dir string
	// State is "starting", "running", "paused", "stopping" or "exited";
	// Alive says its process runs.
	State string
	Alive bool
	PID   int
	// CPUs, MemoryBytes and Kernel are its configuration; Agent says the
	// guest runs microvm's agent (on AgentPort).
	CPUs        int
	MemoryBytes uint64
	Kernel      string
	Agent       bool
	AgentPort   uint32
	Created     time.Time
	// ExitStatus and ExitReason tell how an exited VM ended.
	ExitStatus int
	ExitReason string
}

// StateDir is where named VMs (and the images of package images) are kept:
// $MICROVM_STATE_DIR, else /var/lib/microvm for root, else
// $XDG_DATA_HOME/microvm.
func StateDir() string { return vms.StateDir() }

func vmOf(e vms.Entry) VM {
	return VM{Name: e.Name, Dir: e.Dir, State: e.State, Alive: e.Alive, PID: e.PID, CPUs: e.CPUs,
		MemoryBytes: e.MemoryBytes, Kernel: e.Kernel, Agent: e.Agent, AgentPort: e.AgentPort, Created: e.Created,
		ExitStatus: e.ExitStatus, ExitReason: e.ExitReason}
}

// List returns the named VMs under StateDir, by name, each in the
// state its record and its lock tell (a VM whose process died reads as
// exited).
func List() ([]VM, error) {
	s, err := vms.Open(vms.StateDir())
	if err != nil {
		return nil, err
	}
	list, err := s.List()
	if err != nil {
		return nil, err
	}
	out := make([]VM, 0, len(list))
	for _, e := range list {
		out = append(out, vmOf(e))
	}
	return out, nil
}

// Lookup returns the named VM name. Its State is the live one,
// from its control API, when it runs.
func Lookup(ctx context.Context, name string) (VM, error) {
	s, err := vms.Open(vms.StateDir())
	if err != nil {
		return VM{}, err
	}
	e, err := s.Get(name)
	if err != nil {
		return VM{}, err
	}
	v := vmOf(e)
	if v.Alive {
		c := v.client()
		defer c.Close()
		if info, err := c.Info(ctx); err == nil {
			v.State = info.State
		}
	}
	return v, nil
}

func (v VM) client() *vmctl.Client {
	return vmctl.NewClient(filepath.Join(v.Dir, vms.APISocket))
}

func (v VM) setState(ctx context.Context, req vmctl.StateRequest) error {
	if !v.Alive {
		return fmt.Errorf("VM %s: %w", v.Name, microvm.ErrNotRunning)
	}
	c := v.client()
	defer c.Close()
	if err := c.SetState(ctx, req); err != nil {
		return fmt.Errorf("VM %s: %w", v.Name, err)
	}
	return nil
}

// Pause holds the VM's vCPUs (PUT /vm/state paused).
func (v VM) Pause(ctx context.Context) error {
	return v.setState(ctx, vmctl.StateRequest{State: vmctl.Paused})
}

// Resume lets a paused VM run.
func (v VM) Resume(ctx context.Context) error {
	return v.setState(ctx, vmctl.StateRequest{State: vmctl.Running})
}

// Stop asks the VM to stop: with force, at once; otherwise its agent powers
// the guest off, and the VM is stopped after timeout if the guest has not
// ended by then (at once without an agent). It returns once the stop has
// begun; Lookup tells when the VM has exited.
func (v VM) Stop(ctx context.Context, force bool, timeout time.Duration) error {
	return v.setState(ctx, vmctl.StateRequest{State: vmctl.Stopped, Force: force, TimeoutMS: timeout.Milliseconds()})
}

// Snapshot saves the VM into dir, a path that must not exist (or hold a
// snapshot, with o.Overwrite), through its control API (PUT /vm/snapshot):
// the VM's own process writes it, and it goes on afterwards, or ends with
// o.Stop. microvm.Restore runs the snapshot (docs/snapshot.md).
func (v VM) Snapshot(ctx context.Context, dir string, o microvm.SnapshotOptions) error {
	if !v.Alive {
		return fmt.Errorf("VM %s: %w", v.Name, microvm.ErrNotRunning)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("VM %s: snapshot %s: %w", v.Name, dir, err)
	}
	c := v.client()
	defer c.Close()
	if err := c.Snapshot(ctx, vmctl.SnapshotRequest{Path: abs, Stop: o.Stop, Overwrite: o.Overwrite, Diff: o.Diff}); err != nil {
		return fmt.Errorf("VM %s: %w", v.Name, err)
	}
	return nil
}

// WriteMetrics writes the VM's counters in the Prometheus text format
// (GET /metrics).
func (v VM) WriteMetrics(ctx context.Context, w io.Writer) error {
	if !v.Alive {
		return fmt.Errorf("VM %s: %w", v.Name, microvm.ErrNotRunning)
	}
	c := v.client()
	defer c.Close()
	return c.Metrics(ctx, w)
}

// DialVsock connects to guest port port through the VM's vsock socket
// (hybrid.Dial: "CONNECT port", then the guest's stream). A caller of the
// agent passes it to agentapi.Connect.
func (v VM) DialVsock(ctx context.Context, port uint32) (net.Conn, error) {
	return hybrid.Dial(ctx, filepath.Join(v.Dir, vms.VsockSocket), port)
}
