package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// TestRunDockerUsage: run --docker without the agent it starts Docker
// through, its other flags without it, and a bad disk size are each one
// line and status 2, before any VM or disk exists.
func TestRunDockerUsage(t *testing.T) {
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	kernel := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(kernel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--kernel", kernel, "--docker"}, "--docker needs --image or --with-agent"},
		{[]string{"run", "--name", "d1", "--kernel", kernel, "--docker"}, "--docker needs --image or --with-agent"},
		{[]string{"run", "--name", "d1", "--with-agent", "--kernel", kernel, "--docker-disk", "1G"}, "give --docker too"},
		{[]string{"run", "--name", "d1", "--with-agent", "--kernel", kernel, "--docker-timeout", "5s"}, "give --docker too"},
		{[]string{"run", "--name", "d1", "--with-agent", "--kernel", kernel, "--docker", "--docker-disk", "1K"}, `--docker-disk "1K": want 256M to 1T`},
		{[]string{"run", "--name", "d1", "--with-agent", "--kernel", kernel, "--docker", "--docker-timeout", "0s"}, "--docker-timeout 0s: want a positive duration"},
	} {
		wantError(t, microvm.StatusUsage, tc.args, tc.want)
	}
	if entries, err := os.ReadDir(state); err != nil || len(entries) != 0 {
		t.Errorf("state directory after refused command lines: %v, %v; want it empty", entries, err)
	}
}

// TestDockerTimeoutDefault: run's --docker-timeout default, which the
// lean binary's flag table holds, is dockervm's, as exec's is.
func TestDockerTimeoutDefault(t *testing.T) {
	if clibase.DockerTimeout != dockervm.DefaultTimeout {
		t.Errorf("clibase.DockerTimeout = %v, dockervm.DefaultTimeout = %v; want them equal", clibase.DockerTimeout, dockervm.DefaultTimeout)
	}
}

// TestWantsNamedDocker: --docker and its flags take run to named.go (and
// the lean binary hands them to microvm-full), which refuses them without
// the agent; a plain run stays plain.
func TestWantsNamedDocker(t *testing.T) {
	for args, want := range map[string]bool{
		"--kernel k":                        false,
		"--kernel k --docker":               true,
		"--kernel k --docker=false":         false,
		"--kernel k --docker-disk 1G":       true,
		"--kernel k --docker-timeout 30s":   true,
		"--kernel k --name d1 --with-agent": true,
	} {
		c, _, err := clibase.ParseLeanFlags("run", clibase.RunOpts(), strings.Fields(args))
		if err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		if got := clibase.WantsNamed(c); got != want {
			t.Errorf("WantsNamed(%s) = %v, want %v", args, got, want)
		}
	}
}

// TestRunDockerNoDockerd: run --docker of a VM whose image has no dockerd
// (the agent image) exits with Docker's status and its one clear reason,
// in the foreground and with --detach; the VM is stopped, its record says
// why, and rm removes its data disk with it.
func TestRunDockerNoDockerd(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	n := newNamedCLI(t)
	vmArgs := func(name string, more ...string) []string {
		return append([]string{"run", "--name", name, "--with-agent", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
			"--memory", "256M", "--docker", "--docker-disk", "256M"}, more...)
	}
	for _, name := range []string{"t1", "t2"} {
		args := vmArgs(name)
		if name == "t2" {
			args = vmArgs(name, "--detach")
		}
		status, _, stderr := n.run(args...)
		if status != dockervm.ExitStatus || !strings.Contains(stderr, "microvm: VM "+name+": docker: the image has no dockerd") {
			t.Errorf("%s: status %d, stderr %q; want %d and the image's missing dockerd", name, status, stderr, dockervm.ExitStatus)
		}
		r, ok := n.record(name)
		if !ok || r.State != vms.StateExited || r.ExitStatus != dockervm.ExitStatus || !strings.Contains(r.ExitReason, "its setup failed") {
			t.Errorf("%s: record %+v; want exited %d, its setup failed", name, r, dockervm.ExitStatus)
		}
		disk := filepath.Join(n.state, "vms", name, namedvm.DockerDiskFile)
		if _, err := os.Stat(disk); err != nil {
			t.Errorf("%s: the data disk before rm: %v", name, err)
		}
		n.mustRun("rm", name)
		if _, err := os.Stat(disk); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the data disk after rm: %v; want it gone", name, err)
		}
	}
}
