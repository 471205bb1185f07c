package microvm

// The virtio devices a machine can have, one deviceKind each: its
// configuration (a Config field, its checks, its command-line flags), how
// New builds it, what it adds to the kernel command line, and its metrics.
// Each kind is one file: vsockdev.go, rng.go, disk.go, net.go, share.go.
// This file is what they share: deviceKind, the kinds in slot order, the
// machine's deviceSet, DeviceMetrics, and the command-line Flag. A device's
// virtio-mmio slot, interrupt, virtio_mmio.device= entry and ACPI
// description follow from the slot (internal/vmm), whatever the kind.
//
// Adding a device is adding its package under devices/ and its file in
// this package (its config type, its deviceKind, its part of deviceSet,
// named in rootConcepts, layout_test.go), its entry in deviceKinds and
// deviceSet, its DeviceMetrics field, and its field in Config (config.go):
// nothing else in the root package, the CLI (internal/clibase makes its
// flags from DeviceFlags) or the metrics server changes.

import (
	"fmt"
	"strings"

	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/virtio"
)

// A deviceKind is one kind of virtio device.
type deviceKind struct {
	// validate checks the kind's part of a Config (New, before anything
	// is created).
	validate func(c *Config) error
	// add creates the devices c asks for and puts each in the next slot
	// (Machine.addVirtio), in order.
	add func(m *Machine) error
	// cmdline is what the kind adds to the kernel command line, before
	// the virtio-mmio entries (nil: nothing).
	cmdline func(c *Config) []string
	// metrics fills the kind's part of a Metrics snapshot.
	metrics func(m *Machine, out *DeviceMetrics)
	// transports are its devices as the virtio families see them.
	transports func(d *DeviceMetrics) []transport
	// families writes its own Prometheus families (docs/metrics.md).
	families func(w *promtext.Writer, d *DeviceMetrics)
	// flags are its command-line flags; finish checks them together once
	// all are parsed (nil: nothing to check).
	flags  []Flag
	finish func(c *Config, given func(flag string) bool) error
}

// deviceKinds are the kinds in slot order (docs/machine.md): vsock, rng,
// the disks, the network devices, the shared directories.
var deviceKinds = []deviceKind{vsockKind, rngKind, diskKind, netKind, shareKind}

// deviceSet is the machine's virtio devices and their transports, each
// kind's part in its file (Machine embeds it). Set by New and never
// changed.
type deviceSet struct {
	vsockDevices
	rngDevices
	diskDevices
	netDevices
	shareDevices
}

// addVirtio puts dev in the machine's next virtio-mmio slot and has
// closeDev run when the machine closes, after the slot's transport has
// reset the device and its eventfds are gone (OnClose runs last in, first
// out).
func (m *Machine) addVirtio(dev virtio.Device, closeDev func() error) (*virtio.MMIO, error) {
	m.vm.OnClose(closeDev)
	return m.vm.AddVirtio(dev)
}

// DeviceMetrics are the virtio devices' counters, by kind (Metrics embeds
// it).
type DeviceMetrics struct {
	// Vsock is the vsock device's (nil without one).
	Vsock *VsockMetrics
	// RNG is the rng device's (nil without one).
	RNG *RNGMetrics
	// Disks, Nets and Shares follow Config.Disks, Config.Nets and
	// Config.Shares.
	Disks  []DiskMetrics
	Nets   []NetMetrics
	Shares []ShareMetrics
}

// Flag is a device's command-line flag, as DeviceFlags returns it for a
// CLI to offer (internal/clibase makes both CLIs' flags of them).
type Flag struct {
	// Name is the flag's name without dashes ("disk").
	Name string
	// Usage is its help text.
	Usage string
	// Synopsis is how a usage line shows it ("[--disk path=F]...").
	Synopsis string
	// Bool says the flag may stand alone (--rng) and takes on or off as
	// a value (--rng=off); Default is then "on" or "off".
	Bool    bool
	Default string
	// Set applies one occurrence's value to a Config, in command-line
	// order; a repeatable flag adds a device each time.
	Set func(c *Config, value string) error
}

// DeviceFlags returns every device kind's command-line flags, in slot
// order of their kinds.
func DeviceFlags() []Flag {
	var fs []Flag
	for _, k := range deviceKinds {
		fs = append(fs, k.flags...)
	}
	return fs
}

// DeviceFlagDefaults sets what the flags configure when none is given: a
// Config from the command line starts with it (the rng device is on).
func DeviceFlagDefaults(c *Config) {
	for _, f := range DeviceFlags() {
		if f.Bool {
			_ = f.Set(c, f.Default)
		}
	}
}

// FinishDeviceFlags checks the device flags together once all are set;
// given says which flags the command line holds. Errors wrap ErrConfig.
func FinishDeviceFlags(c *Config, given func(flag string) bool) error {
	for _, k := range deviceKinds {
		if k.finish != nil {
			if err := k.finish(c, given); err != nil {
				return err
			}
		}
	}
	return nil
}

// onOff parses a Bool flag's value.
func onOff(flag, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "on", "true", "1", "yes":
		return true, nil
	case "off", "false", "0", "no":
		return false, nil
	}
	return false, fmt.Errorf("%w: --%s %q: want on or off", ErrConfig, flag, v)
}

// transport is one virtio device as the virtio families see it.
type transport struct {
	name  string
	stats virtio.TransportStats
	kicks []queueCount // notifications the device's workers observed, by queue
	full  []queueCount // work held back for want of guest buffers, by queue
}

type queueCount struct {
	queue string
	n     uint64
}
