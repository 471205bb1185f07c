package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// TestExecUsage: exec's flag and argument errors exit 2 with one line and
// boot nothing (no KVM needed).
func TestExecUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec"}, "no command given"},
		{[]string{"exec", "--add", "nocolon", "--", "true"}, "want SRC:DST"},
		{[]string{"exec", "--add", "/etc/hostname:relative", "--", "true"}, "must be absolute"},
		{[]string{"exec", "--env", "=x", "--", "true"}, "want K=V"},
		{[]string{"exec", "--workdir", "tmp", "--", "true"}, "absolute guest path"},
		{[]string{"exec", "--cpus", "0", "--", "true"}, "--cpus 0"},
	} {
		status, stdout, stderr := runMain(t, tc.args...)
		if status != 2 || stdout != "" {
			t.Errorf("%q: status %d, stdout %q; want 2 and nothing", tc.args, status, stdout)
		}
		oneLine(t, "stderr", stderr, tc.want)
	}
}

// TestExec runs commands in fresh VMs through the guest agent, as a user
// types them: the streams come back apart and byte for byte, the exit
// status is the command's, a missing command is 127 and --timeout kills.
// Each case boots Linux, so it needs a KVM that can (natively on hardware
// KVM, otherwise in the nested-KVM box).
func TestExec(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	base := []string{"exec", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t), "--cpus", "2"}
	run := func(t *testing.T, stdin []byte, args ...string) (int, string, string, time.Duration) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		start := time.Now()
		status := Main(append(append([]string{"microvm"}, base...), args...), bytes.NewReader(stdin), &stdout, &stderr)
		return status, stdout.String(), stderr.String(), time.Since(start)
	}
	t.Run("streams and status", func(t *testing.T) {
		status, stdout, stderr, took := run(t, nil, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		if status != 7 || stdout != "out\n" || stderr != "err\n" {
			t.Errorf("status %d stdout %q stderr %q; want 7, \"out\\n\", \"err\\n\"", status, stdout, stderr)
		}
		t.Logf("boot, exec and teardown took %v", took.Round(time.Millisecond))
	})
	t.Run("10MiB through cat", func(t *testing.T) {
		in := make([]byte, 10<<20)
		if _, err := rand.Read(in); err != nil {
			t.Fatal(err)
		}
		status, stdout, stderr, took := run(t, in, "--", "cat")
		if status != 0 || sha256.Sum256([]byte(stdout)) != sha256.Sum256(in) {
			t.Errorf("status %d, %d bytes back (want %d, same SHA-256); stderr %q", status, len(stdout), len(in), stderr)
		}
		t.Logf("took %v", took.Round(time.Millisecond))
	})
	t.Run("agent never answers", func(t *testing.T) {
		// No Linux reaches its agent within 100 ms (the kernel's own
		// start takes longer on any KVM), and by then the vCPUs run: the
		// error names how far the guest got, each vCPU's state and the
		// devices' status bytes.
		status, _, stderr, _ := run(t, nil, "--boot-timeout", "100ms", "--", "true")
		for _, want := range []string{"did not answer on vsock port 1024 within 100ms", "virtio devices: vsock=0x",
			"vCPU 0 rip=0x", "vCPU 1 rip=0x"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("status %d stderr %q; want it to say %q", status, stderr, want)
			}
		}
		if status != clibase.StatusFailure {
			t.Errorf("status %d, want %d", status, clibase.StatusFailure)
		}
	})
	t.Run("missing command", func(t *testing.T) {
		status, stdout, stderr, _ := run(t, nil, "--", "/no/such/command")
		if status != 127 || stdout != "" {
			t.Errorf("status %d stdout %q; want 127 and nothing", status, stdout)
		}
		oneLine(t, "stderr", stderr, "/no/such/command: not found")
	})
	t.Run("shared directory", func(t *testing.T) {
		// --share: the agent mounts a host directory over virtio-9p at
		// /run/microvm-shares/TAG; the guest reads what the host put
		// there, and what it writes is on the host at once; a symlink
		// it makes is stored, never followed.
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "in.txt"), []byte("from the host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		status, stdout, stderr, took := run(t, nil, "--share", "tag=work,path="+dir, "--", "sh", "-c",
			"cd /run/microvm-shares/work && grep -q ' /run/microvm-shares/work 9p ' /proc/mounts && "+
				"cat in.txt && echo from the guest >out.txt && mkdir d && "+
				"dd if=/dev/zero of=d/big bs=64k count=48 2>/dev/null && ln -s /etc d/etc && "+
				"mv out.txt d/out.txt && ls d")
		if status != 0 || stdout != "from the host\nbig\netc\nout.txt\n" {
			t.Fatalf("status %d stdout %q stderr %q", status, stdout, stderr)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "d", "out.txt")); err != nil || string(b) != "from the guest\n" {
			t.Errorf("host reads %q, %v", b, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, "d", "big")); err != nil || fi.Size() != 48*64<<10 {
			t.Errorf("host sees big as %v, %v; want %d bytes", fi, err, 48*64<<10)
		}
		if l, err := os.Readlink(filepath.Join(dir, "d", "etc")); err != nil || l != "/etc" {
			t.Errorf("symlink: %q, %v", l, err)
		}
		t.Logf("took %v", took.Round(time.Millisecond))
	})
	t.Run("VM ends mid-command", func(t *testing.T) {
		// The guest restarts itself while the command runs: exec must
		// say so at once, not wait on the agent's dead connection.
		status, _, stderr, took := run(t, nil, "--", "sh", "-c", "sleep 1; reboot -f; sleep 100")
		if status != clibase.StatusFailure || !strings.Contains(stderr, "the VM ended while sh ran (reset)") || strings.Contains(stderr, "<nil>") {
			t.Errorf("status %d stderr %q; want %d and the VM's end named", status, stderr, clibase.StatusFailure)
		}
		if took > 90*time.Second {
			t.Errorf("took %v to notice", took)
		}
	})
	t.Run("timeout kills", func(t *testing.T) {
		// The guest's own clock: the command is killed a second after it
		// started there, whatever the boot cost.
		status, _, stderr, _ := run(t, nil, "--timeout", "1s", "--", "sh", "-c", "sleep 100 & sleep 100")
		if status != 128+9 || !strings.Contains(stderr, "killed after --timeout 1s") {
			t.Errorf("status %d stderr %q; want 137 and the timeout named", status, stderr)
		}
	})
	t.Run("hung guest stopped", func(t *testing.T) {
		// The guest kernel panics on an OOM (three dd's with 100 MiB
		// buffers in 128 MiB) and, with panic=0, halts for ever: no agent is left to enforce --timeout, so the host
		// stops the VM unresponsiveGrace after it.
		defer func(g time.Duration) { unresponsiveGrace = g }(unresponsiveGrace)
		unresponsiveGrace = 5 * time.Second
		status, _, stderr, took := run(t, nil, "--memory", "128M", "--timeout", "20s", "--", "sh", "-c",
			"echo 0 >/proc/sys/kernel/panic && echo 1 >/proc/sys/vm/panic_on_oom && "+
				"for i in 1 2 3; do dd if=/dev/zero of=/dev/null bs=100M count=1 & done; wait")
		if status != clibase.StatusFailure || !strings.Contains(stderr, "the guest did not report the command's end within --timeout plus 5s") ||
			!strings.Contains(stderr, "Out of memory") {
			t.Errorf("status %d stderr %q; want %d, the unresponsive guest named and its panic on the console", status, stderr, clibase.StatusFailure)
		}
		t.Logf("took %v", took.Round(time.Millisecond))
	})
}

// TestExecVMErrors: exec --vm's flag errors exit 2, the --cache and
// --docker one before the name's; a VM that does not run, or runs no
// agent, is a failure (125) with one line. No KVM needed: nothing boots.
func TestExecVMErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--vm", "a/b", "--", "true"}, `--vm: VM name "a/b"`},
		{[]string{"exec", "--vm", "a/b", "--docker", "--", "true"}, "--cache and --docker are for a fresh VM, not --vm"},
		{[]string{"exec", "--vm", "x", "--kernel", "k", "--", "true"}, "exec --vm: --kernel makes a fresh VM; the named VM has its own"},
		{[]string{"exec", "--vm", "x"}, "exec: no command given (microvm exec --vm NAME [flags] -- CMD [ARG...])"},
	} {
		wantError(t, microvm.StatusUsage, tc.args, tc.want)
	}
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	store, err := vms.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, clibase.StatusFailure, []string{"exec", "--vm", "nope", "--", "true"}, "exec: ")
	l, err := store.Create(vms.Record{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	wantError(t, clibase.StatusFailure, []string{"exec", "--vm", "plain", "--", "true"}, "exec: VM plain runs no agent (start it with --with-agent)")
}

// TestCommandEnd: a command's status and agentvm.RunCommand's errors as
// exec's: 0 is success, another status the command's own, a signal's
// status and a usage error pass, any other error is a failure.
func TestCommandEnd(t *testing.T) {
	lost := &agentvm.CommandError{Name: "exec", Program: "sh", Err: agentapi.ErrAgentLost}
	usage := clibase.UsageError{Err: errors.New("-t: stdin is not a terminal")}
	for _, tc := range []struct {
		status int
		err    error
		want   int // clibase.ExitStatus of the result
	}{
		{0, nil, 0},
		{3, nil, 3},
		{127, nil, 127},
		{128 + 9, nil, 128 + 9},
		{0, clibase.StatusError{Status: 130}, 130},
		{0, usage, microvm.StatusUsage},
		{0, lost, clibase.StatusFailure},
	} {
		err := commandEnd(tc.status, tc.err)
		if got := clibase.ExitStatus(err, nil); got != tc.want {
			t.Errorf("%d, %v: exit status %d, want %d", tc.status, tc.err, got, tc.want)
		}
		if tc.err != nil && !errors.Is(err, tc.err) {
			t.Errorf("%d, %v: %v no longer wraps it", tc.status, tc.err, err)
		}
	}
}
