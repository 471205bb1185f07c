package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/internal/testing/testenv"
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
	if status != clibase.StatusFailure {
		t.Errorf("exec --snapshot of a directory that is no snapshot: status %d; want %d", status, clibase.StatusFailure)
	}
	oneLine(t, "stderr", stderr, other)
}

// TestExecSnapshot: the first exec --snapshot boots, snapshots the VM
// once its agent answers and runs the command; later ones run in clones
// of that snapshot: they do not see what an earlier command wrote (the
// snapshot was taken before it ran, and a clone's writes stay its own),
// their clock was moved on past the save, and an exec whose
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
	if err != nil || info.Labels[execvm.LabelExecKey] == "" {
		t.Fatalf("the first exec's snapshot: %+v, %v; want one with its key", info.Labels, err)
	}
	// Let time pass between the save and the restores, so that a clock
	// not moved on by it shows: it would be 10 s behind, or more.
	time.Sleep(10 * time.Second)
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
		// A guest under TCG in the box drifts seconds behind its host by
		// itself while it boots (TestNamedAgentSnapshot measures the
		// offset before and after); 5 s behind is allowed for that.
		if secs < before.Unix()-5 || secs > after.Unix()+1 {
			t.Errorf("clone %d: the guest's clock says %d; the host's was %d..%d", i, secs, before.Unix(), after.Unix())
		}
		t.Logf("clone %d: the guest's clock %d s from the host's", i, secs-(before.Unix()+after.Unix())/2)
		t.Logf("clone %d: exec took %v (the cold one, boot and snapshot included, %v)", i, warm.Round(time.Millisecond), cold.Round(time.Millisecond))
	}
	status, _, stderr, _ = run("--cpus", "2", "--", "true")
	if status != clibase.StatusFailure {
		t.Errorf("exec --snapshot with another --cpus: status %d; want %d", status, clibase.StatusFailure)
	}
	oneLine(t, "stderr", stderr, "made for another kernel, machine or agent image")
}

// TestExecSnapshotNet: with a user-mode network, each clone of an exec
// snapshot has a MAC address of its own (the restore gives its device a
// new one and the clone's agent moves eth0 to it before the command runs),
// different from the booted VM's and from the other clone's, and reaches a
// server on this machine's loopback through the network.
func TestExecSnapshotNet(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello from the host") })}
	go srv.Serve(web)
	defer srv.Close()
	dir := filepath.Join(t.TempDir(), "warm")
	script := fmt.Sprintf("cat /sys/class/net/eth0/address; wget -q -O- http://192.168.127.254:%d/", web.Addr().(*net.TCPAddr).Port)
	run := func(who string) string {
		t.Helper()
		cmd := exec.Command(testenv.Binary(t), "exec", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
			"--memory", "256M", "--net", "user,host-loopback", "--snapshot", dir, "--timeout", "3m", "--", "sh", "-c", script)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v; stdout %q, stderr:\n%s", who, err, stdout.String(), stderr.String())
		}
		mac, body, _ := strings.Cut(stdout.String(), "\n")
		if body != "hello from the host" {
			t.Errorf("%s: fetched %q from the host; stderr:\n%s", who, body, stderr.String())
		}
		return mac
	}
	seen := map[string]string{}
	for _, who := range []string{"the booted VM", "clone 1", "clone 2"} {
		mac := run(who)
		if _, err := net.ParseMAC(mac); err != nil {
			t.Fatalf("%s: eth0's address %q: %v", who, mac, err)
		}
		if other, ok := seen[mac]; ok {
			t.Errorf("%s has the MAC of %s: %s", who, other, mac)
		}
		seen[mac] = who
		t.Logf("%s: eth0 %s", who, mac)
	}
}
