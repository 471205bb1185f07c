package containerdshim

import (
	"fmt"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/microvm/microvm/guest/agentapi"
)

// The terminal size of a process whose spec gives none.
const defaultRows, defaultCols = 24, 80

// execStart turns an OCI process into the agent's ExecStart: argv, env,
// working directory, uid and gid, and a terminal. docs/containerd.md lists
// what else of the spec is honoured and what is refused.
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
		Argv: p.Args,
		Env:  p.Env,
		Dir:  p.Cwd,
		Uid:  &uid,
		Gid:  &gid,
	}
	if p.Terminal {
		st.Pty = &agentapi.PtySize{Rows: defaultRows, Cols: defaultCols}
		if p.ConsoleSize != nil && p.ConsoleSize.Height > 0 && p.ConsoleSize.Width > 0 {
			st.Pty = &agentapi.PtySize{Rows: uint32(p.ConsoleSize.Height), Cols: uint32(p.ConsoleSize.Width)}
		}
	}
	return st, nil
}

// guestMountTypes are the spec mount types the guest provides itself:
// its kernel's /proc, /sys and /dev, shared by the VM's processes.
var guestMountTypes = map[string]bool{
	"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true,
	"cgroup": true, "cgroup2": true,
}

// checkSpec refuses what the shim cannot honour yet, with an error that
// names it, rather than run the container without it.
func checkSpec(s *specs.Spec) error {
	if s.Root != nil && s.Root.Readonly {
		return fmt.Errorf("%w: root.readonly: a read-only root file system is not supported yet", errdefs.ErrNotImplemented)
	}
	for _, m := range s.Mounts {
		if m.Type == "bind" || hasOption(m.Options, "bind", "rbind") {
			return fmt.Errorf("%w: mount %s: bind mounts (volumes) are not supported yet", errdefs.ErrNotImplemented, m.Destination)
		}
		if guestMountTypes[m.Type] {
			continue
		}
		return fmt.Errorf("%w: mount %s: type %q is not supported", errdefs.ErrNotImplemented, m.Destination, m.Type)
	}
	return nil
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
