package main

// Named VMs: `microvm run --name NAME [--detach]` and the commands that
// reach a VM by its name. A named VM's process (internal/namedvm) keeps
// its state directory (internal/vms: record, lock, sockets, console log)
// and serves its control API (internal/vmctl) until the VM ends; the
// commands reach it through package named's VM.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/kernelpath"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/seccomp"
	"github.com/microvm/microvm/internal/vms"
	"github.com/microvm/microvm/named"
)

// runNamed is `microvm run` with --name, --detach or --with-agent.
func runNamed(c *cli.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	name := c.String("name")
	detach := c.Bool("detach")
	withAgent := c.Bool("with-agent") || clibase.IsSet(c, "image")
	child := namedvm.IsDetached()
	switch {
	case detach && name == "":
		return clibase.Usagef("--detach needs --name (the detached VM is reached by its name)")
	case name == "" && withAgent:
		return clibase.Usagef("--with-agent and --image need --name (exec --vm and cp reach the agent by the VM's name)")
	case clibase.IsSet(c, "vsock-uds"):
		return clibase.Usagef("--vsock-uds: a named VM's vsock socket is in its state directory (%s)", vms.VsockSocket)
	case clibase.IsSet(c, "chroot") || clibase.IsSet(c, "uid") || clibase.IsSet(c, "gid"):
		return clibase.Usagef("--chroot, --uid and --gid are not supported with --name yet")
	}
	docker, err := readDockerFlags(c)
	if err != nil {
		return err
	}
	if docker != nil && !withAgent {
		return clibase.Usagef("--docker needs --image or --with-agent: Docker is started through the guest's agent")
	}
	rc, err := readRunCaches(c, withAgent, docker != nil)
	if err != nil {
		return err
	}
	if err := vms.CheckName(name); err != nil {
		return clibase.UsageError{Err: err}
	}
	log, err := clibase.SetupLog(c, stderr)
	if err != nil {
		return err
	}
	if c.String("kernel") == "" && !withAgent {
		return clibase.Usagef("run: --kernel is required")
	}
	var img imageOpts
	if withAgent {
		if img, err = readAgentImage(c); err != nil {
			return err
		}
	}
	cfg, err := namedConfig(c, img)
	if err != nil {
		return err
	}
	if err := cfg.Check(); err != nil {
		return err
	}
	if ref := c.String("image"); ref != "" {
		// Found, or pulled with its progress on this terminal, before a
		// detached VM's process starts: it finds the image stored.
		ctx, stop := clibase.Interruptible(context.Background())
		img.root, err = findImage(ctx, ref, stderr, child)
		stop()
		if err != nil {
			return clibase.Failure{Err: fmt.Errorf("run: %w", err)}
		}
		img.rootRef = ref
		if !c.Bool("idle") {
			// The image's main process, as docker run starts it; an
			// image that names none (a root file system import) idles.
			env, err := envFlags(listValues(c, "env"))
			if err != nil {
				return err
			}
			if p, err := applyImage(img.root.Config, c.Args().Slice(), env, ""); err == nil {
				img.main = &p
			} else if c.NArg() > 0 {
				return err
			}
		}
	} else if clibase.IsSet(c, "idle") {
		return clibase.Usagef("--idle: only with --image")
	} else if len(listValues(c, "env")) > 0 {
		return clibase.Usagef("--env: only with --image (it sets the image's main process's environment)")
	}
	wait := time.Duration(0)
	if withAgent {
		wait = c.Duration("boot-timeout")
	}
	if docker != nil {
		wait += docker.Start.Timeout
	}
	if err := rc.checkMain(img.main != nil); err != nil {
		return err
	}
	if detach && !child {
		return startDetached(name, wait, stderr)
	}
	req := namedvm.BootRequest{Name: name, Config: cfg, Agent: withAgent, Image: img.root, ImageRef: img.rootRef,
		Overlay: img.overlay, Main: img.main, Docker: docker, Caches: rc.caches, CacheDir: rc.dir, CacheLimits: rc.limits}
	if img.build {
		req.AgentImage = &img.exec.image
	}
	return namedExit(namedvm.Boot(req, namedOptions(c, child, len(rc.caches) > 0, stdin, stdout, log)), stderr)
}

// imageOpts is the agent image a named VM boots, when it boots one.
type imageOpts struct {
	build bool // build exec's image (no --initrd, no --root)
	exec  *execOpts
	// root is --image's image (rootRef as the user named it) and overlay
	// its copy-on-write layer's size, when the VM runs one.
	root    *image.Image
	rootRef string
	overlay uint64
	// main is the image's main process (Entrypoint and Cmd, or the
	// command line's arguments), run once the agent answers: the VM ends
	// when it does, with its status. nil with --idle.
	main *namedvm.Process
}

// readAgentImage reads the image flags for --with-agent.
func readAgentImage(c *cli.Context) (imageOpts, error) {
	if c.String("initrd") != "" || c.String("root") != "" {
		return imageOpts{}, nil // the given image's /init must be the agent
	}
	o := &execOpts{}
	var err error
	if o.image, err = readImageFlags(c); err != nil {
		return imageOpts{}, err
	}
	overlay, err := readRootImageFlags(c, &o.image, false)
	if err != nil {
		return imageOpts{}, err
	}
	return imageOpts{build: true, exec: o, overlay: overlay}, nil
}

// namedConfig is run's configuration for a named VM: the kernel defaults
// as exec's does with --with-agent, and the command line to exec's.
func namedConfig(c *cli.Context, img imageOpts) (microvm.Config, error) {
	cfg, err := clibase.RunConfigNoKernelCheck(c)
	if err != nil {
		return cfg, err
	}
	var defaultKernel bool
	if cfg.Kernel, defaultKernel = kernelpath.Choose(cfg.Kernel, os.Getenv, kernelpath.BinDir()); defaultKernel {
		if err := kernelpath.CheckDefault(cfg.Kernel); err != nil {
			return cfg, err
		}
	}
	if img.build && cfg.Cmdline == "" {
		cfg.Cmdline = execvm.AgentCmdline
	}
	if cfg.Root != "" && c.Bool("with-agent") {
		cfg.Cmdline = execvm.WithInit(cfg.Cmdline)
	}
	// clibase.RunConfigNoKernelCheck made the device from --vsock-cid and the
	// vsock limits and options; the socket is the state directory's
	// (runNamed), the CID exec's unless --vsock-cid chose one.
	if cfg.Vsock == nil {
		cfg.Vsock = &microvm.VsockConfig{}
	}
	if cfg.Vsock.CID == 0 {
		cfg.Vsock.CID = execvm.CID
	}
	return cfg, nil
}

// startDetached is namedvm.StartDetached with its errors as the CLI's
// (namedExit).
func startDetached(name string, wait time.Duration, stderr io.Writer) error {
	return namedExit(namedvm.StartDetached(name, wait), stderr)
}

// namedExit is the one place a named VM's errors (namedvm.Boot, Run,
// StartDetached) become the CLI's: a failed setup (Docker) is its message
// on stderr and its exit status, a VM that ended badly its status, and
// one that microvm could not start or run a clibase.Failure.
func namedExit(err error, stderr io.Writer) error {
	var se namedvm.SetupError
	var ee namedvm.ExitError
	var fe namedvm.FailedError
	switch {
	case errors.As(err, &se):
		fmt.Fprintf(stderr, "microvm: %v\n", err)
		return clibase.StatusError{Status: se.Status}
	case errors.As(err, &ee):
		return clibase.StatusError{Status: ee.Status}
	case errors.As(err, &fe):
		return clibase.Failure{Err: err}
	}
	return err
}

// namedOptions are the CLI's choices for a named VM's process
// (namedvm.Boot, Run): its seccomp filter (with cache commits after the VM
// when cacheCommits), SIGINT/SIGTERM and SIGUSR1 handling, exec's failure
// status, and the ready line when the process is detached (the run
// --detach that started it waits for it: namedvm.IsDetached). Taking
// that descriptor (namedvm.TakeReady) ends what IsDetached says: a caller
// asks IsDetached before it calls namedOptions.
func namedOptions(c *cli.Context, detached, cacheCommits bool, stdin io.Reader, stdout io.Writer, log logrus.FieldLogger) namedvm.Options {
	policy := func(cfg microvm.Config) seccomp.Policy {
		p := clibase.VMMPolicy(cfg).WithSnapshots()
		if cacheCommits {
			p = p.WithCacheCommits() // after the VM, in this filtered process
		}
		return p
	}
	o := namedvm.Options{
		Stdin: stdin, Stdout: stdout, Log: log, BootTimeout: c.Duration("boot-timeout"),
		Interruptible: clibase.Interruptible,
		Inspect:       func(ctx context.Context, m *microvm.Machine) { clibase.InspectOnSIGUSR1(ctx, log, m) },
		Confine:       func(cfg microvm.Config) error { return clibase.Confine(c, policy(cfg), log) },
		FailureStatus: clibase.StatusFailure,
	}
	if detached {
		o.Ready = namedvm.TakeReady()
	}
	return o
}

// namedCommands are the commands that reach a named VM by its name.
func namedCommands(stdin io.Reader, stdout, stderr io.Writer) []*cli.Command {
	usage := map[string]string{}
	for _, n := range namedCommandNames {
		usage[n.name] = n.usage
	}
	one := func(c *cli.Context, what string) (string, error) {
		if c.NArg() != 1 {
			return "", clibase.Usagef("%s: want one VM name (got %d arguments)", what, c.NArg())
		}
		if err := vms.CheckName(c.Args().First()); err != nil {
			return "", clibase.UsageError{Err: err}
		}
		return c.Args().First(), nil
	}
	return []*cli.Command{
		{
			Name: "ls", Usage: usage["ls"], UsageText: "microvm ls [--json]", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "one JSON array of the VMs' records, for machines"}},
			Action: func(c *cli.Context) error {
				if c.NArg() > 0 {
					return clibase.Usagef("ls takes no arguments")
				}
				return listVMs(stdout, c.Bool("json"))
			},
		},
		{
			Name: "stop", Usage: usage["stop"], UsageText: "microvm stop [--timeout D] NAME", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long the guest has to power off before the VM is stopped"}},
			Action: func(c *cli.Context) error {
				name, err := one(c, "stop")
				if err != nil {
					return err
				}
				if c.Duration("timeout") < 0 {
					return clibase.Usagef("--timeout %v: must not be negative", c.Duration("timeout"))
				}
				return namedvm.Stop(name, false, c.Duration("timeout"))
			},
		},
		restoreCommand(stdin, stdout, stderr),
		{
			Name: "snapshot", Usage: usage["snapshot"], UsageText: "microvm snapshot [--stop] [--overwrite] [--diff] --out DIR NAME", OnUsageError: onUsageError,
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "out", Usage: "the snapshot's directory (must not exist, or hold a snapshot with --overwrite)"},
				&cli.BoolFlag{Name: "stop", Usage: "end the VM once the snapshot is written"},
				&cli.BoolFlag{Name: "overwrite", Usage: "replace the snapshot at --out"},
				&cli.BoolFlag{Name: "diff", Usage: "save only the memory pages written since the VM's previous snapshot (run --track-dirty-pages), against it"},
			},
			Action: func(c *cli.Context) error {
				name, err := one(c, "snapshot")
				if err != nil {
					return err
				}
				if c.String("out") == "" {
					return clibase.Usagef("snapshot: --out DIR is required")
				}
				out, err := filepath.Abs(c.String("out"))
				if err != nil {
					return clibase.Usagef("snapshot: --out %s: %v", c.String("out"), err)
				}
				// The VM's own process writes the snapshot (it holds the
				// VM), so the wait is bounded by the time that takes, not
				// by a fixed timeout.
				o := microvm.SnapshotOptions{Stop: c.Bool("stop"), Overwrite: c.Bool("overwrite"), Diff: c.Bool("diff")}
				return withNamedVM(name, 0, func(v named.VM, ctx context.Context) error { return v.Snapshot(ctx, out, o) })
			},
		},
		{
			Name: "kill", Usage: usage["kill"], UsageText: "microvm kill NAME", OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				name, err := one(c, "kill")
				if err != nil {
					return err
				}
				return namedvm.Stop(name, true, 0)
			},
		},
		{
			Name: "rm", Usage: usage["rm"], UsageText: "microvm rm [-f] NAME...", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "kill running VMs first"}},
			Action: func(c *cli.Context) error {
				if c.NArg() == 0 {
					return clibase.Usagef("rm: want VM names")
				}
				for _, name := range c.Args().Slice() {
					if err := vms.CheckName(name); err != nil {
						return clibase.UsageError{Err: err}
					}
				}
				return namedvm.Remove(c.Args().Slice(), c.Bool("force"))
			},
		},
		{
			Name: "logs", Usage: usage["logs"], UsageText: "microvm logs [-f] NAME", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing what the console says until the VM ends (or SIGINT)"}},
			Action: func(c *cli.Context) error {
				name, err := one(c, "logs")
				if err != nil {
					return err
				}
				ctx, stop := clibase.Interruptible(context.Background())
				defer stop()
				return named.Logs(ctx, stdout, name, c.Bool("follow"))
			},
		},
		{
			Name: "pause", Usage: usage["pause"], UsageText: "microvm pause NAME", OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				name, err := one(c, "pause")
				if err != nil {
					return err
				}
				return withNamedVM(name, 30*time.Second, named.VM.Pause)
			},
		},
		{
			Name: "resume", Usage: usage["resume"], UsageText: "microvm resume NAME", OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				name, err := one(c, "resume")
				if err != nil {
					return err
				}
				return withNamedVM(name, 30*time.Second, named.VM.Resume)
			},
		},
		namedCpCommand(stdin, stdout, stderr, usage["cp"]),
	}
}

// withNamedVM calls f, a NamedVM method, with the running VM name
// (namedvm.Lookup) and a context that ends after timeout (0: none).
func withNamedVM(name string, timeout time.Duration, f func(named.VM, context.Context) error) error {
	v, err := namedvm.Lookup(name)
	if err != nil {
		return err
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	return f(v, ctx)
}

// listVMs is `microvm ls`.
func listVMs(w io.Writer, asJSON bool) error {
	list, err := namedvm.List()
	if err != nil {
		return err
	}
	if asJSON {
		recs := make([]vms.Record, 0, len(list))
		for _, e := range list {
			recs = append(recs, e.Record)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(recs)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tPID\tCPUS\tMEMORY\tUP\tSTATUS\tWITH")
	for _, e := range list {
		up, pid, status := "-", "-", "-"
		if e.Alive {
			up = time.Since(e.Created).Round(time.Second).String()
			pid = strconv.Itoa(e.PID)
		} else if e.State == vms.StateExited {
			status = strconv.Itoa(e.ExitStatus)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.Name, e.State, pid, e.CPUs,
			microvm.FormatSize(e.MemoryBytes), up, status, e.Describe())
	}
	return tw.Flush()
}

// namedCpCommand is `microvm cp SRC DST` with NAME:/PATH on one side.
func namedCpCommand(stdin io.Reader, stdout, stderr io.Writer, usage string) *cli.Command {
	return &cli.Command{
		Name: "cp", Usage: usage, UsageText: "microvm cp [--keep-setuid] SRC DST   (one of them NAME:/PATH)", OnUsageError: onUsageError,
		Flags: append(cliFlags(clibase.LogFlags()), keepSetuidFlag),
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return clibase.Usagef("cp: want SRC and DST, one of them NAME:/PATH (got %d arguments)", c.NArg())
			}
			src, dst := c.Args().Get(0), c.Args().Get(1)
			name, guestSrc, guestDst := "", "", ""
			if n, p, ok := splitVMPath(src); ok {
				name, guestSrc = n, p
			}
			if n, p, ok := splitVMPath(dst); ok {
				if name != "" {
					return clibase.Usagef("cp: both SRC and DST name a VM; one side must be the host")
				}
				name, guestDst = n, p
			}
			if name == "" {
				return clibase.Usagef("cp: neither SRC nor DST is NAME:/PATH")
			}
			if guestSrc != "" {
				src = guestPrefix + guestSrc
			} else {
				dst = guestPrefix + guestDst
			}
			cp, err := parseCopy(src, dst)
			if err != nil {
				return err
			}
			cp.KeepSpecial = c.Bool(keepSetuidFlag.Name)
			log, err := clibase.SetupLog(c, stderr)
			if err != nil {
				return err
			}
			a, err := namedvm.Agent(name, 5*time.Second)
			if err != nil {
				return clibase.Failure{Err: fmt.Errorf("cp: %w", err)}
			}
			return copyWithAgent("cp", cp, a, stdin, stdout, log)
		},
	}
}

// splitVMPath splits "NAME:/PATH" (NAME a valid VM name, PATH absolute).
func splitVMPath(s string) (name, path string, ok bool) {
	n, p, found := strings.Cut(s, ":")
	if !found || vms.CheckName(n) != nil || !strings.HasPrefix(p, "/") {
		return "", "", false
	}
	return n, p, true
}
