package namedvm

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/vms"
)

// TestRestoreRecord: restore --name's record is the snapshot's machine,
// with the agent and its port when its labels say so, the CID the command
// line gave over the snapshot's, and the disks given; a VM with the agent
// gets a MAC of its own for each saved network device, one without keeps
// the devices given; a bad port label is a failure, not a usage error.
func TestRestoreRecord(t *testing.T) {
	saved := microvm.Config{CPUs: 2, MemoryBytes: 512 << 20, Kernel: "/k", Initrd: "/i",
		Vsock: &microvm.VsockConfig{CID: 3}, Nets: []microvm.NetConfig{{User: true}}}
	agent := map[string]string{LabelAgent: "true", LabelAgentPort: "1024"}
	disks := []microvm.DiskConfig{{Path: "/d1"}}
	for _, tc := range []struct {
		name     string
		labels   map[string]string
		host     microvm.Config
		want     vms.Record
		wantNets int
	}{
		{"no agent", nil, microvm.Config{Disks: disks},
			vms.Record{Name: "r1", CPUs: 2, MemoryBytes: 512 << 20, Kernel: "/k", Initrd: "/i", Restored: "snap", VsockCID: 3, Disks: []string{"/d1"}}, 0},
		{"agent, own CID", agent, microvm.Config{Vsock: &microvm.VsockConfig{CID: 9}},
			vms.Record{Name: "r1", CPUs: 2, MemoryBytes: 512 << 20, Kernel: "/k", Initrd: "/i", Restored: "snap", VsockCID: 9, Agent: true, AgentPort: 1024}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, host, err := restoreRecord(RestoreRequest{Name: "r1", Dir: "snap", Host: tc.host}, microvm.SnapshotInfo{Config: saved, Labels: tc.labels})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, rec); diff != "" {
				t.Errorf("record (-want +got):\n%s", diff)
			}
			if len(host.Nets) != tc.wantNets || (tc.wantNets > 0 && host.Nets[0].MAC == nil) {
				t.Errorf("nets %+v; want %d with a MAC of its own", host.Nets, tc.wantNets)
			}
		})
	}
	_, _, err := restoreRecord(RestoreRequest{Name: "r1", Dir: "snap"}, microvm.SnapshotInfo{Config: saved, Labels: map[string]string{LabelAgent: "true", LabelAgentPort: "x"}})
	var fe FailedError
	if !errors.As(err, &fe) {
		t.Errorf("bad port label: %v; want a FailedError", err)
	}
}

// TestRestoreHost: the restored machine gets the VM's process's console,
// input, log and vsock socket, with the command line's CID; a snapshot's
// machine without vsock gets no socket.
func TestRestoreHost(t *testing.T) {
	var console bytes.Buffer
	own := microvm.Config{Console: &console, Vsock: &microvm.VsockConfig{UDSPath: "/state/vsock.sock"}}
	host := microvm.Config{Disks: []microvm.DiskConfig{{Path: "/d1"}}, Vsock: &microvm.VsockConfig{CID: 9}}
	h := restoreHost(host, own, true)
	if h.Console != &console || h.Vsock == nil || *h.Vsock != (microvm.VsockConfig{CID: 9, UDSPath: "/state/vsock.sock"}) || len(h.Disks) != 1 {
		t.Errorf("restoreHost = %+v (vsock %+v)", h, h.Vsock)
	}
	if host.Vsock.UDSPath != "" {
		t.Errorf("host's vsock changed: %+v", host.Vsock)
	}
	h = restoreHost(microvm.Config{}, own, true)
	if h.Vsock == nil || h.Vsock.CID != 0 || h.Vsock.UDSPath != "/state/vsock.sock" {
		t.Errorf("no CID given: vsock %+v; want the socket, the snapshot's CID (0)", h.Vsock)
	}
	if h = restoreHost(host, own, false); h.Vsock != host.Vsock {
		t.Errorf("no vsock in the snapshot: vsock %+v; want host's as given", h.Vsock)
	}
}

// TestRestoreMissingSnapshot: a directory that holds no snapshot is
// refused before any record exists.
func TestRestoreMissingSnapshot(t *testing.T) {
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	err := Restore(RestoreRequest{Name: "r1", Dir: t.TempDir()}, Options{})
	if err == nil {
		t.Fatal("Restore of an empty directory: nil error")
	}
	if list, lerr := List(); lerr != nil || len(list) != 0 {
		t.Errorf("VMs after the refusal: %v, %v; want none", list, lerr)
	}
}

// TestRestoreDetachedProcessRunsAfterTakeReady: restore --detach's
// detached process runs the VM rather than starting the command again,
// also once it has taken its ready descriptor (TakeReady unsets
// DetachFDEnv, so IsDetached no longer says so): each detached process
// would otherwise start another and wait on it, without end.
func TestRestoreDetachedProcessRunsAfterTakeReady(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, tc := range []struct {
		name   string
		detach bool
		env    string
		ready  *os.File
		want   bool
	}{
		{"no --detach", false, "", nil, false},
		{"the command run by the user", true, "", nil, true},
		{"the detached process, descriptor not yet taken", true, "3", nil, false},
		{"the detached process, descriptor taken", true, "", w, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(DetachFDEnv, tc.env)
			if got := startsDetached(RestoreRequest{Name: "r1", Detach: tc.detach}, Options{Ready: tc.ready}); got != tc.want {
				t.Errorf("startsDetached = %v, want %v", got, tc.want)
			}
		})
	}
}
