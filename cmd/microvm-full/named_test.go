package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// namedTestPort is where the echo test guest listens.
const namedTestPort = 1024

// namedCLI runs the test binary as the CLI with its own state directory,
// and returns the exit status and the two streams.
type namedCLI struct {
	t     *testing.T
	state string
}

func newNamedCLI(t *testing.T) *namedCLI {
	t.Helper()
	state, err := os.MkdirTemp("", "mvs") // short: the VMs' socket paths
	if err != nil {
		t.Fatal(err)
	}
	n := &namedCLI{t: t, state: state}
	t.Cleanup(func() {
		// Whatever the test left running goes.
		_, _, _ = n.run("rm", "-f", "t1", "t2")
		os.RemoveAll(state)
	})
	return n
}

func (n *namedCLI) run(args ...string) (int, string, string) {
	n.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), envAsCLI+"=1", "GORACE=atexit_sleep_ms=50", "MICROVM_STATE_DIR="+n.state)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	status := 0
	if ee, ok := err.(*exec.ExitError); ok {
		status = ee.ExitCode()
	} else if err != nil {
		n.t.Fatal(err)
	}
	return status, stdout.String(), stderr.String()
}

// waitListening waits until the echo test guest of VM name says it
// listens on namedTestPort.
func (n *namedCLI) waitListening(name string) {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(n.mustRun("logs", name), fmt.Sprintf("testguest: listening %d", namedTestPort)) {
		if time.Now().After(deadline) {
			n.t.Fatalf("the guest never listened; logs:\n%s", n.mustRun("logs", name))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// echoLine sends msg on c, checks the echo test guest sends it back, and
// closes c.
func echoLine(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(got); err != nil || string(got) != msg {
		t.Errorf("echo: %q, %v", got, err)
	}
	c.Close()
}

// mustRun runs args and fails the test unless they exit 0.
func (n *namedCLI) mustRun(args ...string) string {
	n.t.Helper()
	status, stdout, stderr := n.run(args...)
	if status != 0 {
		n.t.Fatalf("microvm %s: status %d; stderr:\n%s", strings.Join(args, " "), status, stderr)
	}
	return stdout
}

// record reads a VM as ls --json shows it.
func (n *namedCLI) record(name string) (vms.Record, bool) {
	n.t.Helper()
	var recs []vms.Record
	if err := json.Unmarshal([]byte(n.mustRun("ls", "--json")), &recs); err != nil {
		n.t.Fatal(err)
	}
	for _, r := range recs {
		if r.Name == name {
			return r, true
		}
	}
	return vms.Record{}, false
}

// TestNamedVM walks a named VM's life with the test guest: run --detach
// returns once it runs; ls shows it; pause and resume show in ls; its
// vsock socket in the state directory echoes; logs has its console; a
// second VM of the same name is refused; exec --vm on a VM without an
// agent says so; stop ends it (status 0 in its record) and rm removes it.
func TestNamedVM(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	n := newNamedCLI(t)
	n.mustRun("run", "--name", "t1", "--detach", "--kernel", guest, "--memory", "64M",
		"--cmdline", fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=2", namedTestPort))

	r, ok := n.record("t1")
	if !ok || r.State != vms.StateRunning || r.PID == 0 || r.CPUs != 1 || r.MemoryBytes != 64<<20 {
		t.Fatalf("ls after run --detach: %+v (found %v)", r, ok)
	}
	if out := n.mustRun("ls"); !strings.Contains(out, "t1") || !strings.Contains(out, "running") {
		t.Errorf("ls:\n%s", out)
	}

	n.mustRun("pause", "t1")
	if r, _ := n.record("t1"); r.State != vms.StatePaused {
		t.Errorf("state %q after pause", r.State)
	}
	n.mustRun("resume", "t1")
	if r, _ := n.record("t1"); r.State != vms.StateRunning {
		t.Errorf("state %q after resume", r.State)
	}

	dir := filepath.Join(n.state, "vms", "t1")
	n.waitListening("t1")
	c, _, err := testenv.VsockConnect(filepath.Join(dir, vms.VsockSocket), namedTestPort, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	echoLine(t, c, "through the named VM's socket\n")

	status, _, stderr := n.run("run", "--name", "t1", "--kernel", guest)
	if status == 0 || !strings.Contains(stderr, "VM t1: a running VM has that name") {
		t.Errorf("a second t1: status %d, stderr %q", status, stderr)
	}
	status, _, stderr = n.run("exec", "--vm", "t1", "--", "true")
	if status != clibase.StatusFailure || !strings.Contains(stderr, "VM t1 runs no agent") {
		t.Errorf("exec --vm on a VM without an agent: status %d, stderr %q", status, stderr)
	}
	status, _, stderr = n.run("rm", "t1")
	if status == 0 || !strings.Contains(stderr, "the VM is running") {
		t.Errorf("rm of a running VM: status %d, stderr %q", status, stderr)
	}

	n.mustRun("stop", "t1")
	r, _ = n.record("t1")
	if r.State != vms.StateExited || r.ExitStatus != 0 || !strings.Contains(r.ExitReason, "control API") {
		t.Errorf("after stop: %+v", r)
	}
	status, _, stderr = n.run("exec", "--vm", "t1", "--", "true")
	if status != clibase.StatusFailure || !strings.Contains(stderr, "VM t1 is not running (exited") {
		t.Errorf("exec --vm on a stopped VM: status %d, stderr %q", status, stderr)
	}
	n.mustRun("rm", "t1")
	if _, ok := n.record("t1"); ok {
		t.Error("t1 still listed after rm")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state directory left after rm: %v", err)
	}
}

// TestNamedVMKilled: a VM whose process dies without a word (SIGKILL) reads
// as exited, and its name can be used again.
func TestNamedVMKilled(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	n := newNamedCLI(t)
	args := []string{"run", "--name", "t2", "--detach", "--kernel", guest, "--memory", "64M",
		"--cmdline", fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=2", namedTestPort)}
	n.mustRun(args...)
	r, _ := n.record("t2")
	if err := syscall.Kill(r.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _ = n.record("t2")
		if r.State == vms.StateExited || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.State != vms.StateExited {
		t.Fatalf("after SIGKILL: %+v", r)
	}
	n.mustRun(args...) // the name is free
	n.mustRun("kill", "t2")
	if r, _ := n.record("t2"); r.State != vms.StateExited {
		t.Errorf("after kill: %+v", r)
	}
}

// TestNamedUsage: the named VMs' usage errors, before anything starts.
func TestNamedUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--detach", "--kernel", "k"}, "--detach needs --name"},
		{[]string{"run", "--name", "a/b", "--kernel", "k"}, `VM name "a/b"`},
		{[]string{"run", "--name", "x", "--vsock-uds", "/tmp/v.sock", "--kernel", "k"}, "a named VM's vsock socket is in its state directory"},
		{[]string{"run", "--name", "x", "--memory", "3M", "--kernel", "k"}, "memory 3M"},
		{[]string{"stop"}, "stop: want one VM name"},
		{[]string{"ls", "x"}, "ls takes no arguments"},
		{[]string{"exec", "--vm", "x", "--cpus", "2", "--", "true"}, "exec --vm: --cpus makes a fresh VM"},
		{[]string{"cp", "a", "b"}, "neither SRC nor DST is NAME:/PATH"},
		{[]string{"cp", "x:/a", "y:/b"}, "both SRC and DST name a VM"},
	} {
		wantError(t, 2, tc.args, tc.want)
	}
}

// TestNamedVMAgent: a named VM with the agent, as a CI job uses one: run
// --detach --with-agent returns once the agent answers; exec --vm runs
// commands that share the VM's state, with their streams and statuses;
// cp copies both ways; stop has the agent power the guest off (status 0,
// power-off in the record). Linux: natively on hardware KVM, otherwise in
// the nested-KVM box.
func TestNamedVMAgent(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	n := newNamedCLI(t)
	start := time.Now()
	n.mustRun("run", "--name", "t1", "--detach", "--with-agent", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
		"--cpus", "2", "--memory", "256M")
	t.Logf("run --detach --with-agent returned after %v", time.Since(start).Round(time.Millisecond))

	status, stdout, stderr := n.run("exec", "--vm", "t1", "--", "sh", "-c", "echo one > /tmp/state; echo out; echo err >&2; exit 3")
	if status != 3 || stdout != "out\n" || stderr != "err\n" {
		t.Errorf("exec --vm: status %d stdout %q stderr %q; want 3, out, err", status, stdout, stderr)
	}
	if out := n.mustRun("exec", "--vm", "t1", "--env", "X=two", "--", "sh", "-c", `cat /tmp/state; echo $X`); out != "one\ntwo\n" {
		t.Errorf("second exec --vm: %q; want the first one's file, then X", out)
	}
	status, _, stderr = n.run("exec", "--vm", "t1", "--", "/no/such/command")
	if status != 127 || !strings.Contains(stderr, "not found in the guest") {
		t.Errorf("missing command: status %d stderr %q", status, stderr)
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := bytes.Repeat([]byte("named VM cp\n"), 10000)
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	n.mustRun("cp", src, "t1:/tmp/copied")
	back := filepath.Join(dir, "back")
	n.mustRun("cp", "t1:/tmp/copied", back)
	if b, err := os.ReadFile(back); err != nil || !bytes.Equal(b, data) {
		t.Errorf("copied back: %d bytes, %v; want the %d sent", len(b), err, len(data))
	}
	status, _, stderr = n.run("cp", "t1:/tmp/nope", back)
	if status != 1 || !strings.Contains(stderr, "cp: guest:/tmp/nope: no such file or directory") {
		t.Errorf("cp of a missing guest file: status %d stderr %q", status, stderr)
	}

	n.mustRun("stop", "--timeout", "60s", "t1")
	r, _ := n.record("t1")
	if r.State != vms.StateExited || r.ExitStatus != 0 || !strings.Contains(r.ExitReason, "power-off") {
		t.Errorf("after stop: %+v; want exited 0 by the guest's power-off", r)
	}
	n.mustRun("rm", "t1")
}

// TestNamedExit: a named VM's errors become the CLI's exit statuses in
// one place: a failed setup says why on stderr and exits with its status,
// a VM that ended badly with its status, one microvm could not start or
// run with the failure status; other errors pass as they are.
func TestNamedExit(t *testing.T) {
	other := errors.New("state directory: permission denied")
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		wantStderr string
	}{
		{"none", nil, 0, ""},
		{"setup", namedvm.SetupError{Status: 42, Err: errors.New("VM d1: docker: no dockerd")}, 42, "microvm: VM d1: docker: no dockerd\n"},
		{"exit", namedvm.ExitError{Status: 3}, 3, ""},
		{"failed", namedvm.FailedError{Err: errors.New("run: disk exists")}, clibase.StatusFailure, ""},
		{"failed, hinted", fmt.Errorf("%w; the state directory is /x", namedvm.FailedError{Err: errors.New("bind")}), clibase.StatusFailure, ""},
		{"other", other, microvm.StatusError, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := namedExit(tc.err, &stderr)
			if got := clibase.ExitStatus(err, nil); got != tc.status || stderr.String() != tc.wantStderr {
				t.Errorf("namedExit(%v): status %d, stderr %q; want %d, %q", tc.err, got, stderr.String(), tc.status, tc.wantStderr)
			}
			if tc.err != nil && err.Error() != tc.err.Error() && tc.name != "setup" && tc.name != "exit" {
				t.Errorf("namedExit(%v) says %q; want the error's own words", tc.err, err)
			}
		})
	}
}
