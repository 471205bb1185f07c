package microvm

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/internal/vmm"
)

// Defaults for Config fields left zero, and the bounds New accepts.
const (
	// DefaultCPUs is the vCPU count when Config.CPUs is 0.
	DefaultCPUs = 1
	// DefaultMemory is the guest RAM when Config.MemoryBytes is 0.
	DefaultMemory = 256 << 20
	// MinMemory and MaxMemory bound Config.MemoryBytes, which must also be
	// a multiple of 2 MiB.
	MinMemory = 8 << 20
	MaxMemory = 1 << 40
	// MaxCPUs is the most vCPUs a machine may have (the MP table holds
	// more; see package kvm/loader).
	MaxCPUs = 32
)

// Config describes a machine.
type Config struct {
	// Kernel is the path of a bzImage, a PVH ELF or an x86-64 vmlinux.
	Kernel string
	// Initrd is the optional path of an initial ramdisk.
	Initrd string
	// Cmdline is the kernel command line; virtio-mmio device entries are
	// appended to it.
	Cmdline string
	// CPUs is the number of vCPUs (default 1).
	CPUs int
	// MemoryBytes is the guest RAM size (default 256 MiB).
	MemoryBytes uint64
	// HideCPUFeatures names CPUID features to hide from the guest
	// (kvm.Features: "cx16", "xsave", ...).
	HideCPUFeatures []string
	// Console receives the guest's serial output (nil: discarded).
	Console io.Writer
	// ConsoleInput, when set, is copied to the guest's serial input.
	ConsoleInput io.Reader
	// Vsock, when set, adds a virtio-vsock device.
	Vsock *VsockConfig
	// Disks adds a virtio-blk device per image, /dev/vda first.
	Disks []DiskConfig
	// Root, when set ("/dev/vda", ...), names the disk the kernel mounts as
	// its root file system: "root=<Root> rw" ("ro" for a read-only disk) is
	// added to the command line. Without it the guest runs from its
	// initramfs (and may mount the disks itself). An initramfs with an
	// /init still wins over root=, as always with Linux.
	Root string
	// RNG, when set, adds a virtio-rng device (/dev/hwrng in the guest).
	RNG *RNGConfig
	// Nets adds a virtio-net device per entry, on a host TAP or a
	// user-mode network, in order (eth0, eth1, ... in a Linux guest), after
	// the vsock, rng and disk devices.
	Nets []NetConfig
	// Shares adds a virtio-9p device per host directory shared with the
	// guest, after the network devices.
	Shares []ShareConfig
	// IRQChip selects the interrupt controller model (default IRQChipSplit).
	IRQChip IRQChip
	// NoACPI leaves out the ACPI tables and the power control registers
	// (CLI --acpi=off): the guest sees the machine of before ACPI, CPUs
	// in the MP table only, and a Linux guest's poweroff halts instead of
	// ending the machine. By default (false) the machine has ACPI
	// (docs/machine.md): poweroff ends Run with ExitPowerOff.
	NoACPI bool
	// TrackDirtyPages logs the guest memory pages written, by the guest
	// and by the devices, so that Machine.Snapshot can write a diff
	// snapshot (SnapshotOptions.Diff): only the pages written since the
	// machine's previous snapshot, or since its restore. The guest pays a
	// write-protection fault on its first write to each page after each
	// snapshot.
	TrackDirtyPages bool
	// PrefaultMemory, for Restore, reads the snapshot's guest memory in
	// at restore (the data it holds, not its holes) rather than page by
	// page as the guest first touches it: a longer restore for fewer
	// faults afterwards. Ignored by New.
	PrefaultMemory bool
	// MetricsSocket, when set, is a Unix socket path on which New starts
	// an HTTP server of the machine's metrics: GET /metrics returns
	// Machine.Metrics in the Prometheus text format (docs/metrics.md).
	// The socket is created 0600; a stale socket file is replaced, a live
	// one or any other file is refused. Close stops the server and
	// removes the socket.
	MetricsSocket string
	// Log receives the VMM's diagnostics (nil: logrus.StandardLogger()).
	// Any logrus.FieldLogger works: a *logrus.Logger, or an *logrus.Entry
	// carrying the caller's fields (a job ID, say).
	Log logrus.FieldLogger

	// pendingPublish holds --publish values (DeviceFlags) until
	// FinishDeviceFlags gives them to the --net user device: the two flags
	// come in any order.
	pendingPublish []virtionet.Publish
}

// IRQChip is the interrupt controller model.
type IRQChip = vmm.IRQChip

const (
	// IRQChipSplit keeps the local APICs in KVM and emulates the IOAPIC in
	// microvm; interrupts reach the guest as MSIs routed in the kernel, so
	// irqfds still bypass the VMM. There is no PIC and no PIT (a guest keeps
	// time with the TSC, kvmclock and the LAPIC timer, as under Cloud
	// Hypervisor). Setting up and tearing down a VM is much cheaper.
	IRQChipSplit = vmm.IRQChipSplit
	// IRQChipKernel uses KVM's full in-kernel irqchip (PIC, IOAPIC, LAPIC)
	// and in-kernel i8254 PIT, as Firecracker does, for guests that need a
	// PIT or PIC.
	IRQChipKernel = vmm.IRQChipKernel
)

// ErrConfig marks an invalid Config (the CLI reports it as a usage error).
var ErrConfig = vmm.ErrConfig

// Check reports what New would refuse in c before it touches the host:
// the values and their combinations, each device kind's part included
// (errors wrap ErrConfig). It does not look for the files or at KVM.
func (c Config) Check() error {
	_, err := c.withDefaults()
	return err
}

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if cfg.CPUs == 0 {
		cfg.CPUs = DefaultCPUs
	}
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = DefaultMemory
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if cfg.IRQChip == "" {
		cfg.IRQChip = IRQChipSplit
	}
	switch {
	case cfg.Kernel == "":
		return cfg, fmt.Errorf("%w: no kernel given", ErrConfig)
	case cfg.CPUs < 1 || cfg.CPUs > MaxCPUs:
		return cfg, fmt.Errorf("%w: %d vCPUs; microvm supports 1..%d", ErrConfig, cfg.CPUs, MaxCPUs)
	case cfg.MemoryBytes < MinMemory || cfg.MemoryBytes > MaxMemory:
		return cfg, fmt.Errorf("%w: memory %s; microvm supports %s..%s", ErrConfig,
			FormatSize(cfg.MemoryBytes), FormatSize(MinMemory), FormatSize(MaxMemory))
	case cfg.IRQChip != IRQChipSplit && cfg.IRQChip != IRQChipKernel:
		return cfg, fmt.Errorf("%w: irqchip %q: want %q or %q", ErrConfig, cfg.IRQChip, IRQChipSplit, IRQChipKernel)
	case cfg.MemoryBytes%(2<<20) != 0:
		return cfg, fmt.Errorf("%w: memory %s is not a multiple of 2 MiB", ErrConfig, FormatSize(cfg.MemoryBytes))
	}
	if err := CheckMetricsSocket(cfg.MetricsSocket); err != nil {
		return cfg, err
	}
	for _, k := range deviceKinds {
		if err := k.validate(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// vmmConfig is the machine floor's part of c.
func (c *Config) vmmConfig() vmm.Config {
	return vmm.Config{Kernel: c.Kernel, Initrd: c.Initrd, Cmdline: c.Cmdline, CPUs: c.CPUs,
		MemoryBytes: c.MemoryBytes, HideCPUFeatures: c.HideCPUFeatures, Console: c.Console,
		ConsoleInput: c.ConsoleInput, IRQChip: c.IRQChip, NoACPI: c.NoACPI, Log: c.Log,
		TrackDirty: c.TrackDirtyPages}
}

// maxSunPath is the longest path a Unix socket address holds (sun_path,
// less its terminating NUL).
const maxSunPath = 107

// CheckMetricsSocket checks a Config.MetricsSocket path as New does before
// it creates anything: empty is off; a path longer than a Unix socket
// address holds is an ErrConfig. (Whether its directory exists, or a live
// socket is there, New finds out when it creates the socket.)
func CheckMetricsSocket(path string) error {
	if path == "" {
		return nil
	}
	if len(path) > maxSunPath {
		return fmt.Errorf("%w: metrics socket path %q is %d bytes; a Unix socket path holds at most %d",
			ErrConfig, path, len(path), maxSunPath)
	}
	return nil
}

// ParseSize parses a memory size: a number with an optional K, M, G or T
// suffix (powers of 1024, optionally followed by "B" or "iB"). A bare number
// means MiB; a number followed by "B" alone means bytes, so that
// ParseSize(FormatSize(v)) == v.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	shift := uint(20)
	iB, unit := false, false
	if v, ok := strings.CutSuffix(u, "IB"); ok {
		u, iB = v, true // only valid after a unit letter
	} else if v, ok := strings.CutSuffix(u, "B"); ok {
		u, shift = v, 0 // bytes, unless a unit letter precedes the B
	}
	if n := len(u); n > 0 {
		unit = true
		switch u[n-1] {
		case 'K':
			shift, u = 10, u[:n-1]
		case 'M':
			shift, u = 20, u[:n-1]
		case 'G':
			shift, u = 30, u[:n-1]
		case 'T':
			shift, u = 40, u[:n-1]
		default:
			unit = false
		}
	}
	v, err := strconv.ParseUint(u, 10, 64)
	if err != nil || u == "" || (iB && !unit) {
		return 0, fmt.Errorf("bad size %q: want a number with an optional K, M, G or T suffix (e.g. 64M, 1G)", s)
	}
	if v > (1<<64-1)>>shift {
		return 0, fmt.Errorf("bad size %q: too large", s)
	}
	return v << shift, nil
}

// ParseBytes is ParseSize where a bare number means bytes (rates and
// buffer sizes on the command line).
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	if t != "" && t[len(t)-1] >= '0' && t[len(t)-1] <= '9' {
		t += "B" // ParseSize reads "<n>B" as bytes
	}
	return ParseSize(t)
}

// FormatSize renders a byte count in the largest exact binary unit.
func FormatSize(v uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if v != 0 && v%(1<<u.shift) == 0 {
			return strconv.FormatUint(v>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatUint(v, 10) + "B"
}
