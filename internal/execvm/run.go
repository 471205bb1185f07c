package execvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/cachedisk"
)

// ConsoleKeep is how much of the guest console Run keeps, to show when
// the agent never answers or the VM ends under the command.
const ConsoleKeep = 64 << 10

// Options is one exec: the machine, the command's limits and the hooks.
type Options struct {
	// Config is the machine: kernel, CPUs, memory, devices, vsock, log.
	// Run sets its Initrd (without a Root disk) and its Console.
	Config microvm.Config
	// Image is the agent initramfs's sources, used when Config.Root is "".
	Image agentimage.Options
	// Warm is the warm start (exec --snapshot), or nil.
	Warm *WarmStart
	// cmd names the command in the disks' errors ("": exec).
	cmd string
	// BootTimeout is how long to wait for the agent to answer.
	BootTimeout time.Duration
	// Timeout is the command's own limit (0: none), the guest's to
	// enforce; Grace past it the host gives up on the guest and stops the
	// VM.
	Timeout, Grace time.Duration
	// Name is the command (its argv[0]) in messages.
	Name string
	// Caches are the cache disks, checked out of CacheStore; not with
	// Warm.
	Caches     []Cache
	CacheStore *cachedisk.Store
	// Docker, when not nil, starts Docker in the guest before the
	// command; not with Warm.
	Docker *Docker
	// SetUpEnv is the environment of the guest steps that mount the
	// caches and start Docker (the image's, as the command gets it).
	SetUpEnv []string
	Hooks
}

// Hooks are what only the caller has; Run calls each, so none may be nil.
type Hooks struct {
	// Interruptible returns a context that a signal cancels and its stop;
	// Run calls it once the machine is made.
	Interruptible func(context.Context) (context.Context, func())
	// SignalStatus is the caller's error when a signal cancelled ctx (a
	// context from Interruptible), else nil.
	SignalStatus func(ctx context.Context) error
	// Confine enters the caller's jail (chroot, seccomp filter) between
	// the machine's construction and its run.
	Confine func() error
	// Progress shows what is waited for until stop is called.
	Progress func(what string) (stop func())
	// Command runs the command through the agent on cc.
	Command func(ctx context.Context, cc *agentapi.Conn) error
	// CommandEnded reports whether Command's err is the command's own end
	// (its status), which the VM's end must not override.
	CommandEnded func(err error) bool
}

// Run boots the VM (or restores a clone of Warm's snapshot), waits for
// the agent (then, for a warm start's first run, snapshots the VM), runs
// the command and returns Hooks.Command's error, a Hooks.SignalStatus
// error, or why the VM could not run it. Run reaches the agent in-process
// (Machine.DialVsock): the vsock device has no Unix socket, and nothing
// of Run's lies in the file system once the VM is set up, so a chroot and
// a seccomp filter entered by Hooks.Confine need no room for it.
func Run(o Options) (err error) {
	console := &agentvm.TailBuffer{Max: ConsoleKeep}
	if o.Warm != nil && (len(o.Caches) > 0 || o.Docker != nil) {
		return fmt.Errorf("exec: %w: caches and Docker are not for a warm start", microvm.ErrConfig)
	}
	if o.Warm != nil && o.Warm.snap != nil {
		m, err := o.Warm.restore(o.Config, console)
		if err != nil {
			return err
		}
		defer m.Close()
		return runIn(o, m, console, nil)
	}
	// With a Root disk the guest boots from it, whose /init must be the
	// agent; otherwise from the agent's initramfs, written to a temporary
	// file that is removed once New has loaded it.
	cfg := o.Config
	cfg.Console = console
	// The caches and Docker's data disk: committed or discarded, and
	// removed, once the machine is closed (this defer runs after its).
	x, err := attachDisks(context.Background(), &cfg, o)
	if err != nil {
		return err
	}
	defer func() {
		if ferr := x.finish(err == nil); ferr != nil && err == nil {
			err = ferr
		}
	}()
	if cfg.Root == "" {
		f, err := os.CreateTemp("", "microvm-exec-*.cpio")
		if err != nil {
			return fmt.Errorf("exec: guest image: %w", err)
		}
		cfg.Initrd = f.Name()
		f.Close()
		defer os.Remove(cfg.Initrd) // gone already unless New failed
		if err := agentimage.WriteFile(cfg.Initrd, o.Image); err != nil {
			return fmt.Errorf("exec: guest image: %w", err)
		}
	}
	m, err := microvm.New(cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	if cfg.Initrd != "" {
		// Loaded into guest memory by New.
		if err := os.Remove(cfg.Initrd); err != nil {
			return fmt.Errorf("exec: %w", err)
		}
	}
	return runIn(o, m, console, x)
}

// runIn runs m, waits for its agent (then, for a warm start's first run,
// snapshots it), adopts a clone's MACs and runs the command supervised.
func runIn(o Options, m *microvm.Machine, console *agentvm.TailBuffer, x *extraDisks) error {
	sigCtx, stop := o.Interruptible(context.Background())
	defer stop()
	if err := o.Confine(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(sigCtx)
	defer cancel()
	vmDone := make(chan struct{})
	var res microvm.Result
	var runErr error
	go func() {
		defer close(vmDone)
		res, runErr = m.Run(ctx)
	}()
	defer func() { cancel(); <-vmDone }()

	what := "exec: booting the VM and waiting for its agent"
	if o.Warm != nil && o.Warm.snap != nil {
		what = "exec: waiting for the restored VM's agent"
	}
	stopProgress := o.Progress(what)
	cc, err := agentvm.Wait(ctx, m, o.BootTimeout, vmDone)
	if err == nil && o.Warm != nil && o.Warm.snap == nil {
		cc, err = o.Warm.save(ctx, o, m, cc, vmDone)
	}
	if err == nil {
		if err = agentapi.AdoptMACs(ctx, m, cc); err != nil {
			cc.Close()
		}
	}
	stopProgress()
	if err != nil {
		if serr := o.SignalStatus(sigCtx); serr != nil {
			return serr
		}
		select {
		case <-vmDone:
			err = fmt.Errorf("%w (the VM ended: %s)", err, agentvm.End(res, runErr))
		default:
		}
		return fmt.Errorf("exec: %w; guest console:\n%s", err, strings.TrimRight(console.String(), "\n"))
	}
	defer cc.Close()
	setUp := agentvm.AgentRunner{Client: agentapi.NewClient(cc), Env: o.SetUpEnv}
	err, cut := agentvm.Supervise(sigCtx, vmDone, o.Timeout, o.Grace,
		func(ctx context.Context) error {
			if err := x.setUp(ctx, setUp); err != nil {
				return err
			}
			if err := o.Command(ctx, cc); err != nil {
				return err
			}
			// The command succeeded; caches it could not keep are a
			// warning, not its failure.
			if err := x.writeBack(ctx, setUp); err != nil && o.Config.Log != nil {
				o.Config.Log.Warn(err)
			}
			return nil
		},
		func(err error) bool { return !o.CommandEnded(err) })
	var gu agentvm.UnresponsiveError
	if errors.As(cut, &gu) {
		return fmt.Errorf("exec: %s: %w; the VM was stopped; guest console:\n%s",
			o.Name, gu, strings.TrimRight(console.String(), "\n"))
	}
	if errors.Is(cut, agentvm.ErrVMEnded) {
		return fmt.Errorf("exec: %w while %s ran (%s); guest console:\n%s",
			agentvm.ErrVMEnded, o.Name, agentvm.End(res, runErr), strings.TrimRight(console.String(), "\n"))
	}
	return err
}
