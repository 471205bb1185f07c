package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// TestNamedSnapshotRestore: a named VM (the echo test guest, under its
// seccomp filter, tracking dirty pages) is snapshotted through its control
// API and goes on serving; a second snapshot into the same directory is
// refused without --overwrite; a diff snapshot with --stop ends the VM;
// restore --name --detach runs the diff (over its base) as a named VM that
// serves an echo and exits 0 when the guest does; microvm restore runs the
// full snapshot in the foreground with its own vsock socket and CID, and
// serves an echo too.
func TestNamedSnapshotRestore(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	n := newNamedCLI(t)
	n.mustRun("run", "--name", "t1", "--detach", "--kernel", guest, "--memory", "64M", "--track-dirty-pages",
		"--cmdline", fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", namedTestPort))
	n.waitListening("t1")
	snap := filepath.Join(n.state, "snap")
	n.mustRun("snapshot", "--out", snap, "t1")
	if r, _ := n.record("t1"); r.State != vms.StateRunning {
		t.Errorf("state %q after a snapshot; want running", r.State)
	}
	status, _, stderr := n.run("snapshot", "--out", snap, "t1")
	if status == 0 || !strings.Contains(stderr, "exists") {
		t.Errorf("a second snapshot into %s: status %d, stderr %q; want a refusal", snap, status, stderr)
	}
	n.mustRun("snapshot", "--overwrite", "--out", snap, "t1")
	diff := filepath.Join(n.state, "diff")
	n.mustRun("snapshot", "--diff", "--stop", "--out", diff, "t1")
	deadline := time.Now().Add(20 * time.Second)
	for r, _ := n.record("t1"); r.State != vms.StateExited; r, _ = n.record("t1") {
		if time.Now().After(deadline) {
			t.Fatalf("t1 still %s after snapshot --stop", r.State)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A named, detached restore: listed with its snapshot, reached
	// through its own state directory's socket, stopped by name. The
	// test guest's echo mode serves one connection and then exits.
	n.mustRun("restore", "--name", "t2", "--detach", "--vsock-cid", "10", diff)
	if r, ok := n.record("t2"); !ok || r.State != vms.StateRunning || r.Restored != diff || r.VsockCID != 10 {
		t.Errorf("the restored named VM's record: %+v (listed: %v); want running, restored from %s, CID 10", r, ok, diff)
	}
	status, _, stderr = n.run("restore", "--name", "t2", snap)
	if status == 0 || !strings.Contains(stderr, "t2") {
		t.Errorf("a second VM named t2: status %d, stderr %q; want a refusal naming it", status, stderr)
	}
	c, _, err := testenv.VsockConnect(filepath.Join(n.state, "vms", "t2", vms.VsockSocket), namedTestPort, 30*time.Second)
	if err != nil {
		t.Fatalf("connect to the restored named VM: %v; its log:\n%s", err, n.mustRun("logs", "t2"))
	}
	echoLine(t, c, "through the restored named VM\n")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r, _ := n.record("t2")
		if r.State == vms.StateExited {
			if r.ExitStatus != 0 {
				t.Errorf("the restored named VM exited with %d (%s)", r.ExitStatus, r.ExitReason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restored named VM still %s after its one connection", r.State)
		}
	}

	// The restore in the foreground, as a user runs it.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	uds := filepath.Join(n.state, "r.sock")
	cmd := exec.Command(exe, "restore", "--vsock-uds", uds, "--vsock-cid", "9", snap)
	cmd.Env = append(os.Environ(), envAsCLI+"=1", "MICROVM_STATE_DIR="+n.state)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	done := make(chan struct{}) // closed once waitErr is set
	go func() {
		waitErr = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(uds); err == nil {
			break
		}
	}
	c, _, err = testenv.VsockConnect(uds, namedTestPort, 30*time.Second)
	if err != nil {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
			t.Fatalf("connect to the restored VM: %v; restore ended (%v); stderr:\n%s", err, waitErr, errOut.String())
		case <-time.After(10 * time.Second):
			t.Fatalf("connect to the restored VM: %v; restore does not end on SIGINT", err)
		}
	}
	echoLine(t, c, "through the restored VM\n")
	select {
	case <-done:
		if waitErr != nil {
			t.Errorf("restore ended with %v; stderr:\n%s", waitErr, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the restored guest did not end after its one connection; stderr:\n%s", errOut.String())
	}
}
