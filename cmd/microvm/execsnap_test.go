package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testenv"
)

// TestExecSnapshotUsage: what exec --snapshot cannot do yet is a usage
// error, before anything boots (no KVM needed).
func TestExecSnapshotUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--disk", "path=/etc/hostname"}, "give it readonly or cow"},
		{[]string{"--net", "user"}, "not with network devices"},
		{[]string{"--share", "tag=t,path=/tmp"}, "not with shared directories"},
	} {
		args := append([]string{"exec", "--kernel", "/no/kernel", "--snapshot", dir}, tc.args...)
		status, stdout, stderr := runMain(t, append(args, "--", "true")...)
		if status != 2 || stdout != "" {
			t.Errorf("%q: status %d, stdout %q; want 2 and nothing", tc.args, status, stdout)
		}
		oneLine(t, "stderr", stderr, tc.want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused exec --snapshot left %s: %v", dir, err)
	}
	// A directory that holds something else is not taken for a snapshot.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "x"), nil, 0o600)
	status, _, stderr := runMain(t, "exec", "--kernel", "/etc/hostname", "--agent", "/etc/hostname", "--snapshot", other, "--", "true")
	if status != statusFailure {
		t.Errorf("exec --snapshot of a directory that is no snapshot: status %d; want %d", status, statusFailure)
	}
	oneLine(t, "stderr", stderr, other)
}

// TestExecSnapshot: the first exec --snapshot boots, snapshots the VM
// once its agent answers and runs the command; later ones run in clones
// of that snapshot: they do not see what an earlier command wrote (the
// snapshot was taken before it ran, and a clone's writes stay its own),
// their clock is the host's (moved on past the save), and an exec whose
// machine flags differ is refused.
func TestExecSnapshot(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	dir := filepath.Join(t.TempDir(), "warm")
	base := []string{"exec", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t), "--memory", "256M", "--snapshot", dir}
	run := func(args ...string) (int, string, string, time.Duration) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		start := time.Now()
		status := Main(append(append([]string{"microvm"}, base...), args...), nil, &stdout, &stderr)
		return status, stdout.String(), stderr.String(), time.Since(start)
	}
	status, stdout, stderr, cold := run("--", "sh", "-c", "echo first > /tmp/marker; echo made")
	if status != 0 || stdout != "made\n" {
		t.Fatalf("first exec: status %d, stdout %q, stderr %q", status, stdout, stderr)
	}
	info, err := microvm.ReadSnapshot(dir)
	if err != nil || info.Labels[labelExecKey] == "" {
		t.Fatalf("the first exec's snapshot: %+v, %v; want one with its key", info.Labels, err)
	}
	// Let time pass between the save and the restores, so that a clock
	// not moved on by it shows.
	time.Sleep(3 * time.Second)
	for i := range 2 {
		before := time.Now()
		status, stdout, stderr, warm := run("--", "sh", "-c", "test -e /tmp/marker && echo dirty || echo clean; date +%s")
		after := time.Now()
		lines := strings.Fields(stdout)
		if status != 0 || len(lines) != 2 || lines[0] != "clean" {
			t.Fatalf("clone %d: status %d, stdout %q, stderr %q; want clean and the date", i, status, stdout, stderr)
		}
		secs, err := strconv.ParseInt(lines[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if secs < before.Unix()-1 || secs > after.Unix()+1 {
			t.Errorf("clone %d: the guest's clock says %d; the host's was %d..%d", i, secs, before.Unix(), after.Unix())
		}
		t.Logf("clone %d: exec took %v (the cold one, boot and snapshot included, %v)", i, warm.Round(time.Millisecond), cold.Round(time.Millisecond))
	}
	status, _, stderr, _ = run("--cpus", "2", "--", "true")
	if status != statusFailure {
		t.Errorf("exec --snapshot with another --cpus: status %d; want %d", status, statusFailure)
	}
	oneLine(t, "stderr", stderr, "made for another kernel, machine or agent image")
}
