package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testing/testenv"
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

// TestNamedAgentSnapshot: a named Linux VM with the agent writes a file,
// is snapshotted with --stop, and restore --name --detach brings it back
// as another named VM: it returns once the restored agent answers (the
// snapshot's labels say the VM had one), exec --vm reads the file written
// before the snapshot and the bytes written to a copy-on-write disk (its
// overlay saved in the snapshot; the image untouched), eth0 has the
// clone's own MAC address (the agent took it), the guest's clock
// keeps its offset from the host's although seconds passed since the
// save, and stop powers it off through the agent. Linux: natively on
// hardware KVM, otherwise in the nested-KVM box.
func TestNamedAgentSnapshot(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	t.Setenv(microvm.EnvNetHelper, testenv.NetHelper(t)) // --net user in this test binary's VMs
	n := newNamedCLI(t)
	// A copy-on-write disk (zeros) the guest writes to before the
	// snapshot: the snapshot carries the overlay, the image stays zeros.
	disk := filepath.Join(t.TempDir(), "data.img")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	n.mustRun("run", "--name", "t1", "--detach", "--with-agent", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
		"--memory", "256M", "--disk", "path="+disk+",cow", "--net", "user")
	macBefore := n.mustRun("exec", "--vm", "t1", "--", "cat", "/sys/class/net/eth0/address")
	n.mustRun("exec", "--vm", "t1", "--", "sh", "-c", "echo written before the snapshot > /tmp/state; sync; "+
		"printf 'written to the disk' | dd of=/dev/vda bs=512 seek=9 conv=fsync 2>/dev/null")
	before := guestClockOffset(t, n, "t1")
	snap := filepath.Join(n.state, "snap")
	n.mustRun("snapshot", "--stop", "--out", snap, "t1")
	time.Sleep(5 * time.Second) // a clock not moved on by the restore would be this far behind
	start := time.Now()
	n.mustRun("restore", "--name", "t2", "--detach", "--net", "user", "--disk", disk, snap)
	t.Logf("restore --detach returned, the agent answering, after %v", time.Since(start).Round(time.Millisecond))
	if out := n.mustRun("exec", "--vm", "t2", "--", "cat", "/tmp/state"); out != "written before the snapshot\n" {
		t.Errorf("the restored VM's /tmp/state: %q", out)
	}
	// The restore is a clone with a MAC of its own, which its agent took.
	if macAfter := n.mustRun("exec", "--vm", "t2", "--", "cat", "/sys/class/net/eth0/address"); macAfter == macBefore || len(macAfter) != 18 {
		t.Errorf("the restored VM's eth0 address %q; want a new one (the snapshot's was %q)", macAfter, macBefore)
	}
	// Read from the device, not the page cache the memory snapshot kept.
	if out := n.mustRun("exec", "--vm", "t2", "--", "sh", "-c",
		"echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=512 skip=9 count=1 2>/dev/null | head -c 19"); out != "written to the disk" {
		t.Errorf("the restored VM's disk at sector 9: %q; want what the guest wrote before the snapshot", out)
	}
	if b, err := os.ReadFile(disk); err != nil || !bytes.Equal(b, make([]byte, 1<<20)) {
		t.Errorf("the copy-on-write disk's image changed (%v)", err)
	}
	// The restore moved the clock on by the time since the save: the
	// guest is as far from the host's clock as before (a guest under TCG
	// in the box drifts from its host by itself, so the offset before the
	// snapshot, not zero, is the reference).
	after := guestClockOffset(t, n, "t2")
	t.Logf("the guest's clock minus the host's: %.1f s before the snapshot, %.1f s after the restore", before.off, after.off)
	if d, tol := after.off-before.off, 1.5+before.err+after.err; d < -tol || d > tol {
		t.Errorf("the restored guest's clock moved %.1f s against the host's (tolerance %.1f s); a clock not moved on by the restore would be more than 5 s behind", d, tol)
	}
	n.mustRun("stop", "--timeout", "60s", "t2")
	r, _ := n.record("t2")
	if r.State != vms.StateExited || r.ExitStatus != 0 || !strings.Contains(r.ExitReason, "power-off") {
		t.Errorf("after stop: %+v; want exited 0 by the guest's power-off", r)
	}
}

// clockOffset is a guest's wall clock minus the host's, in seconds, give
// or take err.
type clockOffset struct{ off, err float64 }

// guestClockOffset reads the named VM's clock (date +%s, whole seconds)
// against the host's around the exec.
func guestClockOffset(t *testing.T, n *namedCLI, vm string) clockOffset {
	t.Helper()
	before := time.Now()
	out := n.mustRun("exec", "--vm", vm, "--", "date", "+%s")
	after := time.Now()
	secs, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("%s: date: %q: %v", vm, out, err)
	}
	mid := float64(before.UnixNano()+after.UnixNano()) / 2e9
	// date truncates to the second: the clock read was in [secs, secs+1).
	return clockOffset{off: float64(secs) + 0.5 - mid, err: 0.5 + after.Sub(before).Seconds()/2}
}
