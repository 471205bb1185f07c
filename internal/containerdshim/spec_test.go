package containerdshim

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/guest/agentapi"
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
	// A read-only root and bind mounts (volumes, CRI's /etc/hosts) are
	// honoured; other mount types are refused.
	if err := checkSpec(&specs.Spec{Root: &specs.Root{Readonly: true}, Mounts: []specs.Mount{
		{Destination: "/data", Type: "bind", Source: "/srv"},
		{Destination: "/etc/hosts", Type: "none", Source: "/x/hosts", Options: []string{"rbind", "ro"}},
	}}); err != nil {
		t.Errorf("read-only root with binds: %v", err)
	}
	err := checkSpec(&specs.Spec{Mounts: []specs.Mount{{Destination: "/mnt", Type: "nfs"}}})
	if !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "/mnt") {
		t.Errorf("nfs mount: err %v, want ErrNotImplemented naming /mnt", err)
	}
}

func TestExecStartLimitsAndCapabilities(t *testing.T) {
	p := &specs.Process{
		Args: []string{"true"}, User: specs.User{UID: 1, GID: 2, AdditionalGids: []uint32{3, 4}},
		NoNewPrivileges: true,
		Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 512}},
		Capabilities: &specs.LinuxCapabilities{
			Bounding: []string{"CAP_CHOWN", "CAP_NET_BIND_SERVICE"}, Effective: []string{"CAP_KILL"},
			Ambient: []string{"CAP_NET_RAW"},
		},
	}
	st, err := execStart(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Rlimits) != 1 || st.Rlimits[0].Resource != 7 || st.Rlimits[0].Soft != 512 || st.Rlimits[0].Hard != 1024 {
		t.Errorf("rlimits %v, want NOFILE (7) 512/1024", st.Rlimits)
	}
	c := st.Capabilities
	if fmt.Sprint(c.Bounding, c.Effective, c.Ambient) != "[0 10] [5] [13]" || !st.NoNewPrivileges ||
		fmt.Sprint(st.AdditionalGids) != "[3 4]" {
		t.Errorf("capabilities %v, no_new_privileges %v, gids %v", c, st.NoNewPrivileges, st.AdditionalGids)
	}
	p.Rlimits[0].Type = "RLIMIT_BOGUS"
	if _, err := execStart(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown rlimit: %v", err)
	}
	p.Rlimits = nil
	p.Capabilities.Effective = []string{"CAP_BOGUS"}
	if _, err := execStart(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown capability: %v", err)
	}
}

func TestContainerRoot(t *testing.T) {
	s := &specs.Spec{Root: &specs.Root{Readonly: true}, Hostname: "pod", Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/etc/hosts", Type: "bind", Source: "/host/hosts", Options: []string{"rbind", "ro"}},
	}}
	r := containerRoot(s, "/r", map[int]string{1: "/run/x/mounts/1/hosts"})
	if r.Root != "/r" || !r.Readonly || r.Hostname != "pod" || len(r.Mounts) != 2 ||
		r.Mounts[0].Type != "proc" || r.Mounts[1].Type != "bind" || r.Mounts[1].Source != "/run/x/mounts/1/hosts" ||
		fmt.Sprint(r.Mounts[1].Options) != "[rbind ro]" {
		t.Errorf("containerRoot = %v", r)
	}
}

func TestResources(t *testing.T) {
	mem, pids := int64(64<<20), int64(100)
	r := resources(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &mem}, Pids: &specs.LinuxPids{Limit: pids}})
	if r == nil || r.MemoryMaxBytes != 64<<20 || r.PidsMax != 100 {
		t.Errorf("resources = %v", r)
	}
	shares, quota, period := uint64(1024), int64(50000), uint64(100000)
	r = resources(&specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &shares, Quota: &quota, Period: &period}})
	if r == nil || r.CpuWeight != 39 || r.CpuQuotaUsec != 50000 || r.CpuPeriodUsec != 100000 {
		t.Errorf("CPU shares 1024, quota 50000/100000: %v, want weight 39 and cpu.max 50000 100000", r)
	}
	unlimited := int64(-1)
	if r := resources(&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &unlimited}}); r != nil {
		t.Errorf("quota -1 only: %v, want nil (no limit)", r)
	}
	if r := resources(&specs.LinuxResources{BlockIO: &specs.LinuxBlockIO{}}); r != nil {
		t.Errorf("block I/O only: %v, want nil (nothing the guest applies)", r)
	}
	for shares, want := range map[uint64]uint64{0: 0, 1: 1, 2: 1, 1024: 39, 262144: 10000, 1 << 20: 10000} {
		if got := sharesToWeight(shares); got != want {
			t.Errorf("sharesToWeight(%d) = %d, want %d", shares, got, want)
		}
	}
	if r := resources(nil); r != nil {
		t.Errorf("nil: %v", r)
	}
}

// The sandbox's network namespace is the one with a path; a new one (ctr
// run) or none (a hostNetwork pod) is no pod network.
func TestPodNetNS(t *testing.T) {
	for _, tc := range []struct {
		ns   []specs.LinuxNamespace
		want string
	}{
		{nil, ""},
		{[]specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}}, ""},
		{[]specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"}}, "/var/run/netns/cni-1"},
	} {
		if got := podNetNS(&specs.Spec{Linux: &specs.Linux{Namespaces: tc.ns}}); got != tc.want {
			t.Errorf("podNetNS(%v) = %q, want %q", tc.ns, got, tc.want)
		}
	}
	if got := podNetNS(&specs.Spec{}); got != "" {
		t.Errorf("podNetNS of a spec without linux: %q", got)
	}
}

// The spec's seccomp profile is compiled for the agent; none is no filter,
// and one the compiler refuses is an invalid argument naming linux.seccomp.
func TestSeccompFilter(t *testing.T) {
	log := logrus.New()
	if f, err := seccompFilter(&specs.Spec{Linux: &specs.Linux{}}, log); f != nil || err != nil {
		t.Errorf("no profile: %v, %v", f, err)
	}
	f, err := seccompFilter(&specs.Spec{Linux: &specs.Linux{Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActErrno,
		Syscalls: []specs.LinuxSyscall{{Names: []string{"read", "arm_fadvise64_64"}, Action: specs.ActAllow}}}}}, log)
	if err != nil || f == nil || len(f.Program) == 0 || len(f.Program)%8 != 0 {
		t.Errorf("a profile: %v, %v; want a program", f, err)
	}
	_, err = seccompFilter(&specs.Spec{Linux: &specs.Linux{Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActNotify}}}, log)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "linux.seccomp") {
		t.Errorf("a notify profile: %v, want an invalid argument naming linux.seccomp", err)
	}
}

// CRI's namespace entries become the guest's: no path a new namespace, a
// path (in a later container) the sandbox's, no entry the guest's own; a
// path in the pod's first container is refused.
func TestContainerNamespaces(t *testing.T) {
	spec := func(ns ...specs.LinuxNamespace) *specs.Spec { return &specs.Spec{Linux: &specs.Linux{Namespaces: ns}} }
	const (
		n = agentapi.NamespaceMode_NAMESPACE_NEW
		j = agentapi.NamespaceMode_NAMESPACE_JOIN
		g = agentapi.NamespaceMode_NAMESPACE_GUEST
	)
	for _, tc := range []struct {
		spec          *specs.Spec
		sandbox       string
		pid, uts, ipc agentapi.NamespaceMode
	}{
		// ctr run, a CRI sandbox: new ones.
		{spec(specs.LinuxNamespace{Type: specs.PIDNamespace}, specs.LinuxNamespace{Type: specs.UTSNamespace},
			specs.LinuxNamespace{Type: specs.IPCNamespace}, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/var/run/netns/x"}), "", n, n, n},
		// A CRI container: the sandbox's IPC and UTS, its own PID.
		{spec(specs.LinuxNamespace{Type: specs.PIDNamespace}, specs.LinuxNamespace{Type: specs.UTSNamespace, Path: "/proc/9/ns/uts"},
			specs.LinuxNamespace{Type: specs.IPCNamespace, Path: "/proc/9/ns/ipc"}), "sb", n, j, j},
		// shareProcessNamespace: the sandbox's PID namespace too.
		{spec(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: "/proc/9/ns/pid"}, specs.LinuxNamespace{Type: specs.UTSNamespace, Path: "/proc/9/ns/uts"},
			specs.LinuxNamespace{Type: specs.IPCNamespace, Path: "/proc/9/ns/ipc"}), "sb", j, j, j},
		// hostPID and hostIPC: the guest's.
		{spec(specs.LinuxNamespace{Type: specs.UTSNamespace}), "", g, n, g},
		{&specs.Spec{}, "", g, g, g},
	} {
		got, err := containerNamespaces(tc.spec, tc.sandbox)
		if err != nil || got.Pid != tc.pid || got.Uts != tc.uts || got.Ipc != tc.ipc || got.Of != tc.sandbox {
			t.Errorf("containerNamespaces(%v, %q) = %v, %v; want pid %v uts %v ipc %v of %q", tc.spec.Linux, tc.sandbox, got, err, tc.pid, tc.uts, tc.ipc, tc.sandbox)
		}
	}
	_, err := containerNamespaces(spec(specs.LinuxNamespace{Type: specs.IPCNamespace, Path: "/proc/1/ns/ipc"}), "")
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "/proc/1/ns/ipc") {
		t.Errorf("a path in the first container: %v, want not implemented naming it", err)
	}
	// containerd's cgroup namespace (cgroup v2): a new one; none asked,
	// none made; one by path refused.
	if got, err := containerNamespaces(spec(specs.LinuxNamespace{Type: specs.CgroupNamespace}), ""); err != nil || !got.Cgroup {
		t.Errorf("a cgroup namespace: %v, %v; want a new one", got, err)
	}
	if got, err := containerNamespaces(spec(specs.LinuxNamespace{Type: specs.PIDNamespace}), ""); err != nil || got.Cgroup {
		t.Errorf("no cgroup namespace: %v, %v; want none", got, err)
	}
	_, err = containerNamespaces(spec(specs.LinuxNamespace{Type: specs.CgroupNamespace, Path: "/proc/9/ns/cgroup"}), "sb")
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "/proc/9/ns/cgroup") {
		t.Errorf("a cgroup namespace by path: %v, want not implemented naming it", err)
	}
}
