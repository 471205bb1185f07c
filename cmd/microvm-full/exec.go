package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/images"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/kernelpath"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/vms"
)

// agentPort is the agent's vsock port (also agent's default --port).
const agentPort = agentvm.Port

func execCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "exec",
		Usage:        execUsage,
		OnUsageError: onUsageError,
		// -it, as docker takes it.
		UseShortOptionHandling: true,
		UsageText: "microvm exec [--kernel K] [--cpus N] [--memory M] [--add SRC:DST]... [--env K=V]... " +
			"[--workdir DIR] [--timeout D] " + deviceSynopsis() + " [--chroot DIR] [--seccomp=off] -- CMD [ARG...]\n" +
			"microvm exec --vm NAME [--env K=V]... [--workdir DIR] [--timeout D] -- CMD [ARG...]",
		Flags: concatFlags(
			[]cli.Flag{
				&cli.StringFlag{Name: "vm", Usage: "run CMD in the running named VM NAME (microvm run --name NAME --with-agent) instead of a fresh one"},
				&cli.StringFlag{Name: "kernel", Usage: "guest kernel (default: build/kernel/bzImage next to the microvm binary's bin/, or $MICROVM_KERNEL)"},
				&cli.StringFlag{Name: "snapshot", Usage: "warm start: run CMD in a clone of the snapshot in DIR, made by the first exec with DIR once its agent answered (docs/snapshot.md)"},
			},
			cliFlags(clibase.RootImageFlags(), clibase.ImageFlags()),
			[]cli.Flag{
				&cli.IntFlag{Name: "cpus", Value: microvm.DefaultCPUs, Usage: fmt.Sprintf("number of vCPUs (1..%d)", microvm.MaxCPUs)},
				&cli.StringFlag{Name: "memory", Value: microvm.FormatSize(microvm.DefaultMemory), Usage: "guest RAM (SIZE)"},
			},
			guestCmdFlags(),
			cliFlags(clibase.DeviceFlags()),
			[]cli.Flag{
				&cli.GenericFlag{Name: "cache", Value: &clibase.ListFlag{}, Usage: "NAME=GUESTPATH[,size=SIZE]: mount a private copy of the cache disk NAME at GUESTPATH; when CMD exits 0 it is kept as NAME's next version (repeatable; microvm cache ls, docs/ci.md)"},
				&cli.StringFlag{Name: "cache-limit", Usage: "with --cache: after a commit, remove the oldest versions of any cache in the store (never a cache's newest) until all versions take at most SIZE on disk"},
				&cli.BoolFlag{Name: "docker", Usage: "start the image's dockerd before CMD, its data root on a disk of the VM's own (or on a --cache at /var/lib/docker); exit status 122 when Docker does not come up (docs/ci.md)"},
				&cli.StringFlag{Name: "docker-disk", Usage: "the size of --docker's data disk (SIZE, sparse; default 8G)"},
				&cli.DurationFlag{Name: "docker-timeout", Value: dockervm.DefaultTimeout, Usage: "how long --docker waits for dockerd to answer"},
				&cli.DurationFlag{Name: "boot-timeout", Value: 2 * time.Minute, Usage: "how long to wait for the agent to answer"},
				&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "say nothing while the VM boots (on a terminal, a line tells the wait after a second)"},
			},
			cliFlags([]clibase.Opt{clibase.ChrootFlag(), clibase.SeccompFlag()}, clibase.LogFlags())),
		Action: func(c *cli.Context) error {
			log, err := clibase.SetupLog(c, stderr)
			if err != nil {
				return err
			}
			if clibase.IsSet(c, "vm") {
				return asFailure(execInVM(c, stdin, stdout, stderr, log))
			}
			o, err := execOptions(c)
			if err != nil {
				return asFailure(err)
			}
			if err := checkTTY(o.cmd, stdin); err != nil {
				return err
			}
			o.cmd.stdin, o.cmd.stdout, o.cmd.stderr, o.log = stdin, stdout, stderr, log
			if ref := c.String("image"); ref != "" {
				if err := o.useImage(c, ref); err != nil {
					return asFailure(err)
				}
			}
			policy := clibase.VMMPolicy(o.devices)
			if dir := c.String("snapshot"); dir != "" {
				if o.warm, err = o.checkWarmStart(dir); err != nil {
					return asFailure(err)
				}
				policy = policy.WithSnapshots()
			}
			if len(o.caches) > 0 || o.docker != nil {
				policy = policy.WithCacheCommits()
			}
			o.confine = func() error {
				if err := clibase.EnterChroot(o.root, log); err != nil {
					return err
				}
				return clibase.Confine(c, policy, log)
			}
			err = runExec(o)
			var de *dockervm.Error
			if errors.As(err, &de) {
				fmt.Fprintf(stderr, "microvm: %v\n", err)
				return clibase.StatusError{Status: dockervm.ExitStatus}
			}
			return asFailure(err)
		},
	}
}

// execOpts is a checked exec command line.
type execOpts struct {
	cmd         guestCmd
	kernel      string
	image       agentimage.Options
	cpus        int
	memory      uint64
	bootTimeout time.Duration
	quiet       bool // no progress line while booting (--quiet)
	// devices holds the disks, the root disk, the rng and the network devices.
	devices microvm.Config
	log     logrus.FieldLogger
	// root is --chroot's canonical path, or "".
	root string
	// img is --image's image, once found (or pulled); overlay is the size
	// of its writable layer (--overlay-size, 0 for the default).
	img     *image.Image
	overlay uint64
	// confine enters --chroot and installs the seccomp filter, between
	// New and Run.
	confine func() error
	// warm is --snapshot's warm start, or nil.
	warm *execvm.WarmStart
	// caches are --cache's disks; docker is --docker's, or nil.
	caches     []execvm.Cache
	cacheStore *cachedisk.Store
	docker     *execvm.Docker
}

func execOptions(c *cli.Context) (*execOpts, error) {
	o := &execOpts{cpus: c.Int("cpus"), bootTimeout: c.Duration("boot-timeout"), quiet: c.Bool("quiet")}
	cmd, err := readGuestCmd(c, "exec", "microvm exec [flags] -- CMD [ARG...]")
	if err != nil {
		return nil, err
	}
	o.cmd = cmd
	mem, err := microvm.ParseSize(c.String("memory"))
	if err != nil {
		return nil, clibase.Usagef("--memory: %v", err)
	}
	o.memory = mem
	if o.cpus < 1 || o.cpus > microvm.MaxCPUs {
		return nil, clibase.Usagef("--cpus %d: want 1..%d", o.cpus, microvm.MaxCPUs)
	}
	if o.bootTimeout <= 0 {
		return nil, clibase.Usagef("--boot-timeout %v: want a positive duration", o.bootTimeout)
	}
	if o.image, err = readImageFlags(c); err != nil {
		return nil, err
	}
	if err := clibase.ReadDeviceFlags(c, &o.devices); err != nil {
		return nil, err
	}
	if o.root, err = clibase.ReadChroot(c); err != nil {
		return nil, err
	}
	if err := clibase.ShareChroot(o.root, o.devices); err != nil {
		return nil, err
	}
	if err := clibase.ChrootPath(o.root, &o.devices.MetricsSocket, "--metrics-socket"); err != nil {
		return nil, err
	}
	if o.devices.Root != "" && clibase.IsSet(c, "add") {
		return nil, clibase.Usagef("--add puts files in the initramfs, which --root replaces; put them on the disk")
	}
	if o.overlay, err = readRootImageFlags(c, &o.image, o.devices.Root != ""); err != nil {
		return nil, err
	}
	if err := o.readCacheFlags(c); err != nil {
		return nil, err
	}
	var defaultKernel bool
	o.kernel, defaultKernel = kernelpath.Choose(c.String("kernel"), os.Getenv, kernelpath.BinDir())
	// Everything New would refuse in the configuration is a usage error
	// now, before an image is built or a file is looked at.
	if err := o.machineConfig("", nil).Check(); err != nil {
		return nil, err
	}
	if defaultKernel {
		if err := kernelpath.CheckDefault(o.kernel); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// useImage finds (or pulls) --image's image and applies its
// configuration to the command, as docker run does (applyImage).
func (o *execOpts) useImage(c *cli.Context, ref string) error {
	ctx, stop := clibase.Interruptible(context.Background())
	defer stop()
	img, err := findImage(ctx, ref, o.cmd.stderr, o.quiet)
	if err != nil {
		if serr := clibase.SignalStatus(ctx, o.log); serr != nil {
			return serr
		}
		return clibase.Failure{Err: fmt.Errorf("exec: %w", err)}
	}
	p, err := applyImage(img.Config, c.Args().Slice(), o.cmd.flagEnv, o.cmd.flagDir)
	if err != nil {
		return err
	}
	o.img = img
	o.cmd.argv, o.cmd.env, o.cmd.workdir = p.Argv, p.Env, p.Workdir
	if o.cmd.uid == nil {
		o.cmd.uid, o.cmd.gid = p.UID, p.GID
	}
	return nil
}

// machineConfig is the VM exec boots: the kernel, the initrd (none with
// --root), the devices, the console, the log.
func (o *execOpts) machineConfig(initrd string, console io.Writer) microvm.Config {
	cmdline := execvm.AgentCmdline
	if o.devices.Root != "" {
		cmdline = execvm.WithInit(cmdline)
	}
	cfg := microvm.Config{
		Kernel: o.kernel, Initrd: initrd, CPUs: o.cpus, MemoryBytes: o.memory,
		Cmdline: cmdline,
		Console: console, Log: o.log,
		Vsock: &microvm.VsockConfig{CID: execvm.CID},
		Disks: o.devices.Disks, Root: o.devices.Root, RNG: o.devices.RNG, Nets: o.devices.Nets,
		Shares: o.devices.Shares, MetricsSocket: o.devices.MetricsSocket,
	}
	if o.img != nil {
		images.Use(&cfg, o.img, o.overlay)
	}
	return cfg
}

// runExec is exec in a fresh VM (or a clone of --snapshot's): the
// machine, the command and exec's hooks, handed to execvm.Run; its error
// is the command's exit status as commandEnd returns it, or why the VM
// could not run it.
func runExec(o *execOpts) error {
	name := ""
	if len(o.cmd.argv) > 0 {
		name = o.cmd.argv[0]
	}
	return execvm.Run(execvm.Options{
		Config: o.machineConfig("", nil), Image: o.image, Warm: o.warm,
		BootTimeout: o.bootTimeout,
		// --timeout is the guest's to enforce; past it plus
		// unresponsiveGrace the host gives up on the guest and stops the VM.
		Timeout: o.cmd.timeout, Grace: unresponsiveGrace,
		Name:   name,
		Caches: o.caches, CacheStore: o.cacheStore, Docker: o.docker, SetUpEnv: o.cmd.env,
		Hooks: execvm.Hooks{
			Interruptible: clibase.Interruptible,
			SignalStatus:  func(ctx context.Context) error { return clibase.SignalStatus(ctx, o.log) },
			Confine:       o.confine,
			Progress:      func(what string) func() { return startProgress(o.cmd.stderr, o.quiet, what) },
			Command: func(ctx context.Context, cc *agentapi.Conn) error {
				return commandEnd(agentvm.RunCommand(ctx, cc, o.cmd.agentCommand("exec", o.log)))
			},
			CommandEnded: func(err error) bool { var se clibase.StatusError; return errors.As(err, &se) },
		},
	})
}

// unresponsiveGrace is how long past --timeout exec waits for the guest's
// report (the agent's kill, its output drain and TCG speed in the
// nested-KVM box fit well inside). A variable for tests.
var unresponsiveGrace = 30 * time.Second

// guestCmdFlags are the flags of a command run through the agent, shared
// by exec and agent exec; readGuestCmd reads them.
func guestCmdFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "env", Usage: "set K=V in the command's environment; a bare K passes microvm's own $K, off the command line (repeatable)"},
		&cli.StringFlag{Name: "workdir", Value: "/", Usage: "the command's working directory in the guest"},
		&cli.DurationFlag{Name: "timeout", Usage: "kill the command's process group after this long (0: no limit)"},
		&cli.StringFlag{Name: "user", Usage: "UID[:GID] to run the command as (default: the image's User, else the agent's, root)"},
		&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "run the command on a pseudo-terminal of the host terminal's size, the terminal in raw mode (stdin must be a terminal; stdout carries everything)"},
		&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "stdin attached: always so (stdin is streamed to the command); accepted so that docker's -it works"},
	}
}

// guestCmd is a checked command for the guest agent and the streams it
// is connected to.
type guestCmd struct {
	argv    []string
	env     []string
	workdir string
	timeout time.Duration
	// uid and gid, when not nil, are the process's credentials (--user,
	// or an image's User).
	uid, gid *uint32
	// tty runs the command on a pseudo-terminal in the guest, the host's
	// terminal in raw mode (-t).
	tty bool
	// flagEnv is --env's variables alone and flagDir --workdir ("" when
	// not given): what an image's defaults yield to (namedvm.WithDefaults).
	flagEnv []string
	flagDir string

	stdin          io.Reader
	stdout, stderr io.Writer
}

// readGuestCmd reads the command (the arguments) and guestCmdFlags. name
// starts error messages; form is the command line shown when no command
// is given.
func readGuestCmd(c *cli.Context, name, form string) (guestCmd, error) {
	cmd := guestCmd{argv: c.Args().Slice(), workdir: c.String("workdir"), timeout: c.Duration("timeout"), tty: c.Bool("tty")}
	if len(cmd.argv) == 0 && !clibase.IsSet(c, "image") { // an image has its own command
		return cmd, clibase.Usagef("%s: no command given (%s)", name, form)
	}
	if cmd.timeout < 0 {
		return cmd, clibase.Usagef("--timeout %v: must not be negative", cmd.timeout)
	}
	if !strings.HasPrefix(cmd.workdir, "/") {
		return cmd, clibase.Usagef("--workdir %q: want an absolute guest path", cmd.workdir)
	}
	if u := c.String("user"); u != "" {
		uid, gid, err := parseUser(u)
		if err != nil {
			return cmd, clibase.UsageError{Err: err}
		}
		cmd.uid, cmd.gid = &uid, &gid
	}
	env, err := envFlags(c.StringSlice("env"))
	if err != nil {
		return cmd, err
	}
	cmd.env, cmd.flagEnv = append(agentvm.BaseEnv(), env...), env
	if clibase.IsSet(c, "workdir") {
		cmd.flagDir = cmd.workdir
	}
	return cmd, nil
}

// parseUser reads --user: UID or UID:GID, numbers (a GID defaults to the
// UID, as a user's own group usually has its number).
func parseUser(s string) (uid, gid uint32, err error) {
	us, gs, hasGID := strings.Cut(s, ":")
	u, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("--user %q: want UID[:GID], numbers", s)
	}
	g := u
	if hasGID {
		if g, err = strconv.ParseUint(gs, 10, 32); err != nil {
			return 0, 0, fmt.Errorf("--user %q: want UID[:GID], numbers", s)
		}
	}
	return uint32(u), uint32(g), nil
}

// agentCommand is cmd as agentvm.RunCommand runs it: name starts
// messages, a signal's status (clibase.SignalStatus) ends it, and -t runs
// it on the host terminal (openTTY).
func (cmd guestCmd) agentCommand(name string, log logrus.FieldLogger) agentvm.Command {
	c := agentvm.Command{
		Cmd: agentapi.Cmd{
			Argv: cmd.argv, Env: cmd.env, Dir: cmd.workdir, UID: cmd.uid, GID: cmd.gid, Timeout: cmd.timeout,
			Stdin: cmd.stdin, Stdout: cmd.stdout, Stderr: cmd.stderr,
		},
		Name:        name,
		Interrupted: func(ctx context.Context) error { return clibase.SignalStatus(ctx, log) },
	}
	if cmd.tty {
		c.OpenTTY = func() (agentvm.TTY, error) { return agentTTY(cmd.stdin) }
	}
	return c
}

// commandEnd is agentvm.RunCommand's (or namedvm.Exec's) result as a
// command's error: nil for status 0, clibase.StatusError{N} for status N,
// and for err a failure, unless it is already a status (a signal's) or a
// usage error (-t without a terminal).
func commandEnd(status int, err error) error {
	if err != nil {
		return asFailure(err)
	}
	if status != 0 {
		return clibase.StatusError{Status: status}
	}
	return nil
}

// concatFlags joins flag lists.
func concatFlags(lists ...[]cli.Flag) []cli.Flag {
	var all []cli.Flag
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

// asFailure marks err a failure unless it is nil, the command's own
// status or a usage error.
func asFailure(err error) error {
	var se clibase.StatusError
	var ue clibase.UsageError
	var fl clibase.Failure
	if err == nil || errors.As(err, &se) || errors.As(err, &ue) || errors.As(err, &fl) || errors.Is(err, microvm.ErrConfig) {
		return err
	}
	return clibase.Failure{Err: err}
}

// execInVM is `microvm exec --vm NAME -- CMD`: CMD through the agent of a
// running named VM (namedvm.Exec), with exec's streams and statuses.
func execInVM(c *cli.Context, stdin io.Reader, stdout, stderr io.Writer, log logrus.FieldLogger) error {
	name := c.String("vm")
	if err := checkExecVM(name, c.LocalFlagNames()); err != nil {
		return err
	}
	cmd, err := readGuestCmd(c, "exec", "microvm exec --vm NAME [flags] -- CMD [ARG...]")
	if err != nil {
		return err
	}
	if err := checkTTY(cmd, stdin); err != nil {
		return err
	}
	cmd.stdin, cmd.stdout, cmd.stderr = stdin, stdout, stderr
	ctx, stop := clibase.Interruptible(context.Background())
	defer stop()
	ac := cmd.agentCommand("exec", log)
	// The command line's own environment and directory: namedvm.Exec
	// adds the VM's defaults.
	ac.Cmd.Env, ac.Cmd.Dir = cmd.flagEnv, cmd.flagDir
	return commandEnd(namedvm.Exec(ctx, namedvm.ExecOptions{VM: name, Command: ac}))
}

// checkExecVM checks exec --vm's VM name and the flags given (set, as
// LocalFlagNames lists them): the command's, not those that make a fresh
// VM.
func checkExecVM(name string, set []string) error {
	for _, f := range set {
		switch f {
		case "cache", "cache-limit", "docker", "docker-disk", "docker-timeout":
			return clibase.Usagef("--cache and --docker are for a fresh VM, not --vm")
		}
	}
	if err := vms.CheckName(name); err != nil {
		return clibase.UsageError{Err: fmt.Errorf("--vm: %w", err)}
	}
	for _, f := range set {
		switch f {
		case "vm", "env", "workdir", "timeout", "user", "tty", "t", "interactive", "i", "log-level", "log-format", "quiet", "q":
		default:
			return clibase.Usagef("exec --vm: --%s makes a fresh VM; the named VM has its own", f)
		}
	}
	return nil
}
