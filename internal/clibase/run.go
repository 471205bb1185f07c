package clibase

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/kernelpath"
	"github.com/microvm/microvm/internal/seccomp"
	"github.com/microvm/microvm/vsock"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// BinDir is the directory of the running microvm binary, where the default
// agent and kernel are looked for.
func BinDir() string {
	return kernelpath.BinDir()
}

// RunOpts are `microvm run`'s flags, for both builds' parsers.
func RunOpts() []Opt {
	base := []Opt{
		StringOpt("kernel", "", "kernel image: bzImage, PVH ELF or x86-64 vmlinux (required)"),
		StringOpt("initrd", "", "initial ramdisk"),
		StringOpt("cmdline", "", "kernel command line"),
		IntOpt("cpus", microvm.DefaultCPUs, fmt.Sprintf("number of vCPUs (1..%d)", microvm.MaxCPUs)),
		StringOpt("memory", microvm.FormatSize(microvm.DefaultMemory), "guest RAM: a number with an optional K/M/G/T suffix; a bare number means MiB (8M..1T, a multiple of 2M)"),
		StringOpt("cpu-hide", "", "comma-separated CPUID features to hide from the guest (e.g. cx16,xsave)"),
		StringOpt("irqchip", string(microvm.IRQChipSplit), "interrupt controllers: split (LAPIC in KVM, IOAPIC in microvm, no PIC/PIT) or kernel (KVM's PIC, IOAPIC and PIT)"),
		StringOpt("acpi", "on", "ACPI tables and power registers (on: a guest's poweroff ends microvm); off: CPUs in the MP table only"),
		BoolOpt("track-dirty-pages", "log the guest memory pages written, so that snapshot --diff can save only those (docs/snapshot.md)", ""),
		Uint64Opt("vsock-cid", "add a virtio-vsock device with this guest CID (>= 3)"),
		StringOpt("vsock-uds", "", "host Unix socket of the vsock device (clients send CONNECT <port>)"),
	}
	var all []Opt
	for _, g := range [][]Opt{base, VsockLimitFlags("vsock-"), {VsockOptFlag()}, DeviceFlags(),
		PrivilegeFlags(), {SeccompFlag(), CPUProfileFlag()}, LogFlags(), NamedFlags()} {
		all = append(all, g...)
	}
	return all
}

// CheckRunArgs refuses arguments after run's flags, but for an image's,
// which are its main process's command.
func CheckRunArgs(c FlagValues, args []string) error {
	if len(args) > 0 && !IsSet(c, "image") {
		return Usagef("run: unexpected argument %q", args[0])
	}
	return nil
}

// WantsNamed says that run's flags ask for a named VM
// (cmd/microvm-full/named.go), which microvm-full runs.
func WantsNamed(c FlagValues) bool {
	return IsSet(c, "name") || c.Bool("detach") || c.Bool("with-agent") || IsSet(c, "image") ||
		c.Bool("docker") || IsSet(c, "docker-disk") || IsSet(c, "docker-timeout") ||
		IsSet(c, "cache") || IsSet(c, "cache-limit") || IsSet(c, "cache-dir")
}

// Plain is what a binary adds to RunPlain: the lean binary hands some
// runs over to microvm-full, the full one writes --cpuprofile's profile.
type Plain struct {
	// Elsewhere, when set, is asked once the configuration is read
	// whether another program runs the machine instead; it says true when
	// it took the run over (or failed to, with err).
	Elsewhere func(c FlagValues, cfg microvm.Config) (bool, error)
	// StartCPUProfile, when set, starts the CPU profile --cpuprofile asks
	// for; stop writes it out. A binary without it refuses --cpuprofile.
	StartCPUProfile func(c FlagValues, log logrus.FieldLogger) (stop func(), err error)
}

// RunPlain is `microvm run` of a VM without a name: the VM runs in the
// foreground with the console on stdin and stdout, and its end is the
// exit status (RunMachine).
func RunPlain(c FlagValues, stdin io.Reader, stdout, stderr io.Writer, p Plain) error {
	log, err := SetupLog(c, stderr)
	if err != nil {
		return err
	}
	cfg, err := RunConfig(c)
	if err != nil {
		return err
	}
	if p.Elsewhere != nil {
		if elsewhere, err := p.Elsewhere(c, cfg); elsewhere {
			return err
		}
	}
	ids, err := ReadPrivilegeFlags(c)
	if err != nil {
		return err
	}
	root, err := ReadChroot(c)
	if err != nil {
		return err
	}
	if err := ShareChroot(root, cfg); err != nil {
		return err
	}
	if cfg.Vsock != nil {
		if err := ChrootPath(root, &cfg.Vsock.UDSPath, "--vsock-uds"); err != nil {
			return err
		}
	}
	if err := ChrootPath(root, &cfg.MetricsSocket, "--metrics-socket"); err != nil {
		return err
	}
	cfg.Log = log
	cfg.Console = stdout
	cfg.ConsoleInput = stdin
	if p.StartCPUProfile != nil {
		stopProfile, err := p.StartCPUProfile(c, log)
		if err != nil {
			return err
		}
		defer stopProfile()
	} else if IsSet(c, "cpuprofile") {
		return Usagef("--cpuprofile: this build of microvm does not profile")
	}
	return RunMachine(cfg, log, func() error {
		if err := EnterChroot(root, log); err != nil {
			return err
		}
		if err := DropPrivileges(ids, log); err != nil {
			return err
		}
		return Confine(c, Profiled(c, VMMPolicy(cfg)), log)
	})
}

// CPUProfileFlag is --cpuprofile, on run and vhost-user-vsock.
func CPUProfileFlag() Opt {
	return StringOpt("cpuprofile", "", "write a CPU profile (pprof) of the whole run to this file, for go tool pprof (docs/notes/performance.md)")
}

// Profiled is policy, plus the CPU profiler's calls when --cpuprofile is
// given.
func Profiled(c FlagValues, policy seccomp.Policy) seccomp.Policy {
	if c.String("cpuprofile") != "" {
		return policy.WithCPUProfiling()
	}
	return policy
}

// VMMPolicy is the seccomp allow-list for a machine of cfg: on a
// user-mode network microvm also reaps its microvm-net process.
func VMMPolicy(cfg microvm.Config) seccomp.Policy {
	p := seccomp.VMM()
	if cfg.HasUserNet() {
		p = seccomp.VMMUserNet()
	}
	if len(cfg.Shares) > 0 {
		p = p.WithShares()
	}
	return p
}

func RunConfig(c FlagValues) (microvm.Config, error) {
	if c.String("kernel") == "" {
		return microvm.Config{}, Usagef("run: --kernel is required")
	}
	return RunConfigNoKernelCheck(c)
}

// RunConfigNoKernelCheck is RunConfig for a named VM, whose kernel may
// default (cmd/microvm-full/named.go).
func RunConfigNoKernelCheck(c FlagValues) (microvm.Config, error) {
	mem, err := microvm.ParseSize(c.String("memory"))
	if err != nil {
		return microvm.Config{}, Usagef("--memory: %v", err)
	}
	if n := c.Int("cpus"); n < 1 || n > microvm.MaxCPUs {
		return microvm.Config{}, Usagef("--cpus %d: want 1..%d", n, microvm.MaxCPUs)
	}
	var noACPI bool
	switch a := c.String("acpi"); a {
	case "on":
	case "off":
		noACPI = true
	default:
		return microvm.Config{}, Usagef("--acpi %q: want on or off", a)
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
	if err := ReadDeviceFlags(c, &cfg); err != nil {
		return cfg, err
	}
	// A named VM always has a vsock device, its socket in its state
	// directory: --vsock-cid (and the limits and options) alone choose
	// its CID; namedConfig fills in the rest.
	named := c.String("name") != ""
	if IsSet(c, "vsock-opt") && !IsSet(c, "vsock-cid") && !named {
		return cfg, Usagef("--vsock-opt needs a vsock device (--vsock-cid and --vsock-uds)")
	}
	if IsSet(c, "vsock-cid") || IsSet(c, "vsock-uds") || named {
		if !named && (!IsSet(c, "vsock-cid") || !IsSet(c, "vsock-uds")) {
			return cfg, Usagef("--vsock-cid and --vsock-uds go together (a VM with --name needs only --vsock-cid)")
		}
		lim, err := ReadVsockLimits(c, "vsock-")
		if err != nil {
			return cfg, err
		}
		opts, err := ParseVsockOpt(c.String("vsock-opt"))
		if err != nil {
			return cfg, err
		}
		cfg.Vsock = &microvm.VsockConfig{
			CID:            c.Uint64("vsock-cid"),
			UDSPath:        c.String("vsock-uds"),
			MaxConnections: lim.MaxConns,
			ConnBuffer:     int(lim.ConnBuffer),
			BufferTotal:    lim.BufferTotal,
			ConnectTimeout: lim.ConnectTimeout,
			Options:        &opts.Options,
			Dgram:          opts.Dgram,
		}
	}
	return cfg, nil
}

// VsockLimitFlags are the vsock device's limit flags, shared by `run`
// (prefix "vsock-") and `vhost-user-vsock` (no prefix, the names
// vhost-device-vsock uses): max-conns, conn-buffer, buffer-total,
// connect-timeout.
func VsockLimitFlags(prefix string) []Opt {
	return []Opt{
		IntOpt(prefix+"max-conns", vsock.DefaultMaxConns, "most vsock connections open at once"),
		StringOpt(prefix+"conn-buffer", "256K", "per-connection vsock buffer, up to 1G (SIZE; a bare number means bytes)"),
		StringOpt(prefix+"buffer-total", "64M", "guest->host bytes all vsock connections together may make the device buffer, at least max-conns x 4K (the default grows to that); past it the guest gets less credit, nobody is reset (SIZE)"),
		DurationOpt(prefix+"connect-timeout", vsock.DefaultConnectTimeout, "deadline for a host client's CONNECT line and for the guest's answer"),
	}
}

// VsockLimits are the checked values of VsockLimitFlags.
type VsockLimits struct {
	MaxConns       int
	ConnBuffer     uint32
	BufferTotal    uint64
	ConnectTimeout time.Duration
}

// ReadVsockLimits reads and checks the limit flags named with prefix.
func ReadVsockLimits(c FlagValues, prefix string) (VsockLimits, error) {
	lim := VsockLimits{MaxConns: c.Int(prefix + "max-conns"), ConnectTimeout: c.Duration(prefix + "connect-timeout")}
	if lim.MaxConns < 1 {
		return lim, Usagef("--%smax-conns %d: want at least 1", prefix, lim.MaxConns)
	}
	buf, err := microvm.ParseBytes(c.String(prefix + "conn-buffer"))
	if err != nil || buf == 0 || buf > vsock.MaxConnBuffer {
		return lim, Usagef("--%sconn-buffer %q: want a size between 1 byte and 1G", prefix, c.String(prefix+"conn-buffer"))
	}
	lim.ConnBuffer = uint32(buf)
	total, err := microvm.ParseBytes(c.String(prefix + "buffer-total"))
	if err != nil || total == 0 {
		return lim, Usagef("--%sbuffer-total %q: want a size of at least 1 byte", prefix, c.String(prefix+"buffer-total"))
	}
	// Left unset, the device's default: 64M, or more when max-conns
	// connections' minimum windows need it.
	if IsSet(c, prefix+"buffer-total") {
		if least := vsock.MinMaxBuffered(lim.MaxConns, lim.ConnBuffer); total < least {
			return lim, Usagef("--%sbuffer-total %q: below --%smax-conns %d times the minimum window each connection is sure of (%d bytes): want at least %d bytes",
				prefix, c.String(prefix+"buffer-total"), prefix, lim.MaxConns, least/uint64(lim.MaxConns), least)
		}
		lim.BufferTotal = total
	}
	if lim.ConnectTimeout <= 0 {
		return lim, Usagef("--%sconnect-timeout %v: want a positive duration", prefix, lim.ConnectTimeout)
	}
	return lim, nil
}

// DockerTimeout is run --docker-timeout's default: internal/dockervm's
// DefaultTimeout, which this package, linked into the lean binary, does
// not import (a test in cmd/microvm-full keeps the two equal).
const DockerTimeout = time.Minute

// NamedFlags are run's flags for a named VM (cmd/microvm-full/named.go): --name, --detach,
// --with-agent, --docker and the agent image's flags.
func NamedFlags() []Opt {
	return append([]Opt{
		StringOpt("name", "", "a named VM: its state, control socket, vsock socket and console log live under $MICROVM_STATE_DIR/vms/NAME; microvm ls, stop, kill, rm, logs, exec --vm and cp reach it by name"),
		BoolOpt("detach", "with --name: return once the VM runs (and its agent answers, with --with-agent); the VM goes on in the background", "d"),
		BoolOpt("with-agent", "the guest runs microvm's agent: boot exec's agent image (unless --initrd or --root gives one whose /init is the agent)"),
		DurationOpt("boot-timeout", 2*time.Minute, "with --detach --with-agent: how long to wait for the agent"),
		BoolOpt("idle", "with --image: start no main process (the image's Entrypoint/Cmd); the VM runs until stopped, for exec --vm"),
		ValueOpt("env", &ListFlag{}, "", "with --image: set K=V in the main process's environment; a bare K passes microvm's own $K, off the command line (repeatable; not kept in the VM's record)"),
		BoolOpt("docker", "with --image or --with-agent: start the image's dockerd once the agent answers, before the main process, its data root on a disk in the VM's state directory (removed with microvm rm); exit status 122 when Docker does not come up (docs/ci.md)"),
		StringOpt("docker-disk", "", "the size of --docker's data disk (SIZE, sparse; default 8G)"),
		DurationOpt("docker-timeout", DockerTimeout, "how long --docker waits for dockerd to answer"),
		ValueOpt("cache", &ListFlag{}, "", "with --image: NAME=GUESTPATH[,size=SIZE]: mount a private copy of the cache disk NAME at GUESTPATH before the main process; when it exits 0 the copy is kept as NAME's next version, any other end discards it (repeatable; microvm cache ls, docs/ci.md)"),
		StringOpt("cache-dir", "", "with --cache: the cache store (default $MICROVM_STATE_DIR/caches, exec --cache's; microvm cache ls --dir)"),
		StringOpt("cache-limit", "", "with --cache: after a commit, remove the oldest versions of any cache in the store (never a cache's newest) until all versions take at most SIZE on disk"),
	}, append(RootImageFlags(), ImageFlags()...)...)
}

// RootImageFlags choose an OCI image as the guest's root file system, for
// exec and run; readRootImageFlags reads them.
func RootImageFlags() []Opt {
	return []Opt{
		StringOpt("image", "", "an OCI image (microvm image pull/import/ls) as the root file system, read-only and shared, under a private copy-on-write layer; pulled when not stored; implies --with-agent"),
		StringOpt("overlay-size", "", "with --image: the limit of the copy-on-write layer, a tmpfs in guest RAM (SIZE; default half of --memory)"),
	}
}

// ListFlag is a repeatable flag that keeps each value whole, in order. A
// cli.StringSliceFlag would split values at commas, and its JSON
// (de)serialisation would link encoding/json into the lean binary, 86 KB on
// `microvm run`'s start-up path.
type ListFlag struct{ Vals []string }

func (l *ListFlag) Set(s string) error { l.Vals = append(l.Vals, s); return nil }
func (l *ListFlag) String() string     { return strings.Join(l.Vals, " ") }

// ImageFlags say what goes into the agent image, for exec, initramfs and
// run --with-agent; readImageFlags reads them.
func ImageFlags() []Opt {
	return []Opt{
		StringOpt("agent", "", "static guest agent binary (default: microvm-agent next to the microvm binary)"),
		StringOpt("busybox", "/bin/busybox", "static busybox for sh and the core utilities in the guest (\"\" leaves it out)"),
		ValueOpt("add", &ListFlag{}, "", "copy host file or directory SRC to guest path DST (repeatable)"),
	}
}

// RunMachine boots the guest and turns its end into an exit status: the
// status the guest chose, 0 for a reset or power-off, 125 for a triple fault,
// 128+signal when a SIGINT or SIGTERM stopped it. confine runs between
// setting the machine up and running it.
func RunMachine(cfg microvm.Config, log *logrus.Logger, Confine func() error) error {
	m, err := microvm.New(cfg)
	if err != nil {
		return err
	}
	return RunBuilt(m, log, Confine)
}

// RunBuilt is RunMachine for a machine already built (New, or Restore),
// which it closes.
func RunBuilt(m *microvm.Machine, log *logrus.Logger, Confine func() error) error {
	defer m.Close()

	ctx, stop := Interruptible(context.Background())
	defer stop()
	InspectOnSIGUSR1(ctx, log, m)
	if err := Confine(); err != nil {
		return err
	}
	res, err := m.Run(ctx)
	if err != nil {
		return err
	}
	log.WithField("reason", res.Kind).WithField("status", res.Status).Info("guest stopped")
	switch res.Kind {
	case microvm.ExitCanceled:
		if serr := SignalStatus(ctx, log); serr != nil {
			return serr
		}
		return StatusError{Status: microvm.StatusError}
	default:
		if res.Status != 0 {
			return StatusError{Status: res.Status}
		}
		return nil
	}
}
