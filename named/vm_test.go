package named

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/vmctl"
	"github.com/microvm/microvm/internal/vms"
)

// recordingVM is a control API backend that records the states asked.
type recordingVM struct {
	snaps []vmctl.SnapshotRequest
	mu    sync.Mutex
	asked []vmctl.StateRequest
}

func (r *recordingVM) Info() vmctl.VMInfo { return vmctl.VMInfo{Name: "g1", State: "paused"} }
func (r *recordingVM) SetState(_ context.Context, req vmctl.StateRequest) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, req)
	return nil
}
func (r *recordingVM) Snapshot(_ context.Context, req vmctl.SnapshotRequest) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snaps = append(r.snaps, req)
	return nil
}
func (r *recordingVM) WriteMetrics(w io.Writer) error {
	_, err := io.WriteString(w, "m 1\n")
	return err
}

// TestClient: the Go API finds a named VM by its record and lock,
// reads its live state from its control API, and sends it state changes;
// an exited VM refuses them with ErrNotRunning.
func TestClient(t *testing.T) {
	state, err := os.MkdirTemp("", "mvn")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	t.Setenv("MICROVM_STATE_DIR", state)
	store, err := vms.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := store.Create(vms.Record{Name: "g1", CPUs: 2, Agent: true, AgentPort: 1024})
	if err != nil {
		t.Fatal(err)
	}
	be := &recordingVM{}
	l := logrus.New()
	l.SetOutput(io.Discard)
	srv, err := vmctl.Serve(lease.Path(vms.APISocket), be, l)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := Lookup(ctx, "g1")
	if err != nil || !v.Alive || v.State != "paused" || v.CPUs != 2 || !v.Agent {
		t.Fatalf("Lookup: %+v, %v", v, err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Stop(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	if err := v.Snapshot(ctx, "rel/snap", microvm.SnapshotOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	be.mu.Lock()
	if want := filepath.Join(wd, "rel/snap"); len(be.snaps) != 1 || be.snaps[0].Path != want || !be.snaps[0].Stop {
		t.Errorf("snapshots asked: %+v; want one to %s with stop", be.snaps, want)
	}
	be.mu.Unlock()
	var m strings.Builder
	if err := v.WriteMetrics(ctx, &m); err != nil || m.String() != "m 1\n" {
		t.Errorf("WriteMetrics: %q, %v", m.String(), err)
	}
	be.mu.Lock()
	if len(be.asked) != 2 || be.asked[0].State != vmctl.Running || be.asked[1].State != vmctl.Stopped {
		t.Errorf("the VM was asked %+v", be.asked)
	}
	be.mu.Unlock()
	srv.Close()
	lease.Release()
	list, err := List()
	if err != nil || len(list) != 1 || list[0].Alive || list[0].State != vms.StateExited {
		t.Fatalf("List after its process let go: %+v, %v", list, err)
	}
	if err := list[0].Pause(ctx); !errors.Is(err, microvm.ErrNotRunning) {
		t.Errorf("Pause of an exited VM: %v, want ErrNotRunning", err)
	}
	if err := list[0].Snapshot(ctx, "/tmp/s", microvm.SnapshotOptions{}); !errors.Is(err, microvm.ErrNotRunning) {
		t.Errorf("Snapshot of an exited VM: %v, want ErrNotRunning", err)
	}
}
