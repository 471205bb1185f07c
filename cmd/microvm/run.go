package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/seccomp"
	"github.com/microvm/microvm/vsock"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// binDir is the directory of the running microvm binary, where the default
// agent and kernel are looked for.
func binDir() string {
	exe, _ := os.Executable()
	return filepath.Dir(exe)
}

// runOpts are `microvm run`'s flags, for both builds' parsers.
func runOpts() []opt {
	base := []opt{
		stringOpt("kernel", "", "kernel image: bzImage, PVH ELF or x86-64 vmlinux (required)"),
		stringOpt("initrd", "", "initial ramdisk"),
		stringOpt("cmdline", "", "kernel command line"),
		intOpt("cpus", microvm.DefaultCPUs, fmt.Sprintf("number of vCPUs (1..%d)", microvm.MaxCPUs)),
		stringOpt("memory", microvm.FormatSize(microvm.DefaultMemory), "guest RAM: a number with an optional K/M/G/T suffix; a bare number means MiB (8M..1T, a multiple of 2M)"),
		stringOpt("cpu-hide", "", "comma-separated CPUID features to hide from the guest (e.g. cx16,xsave)"),
		stringOpt("irqchip", string(microvm.IRQChipSplit), "interrupt controllers: split (LAPIC in KVM, IOAPIC in microvm, no PIC/PIT) or kernel (KVM's PIC, IOAPIC and PIT)"),
		stringOpt("acpi", "on", "ACPI tables and power registers (on: a guest's poweroff ends microvm); off: CPUs in the MP table only"),
		boolOpt("track-dirty-pages", "log the guest memory pages written, so that snapshot --diff can save only those (docs/snapshot.md)", ""),
		uint64Opt("vsock-cid", "add a virtio-vsock device with this guest CID (>= 3)"),
		stringOpt("vsock-uds", "", "host Unix socket of the vsock device (clients send CONNECT <port>)"),
	}
	var all []opt
	for _, g := range [][]opt{base, vsockLimitFlags("vsock-"), {vsockOptFlag()}, deviceFlags(),
		privilegeFlags(), {seccompFlag(), cpuProfileFlag()}, logFlags(), namedFlags()} {
		all = append(all, g...)
	}
	return all
}

// checkRunArgs refuses arguments after run's flags, but for an image's,
// which are its main process's command.
func checkRunArgs(c flagValues, args []string) error {
	if len(args) > 0 && !isSet(c, "image") {
		return usagef("run: unexpected argument %q", args[0])
	}
	return nil
}

// wantsNamed says that run's flags ask for a named VM (named.go), which
// the full build runs.
func wantsNamed(c flagValues) bool {
	return isSet(c, "name") || c.Bool("detach") || c.Bool("with-agent") || isSet(c, "image")
}

// runPlain is `microvm run` of a VM without a name: the VM runs in the
// foreground with the console on stdin and stdout, and its end is the
// exit status (runMachine).
func runPlain(c flagValues, stdin io.Reader, stdout, stderr io.Writer) error {
	log, err := setupLog(c, stderr)
	if err != nil {
		return err
	}
	cfg, err := runConfig(c)
	if err != nil {
		return err
	}
	if elsewhere, err := runInFullBuild(c, cfg); elsewhere {
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
	if err := shareChroot(root, cfg); err != nil {
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
	stopProfile, err := startCPUProfile(c, log)
	if err != nil {
		return err
	}
	defer stopProfile()
	return runMachine(cfg, log, func() error {
		if err := enterChroot(root, log); err != nil {
			return err
		}
		if err := dropPrivileges(ids, log); err != nil {
			return err
		}
		return confine(c, profiled(c, vmmPolicy(cfg)), log)
	})
}

// cpuProfileFlag is --cpuprofile, on run and vhost-user-vsock.
func cpuProfileFlag() opt {
	return stringOpt("cpuprofile", "", "write a CPU profile (pprof) of the whole run to this file, for go tool pprof (docs/notes/performance.md)")
}

// profiled is policy, plus the CPU profiler's calls when --cpuprofile is
// given.
func profiled(c flagValues, policy seccomp.Policy) seccomp.Policy {
	if c.String("cpuprofile") != "" {
		return policy.WithCPUProfiling()
	}
	return policy
}

// vmmPolicy is the seccomp allow-list for a machine of cfg: on a
// user-mode network microvm also reaps its microvm-net process.
func vmmPolicy(cfg microvm.Config) seccomp.Policy {
	p := seccomp.VMM()
	if cfg.HasUserNet() {
		p = seccomp.VMMUserNet()
	}
	if len(cfg.Shares) > 0 {
		p = p.WithShares()
	}
	return p
}

func runConfig(c flagValues) (microvm.Config, error) {
	if c.String("kernel") == "" {
		return microvm.Config{}, usagef("run: --kernel is required")
	}
	return runConfigNoKernelCheck(c)
}

// runConfigNoKernelCheck is runConfig for a named VM, whose kernel may
// default (named.go).
func runConfigNoKernelCheck(c flagValues) (microvm.Config, error) {
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
		TrackDirtyPages: c.Bool("track-dirty-pages"),
		NoACPI:          noACPI,
		Kernel:          c.String("kernel"),
		Initrd:          c.String("initrd"),
		Cmdline:         c.String("cmdline"),
		CPUs:            c.Int("cpus"),
		MemoryBytes:     mem,
		IRQChip:         microvm.IRQChip(c.String("irqchip")),
	}
	if h := c.String("cpu-hide"); h != "" {
		cfg.HideCPUFeatures = strings.Split(h, ",")
	}
	if err := readDeviceFlags(c, &cfg); err != nil {
		return cfg, err
	}
	// A named VM always has a vsock device, its socket in its state
	// directory: --vsock-cid (and the limits and options) alone choose
	// its CID; namedConfig fills in the rest.
	named := c.String("name") != ""
	if isSet(c, "vsock-opt") && !isSet(c, "vsock-cid") && !named {
		return cfg, usagef("--vsock-opt needs a vsock device (--vsock-cid and --vsock-uds)")
	}
	if isSet(c, "vsock-cid") || isSet(c, "vsock-uds") || named {
		if !named && (!isSet(c, "vsock-cid") || !isSet(c, "vsock-uds")) {
			return cfg, usagef("--vsock-cid and --vsock-uds go together (a VM with --name needs only --vsock-cid)")
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
func vsockLimitFlags(prefix string) []opt {
	return []opt{
		intOpt(prefix+"max-conns", vsock.DefaultMaxConns, "most vsock connections open at once"),
		stringOpt(prefix+"conn-buffer", "256K", "per-connection vsock buffer, up to 1G (SIZE; a bare number means bytes)"),
		stringOpt(prefix+"buffer-total", "64M", "guest->host bytes all vsock connections together may make the device buffer, at least max-conns x 4K (the default grows to that); past it the guest gets less credit, nobody is reset (SIZE)"),
		durationOpt(prefix+"connect-timeout", vsock.DefaultConnectTimeout, "deadline for a host client's CONNECT line and for the guest's answer"),
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
func readVsockLimits(c flagValues, prefix string) (vsockLimits, error) {
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
func namedFlags() []opt {
	return append([]opt{
		stringOpt("name", "", "a named VM: its state, control socket, vsock socket and console log live under $MICROVM_STATE_DIR/vms/NAME; microvm ls, stop, kill, rm, logs, exec --vm and cp reach it by name"),
		boolOpt("detach", "with --name: return once the VM runs (and its agent answers, with --with-agent); the VM goes on in the background", "d"),
		boolOpt("with-agent", "the guest runs microvm's agent: boot exec's agent image (unless --initrd or --root gives one whose /init is the agent)"),
		durationOpt("boot-timeout", 2*time.Minute, "with --detach --with-agent: how long to wait for the agent"),
		boolOpt("idle", "with --image: start no main process (the image's Entrypoint/Cmd); the VM runs until stopped, for exec --vm"),
		valueOpt("env", &listFlag{}, "", "with --image: set K=V in the main process's environment; a bare K passes microvm's own $K, off the command line (repeatable; not kept in the VM's record)"),
	}, append(rootImageFlags(), imageFlags()...)...)
}

// rootImageFlags choose an OCI image as the guest's root file system, for
// exec and run; readRootImageFlags reads them.
func rootImageFlags() []opt {
	return []opt{
		stringOpt("image", "", "an OCI image (microvm image pull/import/ls) as the root file system, read-only and shared, under a private copy-on-write layer; pulled when not stored; implies --with-agent"),
		stringOpt("overlay-size", "", "with --image: the limit of the copy-on-write layer, a tmpfs in guest RAM (SIZE; default half of --memory)"),
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
func imageFlags() []opt {
	return []opt{
		stringOpt("agent", "", "static guest agent binary (default: microvm-agent next to the microvm binary)"),
		stringOpt("busybox", "/bin/busybox", "static busybox for sh and the core utilities in the guest (\"\" leaves it out)"),
		valueOpt("add", &listFlag{}, "", "copy host file or directory SRC to guest path DST (repeatable)"),
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
	return runBuilt(m, log, confine)
}

// runBuilt is runMachine for a machine already built (New, or Restore),
// which it closes.
func runBuilt(m *microvm.Machine, log *logrus.Logger, confine func() error) error {
	defer m.Close()

	ctx, stop := interruptible(context.Background())
	defer stop()
	inspectOnSIGUSR1(ctx, log, m)
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
