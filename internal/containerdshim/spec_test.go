package containerdshim

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestExecStart(t *testing.T) {
	p := &specs.Process{
		Args: []string{"sh", "-c", "true"}, Env: []string{"A=1"}, Cwd: "/work",
		User: specs.User{UID: 1000, GID: 1001},
	}
	st, err := execStart(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(st.Argv, " ") != "sh -c true" || st.Env[0] != "A=1" || st.Dir != "/work" ||
		*st.Uid != 1000 || *st.Gid != 1001 || st.Pty != nil {
		t.Errorf("execStart = %v", st)
	}
	p.Terminal = true
	if st, _ = execStart(p); st.Pty == nil || st.Pty.Rows != 24 || st.Pty.Cols != 80 {
		t.Errorf("terminal without a size: pty %v, want 24x80", st.Pty)
	}
	p.ConsoleSize = &specs.Box{Height: 50, Width: 132}
	if st, _ = execStart(p); st.Pty.Rows != 50 || st.Pty.Cols != 132 {
		t.Errorf("terminal 132x50: pty %v", st.Pty)
	}
}

func TestExecStartRefuses(t *testing.T) {
	for name, p := range map[string]*specs.Process{
		"no process":  nil,
		"no args":     {},
		"empty arg0":  {Args: []string{""}},
		"commandLine": {Args: []string{"x"}, CommandLine: "x"},
	} {
		if _, err := execStart(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestCheckSpec(t *testing.T) {
	// ctr's default mounts are all the guest's own.
	ok := &specs.Spec{Root: &specs.Root{Path: "rootfs"}, Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc"}, {Destination: "/dev", Type: "tmpfs"},
		{Destination: "/dev/pts", Type: "devpts"}, {Destination: "/dev/shm", Type: "tmpfs"},
		{Destination: "/dev/mqueue", Type: "mqueue"}, {Destination: "/sys", Type: "sysfs"},
		{Destination: "/sys/fs/cgroup", Type: "cgroup"},
	}}
	if err := checkSpec(ok); err != nil {
		t.Errorf("ctr's default spec: %v", err)
	}
	for name, s := range map[string]*specs.Spec{
		"read-only root": {Root: &specs.Root{Readonly: true}},
		"bind type":      {Mounts: []specs.Mount{{Destination: "/data", Type: "bind", Source: "/srv"}}},
		"bind option":    {Mounts: []specs.Mount{{Destination: "/data", Type: "none", Source: "/srv", Options: []string{"rbind", "ro"}}}},
		"other type":     {Mounts: []specs.Mount{{Destination: "/mnt", Type: "nfs"}}},
	} {
		err := checkSpec(s)
		if !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("%s: err %v, want ErrNotImplemented", name, err)
		}
	}
}
