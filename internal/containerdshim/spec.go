package containerdshim

import (
	"fmt"

	"github.com/containerd/containerd/errdefs"
	capability "github.com/containerd/containerd/pkg/cap"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/seccomp"
)

// The terminal size of a process whose spec gives none.
const defaultRows, defaultCols = 24, 80

// execStart turns an OCI process into the agent's ExecStart: argv, env,
// working directory, uid and gid with the additional gids, a terminal,
// rlimits, capabilities and no_new_privileges. The caller names the
// container. docs/containerd.md lists what else of the spec is honoured
// and what is refused.
func execStart(p *specs.Process) (*agentapi.ExecStart, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: the spec has no process", errdefs.ErrInvalidArgument)
	}
	if p.CommandLine != "" {
		return nil, fmt.Errorf("%w: process.commandLine is for Windows; give process.args", errdefs.ErrInvalidArgument)
	}
	if len(p.Args) == 0 || p.Args[0] == "" {
		return nil, fmt.Errorf("%w: process.args is empty", errdefs.ErrInvalidArgument)
	}
	uid, gid := p.User.UID, p.User.GID
	st := &agentapi.ExecStart{
		Argv:            p.Args,
		Env:             p.Env,
		Dir:             p.Cwd,
		Uid:             &uid,
		Gid:             &gid,
		AdditionalGids:  p.User.AdditionalGids,
		NoNewPrivileges: p.NoNewPrivileges,
	}
	if p.Terminal {
		st.Pty = &agentapi.PtySize{Rows: defaultRows, Cols: defaultCols}
		if p.ConsoleSize != nil && p.ConsoleSize.Height > 0 && p.ConsoleSize.Width > 0 {
			st.Pty = &agentapi.PtySize{Rows: uint32(p.ConsoleSize.Height), Cols: uint32(p.ConsoleSize.Width)}
		}
	}
	for _, r := range p.Rlimits {
		n, ok := rlimits[r.Type]
		if !ok {
			return nil, fmt.Errorf("%w: process.rlimits: unknown type %q", errdefs.ErrInvalidArgument, r.Type)
		}
		st.Rlimits = append(st.Rlimits, &agentapi.Rlimit{Resource: n, Soft: r.Soft, Hard: r.Hard})
	}
	if c := p.Capabilities; c != nil {
		st.Capabilities = &agentapi.Capabilities{}
		for _, set := range []struct {
			names []string
			out   *[]uint32
		}{
			{c.Bounding, &st.Capabilities.Bounding}, {c.Effective, &st.Capabilities.Effective},
			{c.Permitted, &st.Capabilities.Permitted}, {c.Inheritable, &st.Capabilities.Inheritable},
			{c.Ambient, &st.Capabilities.Ambient},
		} {
			for _, name := range set.names {
				n, ok := capNumbers[name]
				if !ok {
					return nil, fmt.Errorf("%w: process.capabilities: unknown capability %q", errdefs.ErrInvalidArgument, name)
				}
				*set.out = append(*set.out, n)
			}
		}
	}
	return st, nil
}

// rlimits are the RLIMIT_* numbers of Linux on x86-64 (asm-generic).
var rlimits = map[string]uint32{
	"RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_DATA": 2, "RLIMIT_STACK": 3, "RLIMIT_CORE": 4,
	"RLIMIT_RSS": 5, "RLIMIT_NPROC": 6, "RLIMIT_NOFILE": 7, "RLIMIT_MEMLOCK": 8, "RLIMIT_AS": 9,
	"RLIMIT_LOCKS": 10, "RLIMIT_SIGPENDING": 11, "RLIMIT_MSGQUEUE": 12, "RLIMIT_NICE": 13,
	"RLIMIT_RTPRIO": 14, "RLIMIT_RTTIME": 15,
}

// capNumbers maps capability names (CAP_CHOWN) to their numbers, from
// containerd's list of the capabilities Linux knows.
var capNumbers = func() map[string]uint32 {
	m := map[string]uint32{}
	for i, name := range capability.Known() {
		m[name] = uint32(i)
	}
	return m
}()

// guestMountTypes are the spec mount types the agent makes in the guest,
// in each container's own mount namespace.
var guestMountTypes = map[string]bool{
	"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true,
	"cgroup": true, "cgroup2": true,
}

// isBind says whether m binds a host path (a volume, or CRI's /etc/hosts).
func isBind(m specs.Mount) bool {
	return m.Type == "bind" || hasOption(m.Options, "bind", "rbind")
}

// checkSpec refuses what the shim cannot honour, with an error that names
// it, rather than run the container without it.
func checkSpec(s *specs.Spec) error {
	for _, m := range s.Mounts {
		if isBind(m) || guestMountTypes[m.Type] {
			continue
		}
		return fmt.Errorf("%w: mount %s: type %q is not supported", errdefs.ErrNotImplemented, m.Destination, m.Type)
	}
	return nil
}

// containerRoot is the agent's description of a container's root: the
// guest directory root, the spec's read-only flag, hostname and mounts,
// with each bind mount's source replaced by the guest copy binds names.
func containerRoot(s *specs.Spec, root string, binds map[int]string) *agentapi.ContainerRoot {
	r := &agentapi.ContainerRoot{Root: root, Hostname: s.Hostname}
	if s.Root != nil {
		r.Readonly = s.Root.Readonly
	}
	if s.Linux != nil {
		r.Resources = resources(s.Linux.Resources)
		r.MaskedPaths, r.ReadonlyPaths = s.Linux.MaskedPaths, s.Linux.ReadonlyPaths
	}
	for i, m := range s.Mounts {
		am := &agentapi.Mount{Destination: m.Destination, Type: m.Type, Source: m.Source, Options: m.Options}
		if isBind(m) {
			am.Type, am.Source = "bind", binds[i]
		}
		r.Mounts = append(r.Mounts, am)
	}
	return r
}

// resources are the limits of linux.resources that the guest applies to
// the container's cgroup (v2): memory, pids, and CPU quota, period and
// shares (nil when it sets none of them). Block I/O, hugepages, cpusets
// and realtime CPU are not applied.
func resources(r *specs.LinuxResources) *agentapi.Resources {
	if r == nil {
		return nil
	}
	var out agentapi.Resources
	if r.Memory != nil && r.Memory.Limit != nil && *r.Memory.Limit > 0 {
		out.MemoryMaxBytes = uint64(*r.Memory.Limit)
	}
	if r.Pids != nil && r.Pids.Limit > 0 {
		out.PidsMax = uint64(r.Pids.Limit)
	}
	if c := r.CPU; c != nil {
		if c.Quota != nil && *c.Quota > 0 {
			out.CpuQuotaUsec = uint64(*c.Quota)
		}
		if c.Period != nil {
			out.CpuPeriodUsec = *c.Period
		}
		if c.Shares != nil {
			out.CpuWeight = sharesToWeight(*c.Shares)
		}
	}
	if out.MemoryMaxBytes == 0 && out.PidsMax == 0 && out.CpuQuotaUsec == 0 && out.CpuPeriodUsec == 0 && out.CpuWeight == 0 {
		return nil
	}
	return &out
}

// sharesToWeight maps cgroup v1 CPU shares (2 to 262144, what CRI sends:
// 1024 per CPU requested) onto cgroup v2's cpu.weight (1 to 10000) the way
// runc and crun do, so a pod's weight in the guest is what it would be on
// a cgroup v2 node: 2 → 1, 1024 → 39, 262144 → 10000. 0 stays 0 (unset).
func sharesToWeight(shares uint64) uint64 {
	switch {
	case shares == 0:
		return 0
	case shares < 2:
		shares = 2
	case shares > 262144:
		shares = 262144
	}
	return 1 + (shares-2)*9999/262142
}

func hasOption(opts []string, names ...string) bool {
	for _, o := range opts {
		for _, n := range names {
			if o == n {
				return true
			}
		}
	}
	return false
}

// podNetNS is the network namespace the spec joins (linux.namespaces, type
// network, with a path): the one CNI set up for the pod, which CRI names
// in the sandbox's spec. "" when the spec has none or asks for a new one
// (ctr run, a hostNetwork pod): the VM then has loopback only.
func podNetNS(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// seccompFilter compiles the spec's linux.seccomp (containerd's
// RuntimeDefault profile, a Localhost one, or none) into the filter the
// agent installs in the guest before the container's program runs. System
// call names x86-64 lacks are skipped (profiles list several
// architectures') and logged; what the compiler refuses fails Create.
func seccompFilter(s *specs.Spec, log logrus.FieldLogger) (*agentapi.SeccompFilter, error) {
	if s.Linux == nil || s.Linux.Seccomp == nil {
		return nil, nil
	}
	f, err := seccomp.CompileOCI(s.Linux.Seccomp)
	if err != nil {
		return nil, fmt.Errorf("%w: linux.seccomp: %w", errdefs.ErrInvalidArgument, err)
	}
	if f == nil {
		return nil, nil
	}
	if len(f.Unknown) > 0 {
		log.Debugf("linux.seccomp: %d system call names unknown on x86-64, skipped: %v", len(f.Unknown), f.Unknown)
	}
	return &agentapi.SeccompFilter{Program: f.Program, Flags: f.Flags}, nil
}

// containerNamespaces maps the spec's PID, UTS and IPC entries of
// linux.namespaces to the guest: an entry without a path is a new
// namespace; one with a path, in a pod's later container, names the
// sandbox's (CRI gives every container the sandbox's IPC and UTS
// namespaces, and its PID namespace with shareProcessNamespace), so the
// container joins the sandbox container's; no entry (hostIPC, hostPID) is
// the guest's own. The pod's first container (sandboxID "") cannot join a
// path: it would name a namespace of the host.
func containerNamespaces(s *specs.Spec, sandboxID string) (*agentapi.ContainerNamespaces, error) {
	out := &agentapi.ContainerNamespaces{Of: sandboxID,
		Pid: agentapi.NamespaceMode_NAMESPACE_GUEST, Uts: agentapi.NamespaceMode_NAMESPACE_GUEST, Ipc: agentapi.NamespaceMode_NAMESPACE_GUEST}
	if s.Linux == nil {
		return out, nil
	}
	for _, ns := range s.Linux.Namespaces {
		var mode *agentapi.NamespaceMode
		switch ns.Type {
		case specs.PIDNamespace:
			mode = &out.Pid
		case specs.UTSNamespace:
			mode = &out.Uts
		case specs.IPCNamespace:
			mode = &out.Ipc
		case specs.CgroupNamespace:
			// A new one, rooted at the container's cgroup in the guest
			// (containerd asks for it on cgroup v2 hosts); joining one
			// by path is nothing CRI asks for.
			if ns.Path != "" {
				return nil, fmt.Errorf("%w: linux.namespaces: cgroup namespace %s: joining one is not supported", errdefs.ErrNotImplemented, ns.Path)
			}
			out.Cgroup = true
			continue
		default:
			continue // mount: always new; network: the VM's; user, time: not made
		}
		switch {
		case ns.Path == "":
			*mode = agentapi.NamespaceMode_NAMESPACE_NEW
		case sandboxID == "":
			return nil, fmt.Errorf("%w: linux.namespaces: %s namespace %s: the pod's first container cannot join a host namespace", errdefs.ErrNotImplemented, ns.Type, ns.Path)
		default:
			*mode = agentapi.NamespaceMode_NAMESPACE_JOIN
		}
	}
	return out, nil
}
