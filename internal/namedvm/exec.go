package namedvm

import (
	"context"
	"fmt"
	"time"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/vms"
)

// ExecOptions is a command for Exec: one to run through the agent of a
// running named VM (microvm exec --vm).
type ExecOptions struct {
	// VM is the VM's name.
	VM string
	// Command is the command as its caller gives it, which Exec completes
	// with the VM's defaults (WithDefaults): Command.Cmd.Env holds only
	// the caller's own variables, Cmd.Dir is "" unless the caller chose
	// one, Cmd.UID and Cmd.GID are nil unless it chose a user.
	Command agentvm.Command
}

// execDialTimeout bounds the wait for a named VM's agent to accept.
const execDialTimeout = 10 * time.Second

// Exec runs o's command through the agent of the running VM o.VM and
// returns its end as agentvm.RunCommand does. err is also for a VM that
// is not running or runs no agent, or whose agent cannot be reached (or
// Command.Interrupted's error, when a signal cancelled ctx meanwhile).
func Exec(ctx context.Context, o ExecOptions) (int, error) {
	e, err := liveAgent(o.VM)
	if err != nil {
		return 0, fmt.Errorf("exec: %w", err)
	}
	c := o.Command
	WithDefaults(&c.Cmd, e.Process)
	cc, err := AgentAddr(e, execDialTimeout).Dial(ctx)
	if err != nil {
		if c.Interrupted != nil {
			if serr := c.Interrupted(ctx); serr != nil {
				return 0, serr
			}
		}
		return 0, fmt.Errorf("exec: VM %s: %w", o.VM, err)
	}
	defer cc.Close()
	return agentvm.RunCommand(ctx, cc, c)
}

// WithDefaults completes cmd, as a caller gives it (see ExecOptions), with
// an image's process defaults d, as docker exec applies a container's:
// the image's environment with HOME added when it has none and each of
// cmd's variables replacing the one of its name; cmd's working directory,
// else the image's; cmd's user, else the image's if it names one. With d
// nil (a VM without an image) the environment is agentvm.BaseEnv followed
// by cmd's variables, and the working directory cmd's, else /.
func WithDefaults(cmd *agentapi.Cmd, d *vms.Process) {
	if d == nil {
		cmd.Env = append(agentvm.BaseEnv(), cmd.Env...)
		if cmd.Dir == "" {
			cmd.Dir = "/"
		}
		return
	}
	env := agentvm.MergeEnv(d.Env, cmd.Env)
	if _, ok := agentvm.LookupEnv(env, "HOME"); !ok {
		home := "/root"
		if d.HasUser && d.UID != 0 {
			home = "/"
		}
		env = append(env, "HOME="+home)
	}
	cmd.Env = env
	if cmd.Dir == "" {
		cmd.Dir = d.WorkingDir
	}
	if cmd.UID == nil && d.HasUser {
		u, g := d.UID, d.GID
		cmd.UID, cmd.GID = &u, &g
	}
}

// ImageDefaults are an image's process settings as a named VM's record
// keeps them for exec --vm (WithDefaults).
func ImageDefaults(cfg image.Config) *vms.Process {
	return &vms.Process{Env: cfg.Env, WorkingDir: cfg.WorkingDir, HasUser: cfg.User != "", UID: cfg.UID, GID: cfg.GID}
}
