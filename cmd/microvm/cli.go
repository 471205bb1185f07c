package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/seccomp"
	"github.com/microvm/microvm/vsock"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// usageError marks errors that exit with status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// statusError carries a process exit status chosen by the guest.
type statusError struct{ status int }

func (s statusError) Error() string { return fmt.Sprintf("exit status %d", s.status) }

// statusFailure is what exec and the agent commands exit with when microvm
// or the VM failed rather than the command: a kernel, agent or image file
// that is missing or bad, a VM that did not boot or died, an agent that
// did not answer or was lost, a guest that had to be stopped. The command's
// own status passes through unchanged; commands do not normally exit 125
// (docker run uses it for its own errors too), so a CI driver tells a
// failed job from a failed runner by it. Usage errors stay 2. README,
// "Exit status".
const statusFailure = 125

// failure marks an error of microvm or the VM, not of the guest command:
// Main exits statusFailure.
type failure struct{ err error }

func (f failure) Error() string { return f.err.Error() }
func (f failure) Unwrap() error { return f.err }

// Main runs the CLI and returns the process exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdin, stdout, stderr)
	var unknown string
	app.CommandNotFound = func(_ *cli.Context, name string) { unknown = name }
	err := app.Run(args)
	if unknown != "" {
		fmt.Fprintf(stderr, "microvm: unknown command %q (see microvm --help)\n", unknown)
		return microvm.StatusUsage
	}
	return exitStatus(err, stderr)
}

// exitStatus is the process exit status for what a command returned, and
// writes its one line to stderr (when not nil) for an error.
func exitStatus(err error, stderr io.Writer) int {
	say := func() {
		if stderr != nil {
			fmt.Fprintf(stderr, "microvm: %v\n", err)
		}
	}
	var se statusError
	var ue usageError
	var fl failure
	switch {
	case err == nil:
		return 0
	case errors.As(err, &se):
		return se.status
	case errors.As(err, &ue), errors.Is(err, microvm.ErrConfig):
		say()
		return microvm.StatusUsage
	case errors.As(err, &fl):
		say()
		return statusFailure
	default:
		say()
		return microvm.StatusError
	}
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "microvm",
		Usage:     "a KVM micro-VM monitor with built-in virtio-vsock, virtio-blk and virtio-rng devices",
		Version:   Version,
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed once, by Main, with the right exit status.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   onUsageError,
		Commands: append([]*cli.Command{
			runCommand(stdin, stdout, stderr),
			execCommand(stdin, stdout, stderr),
			agentCommand(stdin, stdout, stderr),
			initramfsCommand(),
			mkfsCommand(),
			vhostUserVsockCommand(stdout, stderr),
			connectCommand(stdin, stdout, stderr),
			imageCommand(stdout, stderr),
			ciCommand(stdout, stderr),
			{
				Name:         "version",
				Usage:        "print the version",
				OnUsageError: onUsageError,
				Action: func(c *cli.Context) error {
					if c.NArg() > 0 {
						return usagef("version takes no arguments")
					}
					fmt.Fprintf(stdout, "microvm %s\n", Version)
					return nil
				},
			},
		}, namedCommands(stdin, stdout, stderr)...),
	}
}

// binDir is the directory of the running microvm binary, where the default
// agent and kernel are looked for.
func binDir() string {
	exe, _ := os.Executable()
	return filepath.Dir(exe)
}

// isSet says whether the command line gave the flag name. It stands in for
// urfave/cli's Context.IsSet, which looks an unset flag up through every
// flag's Names, each running a regexp: on `run` that was half of
// start-up's allocations, and the regexp engine's code on the start-up
// path (docs/benchmarks.md, "Start-up"). LocalFlagNames visits only the
// flags given.
func isSet(c *cli.Context, name string) bool {
	for _, n := range c.LocalFlagNames() {
		if n == name {
			return true
		}
	}
	return false
}

// onUsageError turns flag parsing errors into usage errors (exit status 2)
// without printing the whole help text.
func onUsageError(_ *cli.Context, err error, _ bool) error { return usageError{err} }

// logFlags are --log-level and --log-format, on every command that logs.
func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "diagnostics on stderr: panic, fatal, error, warn, info, debug or trace"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "diagnostics as text lines, or json: one JSON object a line, for machines"},
	}
}

func setupLog(c *cli.Context, stderr io.Writer) (*logrus.Logger, error) {
	lvl, err := logrus.ParseLevel(c.String("log-level"))
	if err != nil {
		return nil, usagef("--log-level %q: want one of panic, fatal, error, warn, info, debug, trace", c.String("log-level"))
	}
	l := logrus.New()
	l.SetOutput(stderr)
	l.SetLevel(lvl)
	switch f := c.String("log-format"); f {
	case "text", "":
		l.SetFormatter(&logrus.TextFormatter{DisableTimestamp: false, FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	case "json":
		l.SetFormatter(jsonFormatter{})
	default:
		return nil, usagef("--log-format %q: want text or json", f)
	}
	return l, nil
}

func runCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "run",
		Usage:        "boot a guest kernel",
		OnUsageError: onUsageError,
		UsageText:    "microvm run --kernel PATH [--initrd PATH] [--cmdline STR] [--cpus N] [--memory SIZE] [--irqchip split|kernel] [--acpi on|off] [--cpu-hide LIST] [--vsock-cid N --vsock-uds PATH [--vsock-opt LIST]] " + deviceSynopsis() + " [--chroot DIR] [--uid N --gid N] [--seccomp=off] [--log-level LEVEL]",
		Flags: append(append(append([]cli.Flag{
			&cli.StringFlag{Name: "kernel", Usage: "kernel image: bzImage, PVH ELF or x86-64 vmlinux (required)"},
			&cli.StringFlag{Name: "initrd", Usage: "initial ramdisk"},
			&cli.StringFlag{Name: "cmdline", Usage: "kernel command line"},
			&cli.IntFlag{Name: "cpus", Value: microvm.DefaultCPUs, Usage: fmt.Sprintf("number of vCPUs (1..%d)", microvm.MaxCPUs)},
			&cli.StringFlag{Name: "memory", Value: microvm.FormatSize(microvm.DefaultMemory), Usage: "guest RAM: a number with an optional K/M/G/T suffix; a bare number means MiB (8M..1T, a multiple of 2M)"},
			&cli.StringFlag{Name: "cpu-hide", Usage: "comma-separated CPUID features to hide from the guest (e.g. cx16,xsave)"},
			&cli.StringFlag{Name: "irqchip", Value: string(microvm.IRQChipSplit), Usage: "interrupt controllers: split (LAPIC in KVM, IOAPIC in microvm, no PIC/PIT) or kernel (KVM's PIC, IOAPIC and PIT)"},
			&cli.StringFlag{Name: "acpi", Value: "on", Usage: "ACPI tables and power registers (on: a guest's poweroff ends microvm); off: CPUs in the MP table only"},
			&cli.Uint64Flag{Name: "vsock-cid", Usage: "add a virtio-vsock device with this guest CID (>= 3)"},
			&cli.StringFlag{Name: "vsock-uds", Usage: "host Unix socket of the vsock device (clients send CONNECT <port>)"},
		}, append(vsockLimitFlags("vsock-"), vsockOptFlag())...), deviceFlags()...), append(append(append(privilegeFlags(), seccompFlag()), logFlags()...), namedFlags()...)...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 && !isSet(c, "image") { // an image's main process takes arguments
				return usagef("run: unexpected argument %q", c.Args().First())
			}
			if isSet(c, "name") || c.Bool("detach") || c.Bool("with-agent") || isSet(c, "image") {
				return runNamed(c, stdin, stdout, stderr)
			}
			log, err := setupLog(c, stderr)
			if err != nil {
				return err
			}
			cfg, err := runConfig(c)
			if err != nil {
				return err
			}
			if elsewhere, err := runInFullBuild(cfg); elsewhere {
				return err
			}
			ids, err := readPrivilegeFlags(c)
			if err != nil {
				return err
			}
			root, err := readChroot(c)
			if err != nil {
				return err
			}
			if cfg.Vsock != nil {
				if err := chrootPath(root, &cfg.Vsock.UDSPath, "--vsock-uds"); err != nil {
					return err
				}
			}
			if err := chrootPath(root, &cfg.MetricsSocket, "--metrics-socket"); err != nil {
				return err
			}
			cfg.Log = log
			cfg.Console = stdout
			cfg.ConsoleInput = stdin
			return runMachine(cfg, log, func() error {
				if err := enterChroot(root, log); err != nil {
					return err
				}
				if err := dropPrivileges(ids, log); err != nil {
					return err
				}
				return confine(c, vmmPolicy(cfg), log)
			})
		},
	}
}

// vmmPolicy is the seccomp allow-list for a machine of cfg: on a
// user-mode network microvm also reaps its microvm-net process.
func vmmPolicy(cfg microvm.Config) seccomp.Policy {
	if cfg.HasUserNet() {
		return seccomp.VMMUserNet()
	}
	return seccomp.VMM()
}

func runConfig(c *cli.Context) (microvm.Config, error) {
	if c.String("kernel") == "" {
		return microvm.Config{}, usagef("run: --kernel is required")
	}
	return runConfigNoKernelCheck(c)
}

// runConfigNoKernelCheck is runConfig for a named VM, whose kernel may
// default (named.go).
func runConfigNoKernelCheck(c *cli.Context) (microvm.Config, error) {
	mem, err := microvm.ParseSize(c.String("memory"))
	if err != nil {
		return microvm.Config{}, usagef("--memory: %v", err)
	}
	if n := c.Int("cpus"); n < 1 || n > microvm.MaxCPUs {
		return microvm.Config{}, usagef("--cpus %d: want 1..%d", n, microvm.MaxCPUs)
	}
	var noACPI bool
	switch a := c.String("acpi"); a {
	case "on":
	case "off":
		noACPI = true
	default:
		return microvm.Config{}, usagef("--acpi %q: want on or off", a)
	}
	cfg := microvm.Config{
		NoACPI:      noACPI,
		Kernel:      c.String("kernel"),
		Initrd:      c.String("initrd"),
		Cmdline:     c.String("cmdline"),
		CPUs:        c.Int("cpus"),
		MemoryBytes: mem,
		IRQChip:     microvm.IRQChip(c.String("irqchip")),
	}
	if h := c.String("cpu-hide"); h != "" {
		cfg.HideCPUFeatures = strings.Split(h, ",")
	}
	if err := readDeviceFlags(c, &cfg); err != nil {
		return cfg, err
	}
	if isSet(c, "vsock-opt") && !isSet(c, "vsock-cid") {
		return cfg, usagef("--vsock-opt needs a vsock device (--vsock-cid and --vsock-uds)")
	}
	if isSet(c, "vsock-cid") || isSet(c, "vsock-uds") {
		if !isSet(c, "vsock-cid") || !isSet(c, "vsock-uds") {
			return cfg, usagef("--vsock-cid and --vsock-uds go together")
		}
		lim, err := readVsockLimits(c, "vsock-")
		if err != nil {
			return cfg, err
		}
		opts, err := parseVsockOpt(c.String("vsock-opt"))
		if err != nil {
			return cfg, err
		}
		cfg.Vsock = &microvm.VsockConfig{
			CID:            c.Uint64("vsock-cid"),
			UDSPath:        c.String("vsock-uds"),
			MaxConnections: lim.maxConns,
			ConnBuffer:     int(lim.connBuffer),
			BufferTotal:    lim.bufferTotal,
			ConnectTimeout: lim.connectTimeout,
			Options:        &opts.Options,
			Dgram:          opts.Dgram,
		}
	}
	return cfg, nil
}

// vsockLimitFlags are the vsock device's limit flags, shared by `run`
// (prefix "vsock-") and `vhost-user-vsock` (no prefix, the names
// vhost-device-vsock uses): max-conns, conn-buffer, buffer-total,
// connect-timeout.
func vsockLimitFlags(prefix string) []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: prefix + "max-conns", Value: vsock.DefaultMaxConns, Usage: "most vsock connections open at once"},
		&cli.StringFlag{Name: prefix + "conn-buffer", Value: "256K", Usage: "per-connection vsock buffer, up to 1G (SIZE; a bare number means bytes)"},
		&cli.StringFlag{Name: prefix + "buffer-total", Value: "64M", Usage: "guest->host bytes all vsock connections together may make the device buffer, at least max-conns x 4K (the default grows to that); past it the guest gets less credit, nobody is reset (SIZE)"},
		&cli.DurationFlag{Name: prefix + "connect-timeout", Value: vsock.DefaultConnectTimeout, Usage: "deadline for a host client's CONNECT line and for the guest's answer"},
	}
}

// vsockLimits are the checked values of vsockLimitFlags.
type vsockLimits struct {
	maxConns       int
	connBuffer     uint32
	bufferTotal    uint64
	connectTimeout time.Duration
}

// readVsockLimits reads and checks the limit flags named with prefix.
func readVsockLimits(c *cli.Context, prefix string) (vsockLimits, error) {
	lim := vsockLimits{maxConns: c.Int(prefix + "max-conns"), connectTimeout: c.Duration(prefix + "connect-timeout")}
	if lim.maxConns < 1 {
		return lim, usagef("--%smax-conns %d: want at least 1", prefix, lim.maxConns)
	}
	buf, err := microvm.ParseBytes(c.String(prefix + "conn-buffer"))
	if err != nil || buf == 0 || buf > vsock.MaxConnBuffer {
		return lim, usagef("--%sconn-buffer %q: want a size between 1 byte and 1G", prefix, c.String(prefix+"conn-buffer"))
	}
	lim.connBuffer = uint32(buf)
	total, err := microvm.ParseBytes(c.String(prefix + "buffer-total"))
	if err != nil || total == 0 {
		return lim, usagef("--%sbuffer-total %q: want a size of at least 1 byte", prefix, c.String(prefix+"buffer-total"))
	}
	// Left unset, the device's default: 64M, or more when max-conns
	// connections' minimum windows need it.
	if isSet(c, prefix+"buffer-total") {
		if least := vsock.MinMaxBuffered(lim.maxConns, lim.connBuffer); total < least {
			return lim, usagef("--%sbuffer-total %q: below --%smax-conns %d times the minimum window each connection is sure of (%d bytes): want at least %d bytes",
				prefix, c.String(prefix+"buffer-total"), prefix, lim.maxConns, least/uint64(lim.maxConns), least)
		}
		lim.bufferTotal = total
	}
	if lim.connectTimeout <= 0 {
		return lim, usagef("--%sconnect-timeout %v: want a positive duration", prefix, lim.connectTimeout)
	}
	return lim, nil
}

// namedFlags are run's flags for a named VM (named.go): --name, --detach,
// --with-agent and the agent image's flags.
func namedFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "name", Usage: "a named VM: its state, control socket, vsock socket and console log live under $MICROVM_STATE_DIR/vms/NAME; microvm ls, stop, kill, rm, logs, exec --vm and cp reach it by name"},
		&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Usage: "with --name: return once the VM runs (and its agent answers, with --with-agent); the VM goes on in the background"},
		&cli.BoolFlag{Name: "with-agent", Usage: "the guest runs microvm's agent: boot exec's agent image (unless --initrd or --root gives one whose /init is the agent)"},
		&cli.DurationFlag{Name: "boot-timeout", Value: 2 * time.Minute, Usage: "with --detach --with-agent: how long to wait for the agent"},
		&cli.BoolFlag{Name: "idle", Usage: "with --image: start no main process (the image's Entrypoint/Cmd); the VM runs until stopped, for exec --vm"},
	}, append(rootImageFlags(), imageFlags()...)...)
}

// rootImageFlags choose an OCI image as the guest's root file system, for
// exec and run; readRootImageFlags reads them.
func rootImageFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "image", Usage: "an OCI image (microvm image pull/import/ls) as the root file system, read-only and shared, under a private copy-on-write layer; pulled when not stored; implies --with-agent"},
		&cli.StringFlag{Name: "overlay-size", Usage: "with --image: the limit of the copy-on-write layer, a tmpfs in guest RAM (SIZE; default half of --memory)"},
	}
}

// listFlag is a repeatable flag that keeps each value whole, in order. A
// cli.StringSliceFlag would split values at commas, and its JSON
// (de)serialisation would link encoding/json into the lean build, 86 KB on
// `microvm run`'s start-up path.
type listFlag struct{ vals []string }

func (l *listFlag) Set(s string) error { l.vals = append(l.vals, s); return nil }
func (l *listFlag) String() string     { return strings.Join(l.vals, " ") }

// imageFlags say what goes into the agent image, for exec, initramfs and
// run --with-agent; readImageFlags reads them.
func imageFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "agent", Usage: "static guest agent binary (default: microvm-agent next to the microvm binary)"},
		&cli.StringFlag{Name: "busybox", Value: "/bin/busybox", Usage: "static busybox for sh and the core utilities in the guest (\"\" leaves it out)"},
		&cli.GenericFlag{Name: "add", Usage: "copy host file or directory SRC to guest path DST (repeatable)", Value: &listFlag{}},
	}
}

// runMachine boots the guest and turns its end into an exit status: the
// status the guest chose, 0 for a reset or power-off, 125 for a triple fault,
// 128+signal when a SIGINT or SIGTERM stopped it. confine runs between
// setting the machine up and running it.
func runMachine(cfg microvm.Config, log *logrus.Logger, confine func() error) error {
	m, err := microvm.New(cfg)
	if err != nil {
		return err
	}
	defer m.Close()

	ctx, stop := interruptible(context.Background())
	defer stop()
	if err := confine(); err != nil {
		return err
	}
	res, err := m.Run(ctx)
	if err != nil {
		return err
	}
	log.WithField("reason", res.Kind).WithField("status", res.Status).Info("guest stopped")
	switch res.Kind {
	case microvm.ExitCanceled:
		if serr := signalStatus(ctx, log); serr != nil {
			return serr
		}
		return statusError{microvm.StatusError}
	default:
		if res.Status != 0 {
			return statusError{res.Status}
		}
		return nil
	}
}
