package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/internal/metricsrv"
	"github.com/microvm/microvm/internal/snapshot"
	"github.com/microvm/microvm/internal/vmm"
	"github.com/microvm/microvm/vsock"
)

// ExitKind says why a machine stopped (Result.Kind): ExitDebugPort,
// ExitReset, ExitPowerOff, ExitTripleFault, ExitCanceled or ExitError. Its
// String is the name logs and test failures show ("debug-exit",
// "triple-fault", ...).
type ExitKind = vmm.ExitKind

// Exit kinds.
const (
	ExitDebugPort   = vmm.ExitDebugPort   // the guest wrote its status to port 0xf4
	ExitReset       = vmm.ExitReset       // the guest reset the machine (i8042, ACPI reset register, KVM system event)
	ExitPowerOff    = vmm.ExitPowerOff    // the guest powered off (ACPI S5, KVM system event)
	ExitTripleFault = vmm.ExitTripleFault // KVM_EXIT_SHUTDOWN
	ExitCanceled    = vmm.ExitCanceled    // the Run context was canceled (a signal in the CLI)
	ExitSnapshot    = vmm.ExitSnapshot    // Snapshot with Stop saved the machine and ended it
	ExitError       = vmm.ExitError       // the VMM failed
)

// Exit statuses the CLI uses (README: exit codes).
const (
	StatusOK          = vmm.StatusOK
	StatusError       = vmm.StatusError
	StatusUsage       = vmm.StatusUsage
	StatusTripleFault = vmm.StatusTripleFault
)

// Result is how a machine ended: Kind says why it stopped, Status is the
// process exit status the CLI uses for it (the guest's own for
// ExitDebugPort, 0 for a reset or power-off, 125 for a triple fault, 1
// for an error), and Err is set for ExitError.
type Result = vmm.Result

// Machine is a configured VM ready to Run.
type Machine struct {
	cfg       Config
	log       logrus.FieldLogger
	vm        *vmm.Machine // memory, irqchip, platform devices, slots, vCPUs
	deviceSet              // the virtio devices (devices.go)

	metricsSrv *metricsrv.Server // Config.MetricsSocket; nil without

	snap *snapshot.Snapshot // what Restore built the machine from; nil for New
}

// New creates the machine described by cfg: KVM VM, memory, devices, kernel.
// Errors are one line naming what failed; an invalid cfg's wrap ErrConfig.
func New(cfg Config) (*Machine, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Machine{cfg: c, log: c.Log}
	if err := m.build(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// build puts the machine together: the machine floor, each kind's
// devices in slot order, then the kernel and vCPUs, and last, once
// nothing else can fail, the metrics server, which reads what the steps
// before built.
func (m *Machine) build() error {
	var err error
	vc := m.cfg.vmmConfig()
	vc.Restore = m.snap
	if m.vm, err = vmm.New(vc); err != nil {
		return err
	}
	var cmdline []string
	for _, k := range deviceKinds {
		if err := k.add(m); err != nil {
			return err
		}
		if k.cmdline != nil {
			cmdline = append(cmdline, k.cmdline(&m.cfg)...)
		}
	}
	if m.snap != nil {
		err = m.vm.Restore()
	} else {
		err = m.vm.Boot(cmdline)
	}
	if err != nil {
		return err
	}
	if p := m.cfg.MetricsSocket; p != "" {
		if m.metricsSrv, err = metricsrv.Start(p, m.writeMetrics, m.log); err != nil {
			return err
		}
	}
	return nil
}

// Run starts the vCPUs and blocks until the guest exits, an error stops the
// machine, or ctx is canceled. It may be called once.
func (m *Machine) Run(ctx context.Context) (Result, error) {
	if m.uds != nil {
		go m.uds.Serve()
	}
	r, err := m.vm.Run(ctx)
	if m.vsock != nil {
		// The guest will not run again: close its connections now, so
		// host peers (a DialVsock caller, a Unix-socket client) see the
		// end instead of waiting until Close. Stats stay readable.
		m.vsock.Close()
	}
	return r, err
}

// Pause stops every vCPU and returns once all have left the guest (or ctx
// ends first). The devices keep serving the host side; the guest's clock
// keeps running and jumps when it resumes. Errors wrap ErrNotRunning
// before Run or once the machine stopped.
func (m *Machine) Pause(ctx context.Context) error { return m.vm.Pause(ctx) }

// Resume lets the vCPUs run again after Pause.
func (m *Machine) Resume() error { return m.vm.Resume() }

// Paused says whether the machine's vCPUs are held by Pause.
func (m *Machine) Paused() bool { return m.vm.Paused() }

// ErrNotRunning is returned by Pause and Resume before Run or once the
// machine stopped.
var ErrNotRunning = vmm.ErrNotRunning

// ReadMemory copies guest-physical memory at gpa into p (for example a
// result the guest left behind). A range outside guest RAM is an error; it
// is valid until Close.
func (m *Machine) ReadMemory(gpa uint64, p []byte) error { return m.vm.ReadMemory(gpa, p) }

// Close releases everything New created, in reverse order. The machine must
// not be running.
func (m *Machine) Close() error {
	var errs []error
	if m.metricsSrv != nil {
		// First: a scrape in flight finishes before anything goes away.
		errs = append(errs, m.metricsSrv.Close())
		m.metricsSrv = nil
	}
	if m.vm != nil {
		errs = append(errs, m.vm.Close())
	}
	if m.snap != nil {
		// After the VM: guest memory maps its files until then.
		errs = append(errs, m.snap.Close())
		m.snap = nil
	}
	return errors.Join(errs...)
}

// VsockStats returns the vsock device's counters (zero without one).
func (m *Machine) VsockStats() vsock.Stats {
	if m.vsock == nil {
		return vsock.Stats{}
	}
	return m.vsock.Stats()
}

// DiskStats returns the counters of disk i (Config.Disks[i]); zero when
// there is no such disk.
func (m *Machine) DiskStats(i int) blk.Stats {
	if i < 0 || i >= len(m.disks) {
		return blk.Stats{}
	}
	return m.disks[i].Stats()
}

// RNGStats returns the rng device's counters (zero without one).
func (m *Machine) RNGStats() rng.Stats {
	if m.rng == nil {
		return rng.Stats{}
	}
	return m.rng.Stats()
}

// NetStats returns the counters of virtio-net device i (Config.Nets[i]).
func (m *Machine) NetStats(i int) virtionet.Stats {
	if i < 0 || i >= len(m.nets) {
		return virtionet.Stats{}
	}
	return m.nets[i].Stats()
}

// NetMAC returns the guest MAC address of virtio-net device i.
func (m *Machine) NetMAC(i int) net.HardwareAddr {
	if i < 0 || i >= len(m.nets) {
		return nil
	}
	return m.nets[i].MAC()
}

// Snapshots (issue 22; docs/snapshot.md). A snapshot directory holds the
// machine floor's state and memory (internal/vmm, SaveSnapshot) and this
// package's part, "config": the Config the machine was built with, less
// what names host resources of the running process (console, log), with
// each network device's MAC as the guest saw it and each disk's size and
// modification time, so a restore rebuilds the same devices in the same
// slots and refuses disks that changed since.

// snapshotConfigPart is the name of the Config part.
const snapshotConfigPart = "config"

// savedConfig is the "config" part of a snapshot.
type savedConfig struct {
	Config Config
	// Disks are the disks' sizes and modification times at the save,
	// in Config.Disks order.
	Disks []diskIdentity
}

// diskIdentity is what a restore checks of a disk image.
type diskIdentity struct {
	Size    int64
	ModTime time.Time
}

// SnapshotOptions are the choices of Machine.Snapshot.
type SnapshotOptions struct {
	// Overwrite replaces an existing snapshot at the directory (never
	// anything else), atomically.
	Overwrite bool
	// Stop ends the machine once the snapshot is written: Run returns
	// ExitSnapshot. Otherwise the machine goes on as it was (paused if it
	// was paused).
	Stop bool
	// Labels are the caller's notes on the snapshot (at most 64; keys of
	// 1 to 122 bytes, values of at most 4096), kept in its manifest and
	// read back by ReadSnapshot: a named VM keeps there whether its
	// guest runs the agent.
	Labels map[string]string
}

// ErrSnapshotExists: Snapshot's directory holds something already, and
// Overwrite was not given (or it is not a snapshot, never replaced).
var ErrSnapshotExists = snapshot.ErrExists

// labelPrefix marks SnapshotOptions.Labels among the manifest's metadata.
const labelPrefix = "label/"

// maxLabels bounds SnapshotOptions.Labels.
const maxLabels = 64

// SnapshotInfo is what a snapshot says of itself, read without restoring
// it: the saved machine's Config (with no console, input or log), when
// it was written, and the labels its maker gave.
type SnapshotInfo struct {
	Config  Config
	Created time.Time
	Labels  map[string]string
}

// ReadSnapshot checks the snapshot in dir as Restore does (its manifest
// and every state part; not guest memory) and returns what it says of
// itself.
func ReadSnapshot(dir string) (SnapshotInfo, error) {
	s, err := snapshot.Open(dir)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer s.Close()
	var saved savedConfig
	if err := s.State(snapshotConfigPart, &saved); err != nil {
		return SnapshotInfo{}, err
	}
	man := s.Manifest()
	info := SnapshotInfo{Config: saved.Config, Created: man.Created}
	for k, v := range man.Metadata {
		if name, ok := strings.CutPrefix(k, labelPrefix); ok {
			if info.Labels == nil {
				info.Labels = map[string]string{}
			}
			info.Labels[name] = v
		}
	}
	return info, nil
}

// Snapshot saves the running machine into dir, which must not exist (or
// be a snapshot, with Overwrite): it pauses the vCPUs (if Pause has not),
// quiesces the devices, writes KVM's, the devices' and this machine's
// state and guest memory, and resumes. A vsock device's connections end
// (the guest is told with a transport reset event, as after a restore).
// The directory is written whole or not at all.
func (m *Machine) Snapshot(ctx context.Context, dir string, o SnapshotOptions) (err error) {
	wasPaused := m.Paused()
	if !wasPaused {
		if err := m.Pause(ctx); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	var opts []snapshot.Option
	if o.Overwrite {
		opts = append(opts, snapshot.Overwrite())
	}
	w, err := snapshot.Create(dir, opts...)
	if err != nil {
		m.resumeAfterSnapshot(wasPaused)
		return err
	}
	defer func() {
		if err != nil {
			_ = w.Abort()
		}
	}()
	if len(o.Labels) > maxLabels {
		err = fmt.Errorf("snapshot: %d labels, more than %d", len(o.Labels), maxLabels)
	}
	for k, v := range o.Labels {
		if err == nil {
			err = w.SetMetadata(labelPrefix+k, v)
		}
	}
	var saved *savedConfig
	if err == nil {
		saved, err = m.savedConfig()
	}
	if err == nil {
		err = w.AddState(snapshotConfigPart, saved)
	}
	if err == nil {
		err = m.vm.SaveSnapshot(w)
	}
	if err == nil {
		err = w.Commit()
	}
	if o.Stop && err == nil {
		m.vm.StopSnapshotted()
		return nil
	}
	if rerr := m.vm.ResumeDevices(); rerr != nil && err == nil {
		err = rerr
	}
	m.resumeAfterSnapshot(wasPaused)
	return err
}

// resumeAfterSnapshot lets the vCPUs go on unless the caller had paused
// them.
func (m *Machine) resumeAfterSnapshot(wasPaused bool) {
	if !wasPaused {
		_ = m.Resume()
	}
}

// savedConfig is the machine's Config as a snapshot keeps it.
func (m *Machine) savedConfig() (*savedConfig, error) {
	c := m.cfg
	c.Console, c.ConsoleInput, c.Log = nil, nil, nil
	c.Nets = append([]NetConfig(nil), c.Nets...)
	for i := range c.Nets {
		c.Nets[i].MAC = m.NetMAC(i)
	}
	s := &savedConfig{Config: c}
	for _, d := range c.Disks {
		st, err := os.Stat(d.Path)
		if err != nil {
			return nil, fmt.Errorf("snapshot: disk %s: %w", d.Path, err)
		}
		s.Disks = append(s.Disks, diskIdentity{Size: st.Size(), ModTime: st.ModTime()})
	}
	return s, nil
}

// Config returns the configuration the machine was built with (for a
// restored one: the snapshot's, with the host's resources).
func (m *Machine) Config() Config { return m.cfg }

// Restore builds a machine from the snapshot in dir, ready to Run from
// where the snapshot was taken. host gives what the new process owns:
// Console, ConsoleInput, Log and MetricsSocket always; Vsock's CID and
// UDSPath when set (each when not zero), Disks, Nets and Shares when set, each then with as many
// entries as the snapshot's machine had (paths and host names only: a
// device's kind and settings are the snapshot's). The snapshot is
// refused whole (ErrConfig, or the errors of internal/snapshot) when it
// is truncated, corrupt or newer than this microvm, when this host's KVM
// lacks a CPU feature its guest uses, or when a disk changed since.
func Restore(dir string, host Config) (*Machine, error) {
	s, err := snapshot.Open(dir)
	if err != nil {
		return nil, err
	}
	var saved savedConfig
	if err := s.State(snapshotConfigPart, &saved); err != nil {
		s.Close()
		return nil, err
	}
	cfg, err := saved.restoreConfig(host)
	if err == nil {
		cfg, err = cfg.withDefaults()
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	m := &Machine{cfg: cfg, log: cfg.Log, snap: s}
	if err := m.build(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// restoreConfig is the saved Config with host's resources in it, after
// checking that the disks are the ones saved.
func (s *savedConfig) restoreConfig(host Config) (Config, error) {
	c := s.Config
	c.Console, c.ConsoleInput, c.Log, c.MetricsSocket = host.Console, host.ConsoleInput, host.Log, host.MetricsSocket
	if host.Vsock != nil {
		if c.Vsock == nil {
			return c, fmt.Errorf("%w: a vsock device given, but the snapshot's machine has none", ErrConfig)
		}
		v := *c.Vsock
		if host.Vsock.CID != 0 {
			v.CID = host.Vsock.CID
		}
		if host.Vsock.UDSPath != "" {
			v.UDSPath = host.Vsock.UDSPath
		}
		c.Vsock = &v
	}
	if host.Disks != nil {
		if len(host.Disks) != len(c.Disks) {
			return c, fmt.Errorf("%w: %d disks given; the snapshot's machine has %d", ErrConfig, len(host.Disks), len(c.Disks))
		}
		c.Disks = append([]DiskConfig(nil), c.Disks...)
		for i := range c.Disks {
			c.Disks[i].Path = host.Disks[i].Path
		}
	}
	if host.Nets != nil {
		if len(host.Nets) != len(c.Nets) {
			return c, fmt.Errorf("%w: %d network devices given; the snapshot's machine has %d", ErrConfig, len(host.Nets), len(c.Nets))
		}
		nets := append([]NetConfig(nil), host.Nets...)
		for i := range nets {
			if nets[i].MAC == nil {
				nets[i].MAC = c.Nets[i].MAC
			}
		}
		c.Nets = nets
	}
	if host.Shares != nil {
		if len(host.Shares) != len(c.Shares) {
			return c, fmt.Errorf("%w: %d shared directories given; the snapshot's machine has %d", ErrConfig, len(host.Shares), len(c.Shares))
		}
		c.Shares = append([]ShareConfig(nil), c.Shares...)
		for i := range c.Shares {
			c.Shares[i].Path = host.Shares[i].Path
		}
	}
	if len(s.Disks) != len(c.Disks) {
		return c, fmt.Errorf("%w: the snapshot describes %d disks but configures %d", ErrConfig, len(s.Disks), len(c.Disks))
	}
	for i, d := range c.Disks {
		st, err := os.Stat(d.Path)
		if err != nil {
			return c, fmt.Errorf("%w: disk %s: %w", ErrConfig, d.Path, err)
		}
		if want := s.Disks[i]; st.Size() != want.Size || !st.ModTime().Equal(want.ModTime) {
			return c, fmt.Errorf("%w: disk %s changed since the snapshot (%d bytes, modified %s; the snapshot saw %d bytes, modified %s)",
				ErrConfig, d.Path, st.Size(), st.ModTime().Format(time.RFC3339Nano), want.Size, want.ModTime.Format(time.RFC3339Nano))
		}
	}
	return c, nil
}
