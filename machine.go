package microvm

import (
	"context"
	"errors"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/metricsrv"
	"github.com/microvm/microvm/internal/snapshot"
	"github.com/microvm/microvm/internal/vmm"
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

// Exit statuses the CLI uses (docs/cli.md, "Exit status").
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
	deviceSet              // the virtio devices (devices.go, a part per kind)

	metricsSrv *metricsrv.Server // Config.MetricsSocket; nil without

	snap *snapshot.Snapshot // what Restore built the machine from; nil for New
	// bases are the snapshots snap's memory diffs apply onto, oldest
	// first (snapshot.go); nil unless snap is a diff snapshot.
	bases []*snapshot.Snapshot
	// diffBase is what a diff snapshot (SnapshotOptions.Diff) is taken
	// against: the machine's last snapshot, or the one it was restored
	// from; nil when there is none, or the dirty logs restarted without
	// one (a failed snapshot). Guarded by snapMu.
	diffBase *snapshotRef
	// macChanges are the network devices whose MAC Restore changed
	// (MACChanges); nil for New.
	macChanges []MACChange
	// macsAdopted counts the first macChanges that AdoptMACs applied.
	// Guarded by macMu, which AdoptMACs holds throughout, so two callers
	// never set the same address twice.
	macsAdopted int
	macMu       sync.Mutex
	// runEnded is closed when Run returns (WaitAgent stops waiting);
	// endRun closes it once.
	runEnded chan struct{}
	endRun   sync.Once
	// snapMu serializes Snapshot: two saves at once (a named VM's API
	// takes concurrent requests) would share diffBase and the pause.
	snapMu sync.Mutex
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
	m.runEnded = make(chan struct{})
	vc := m.cfg.vmmConfig()
	vc.Restore, vc.RestoreBases, vc.Prefault = m.snap, m.bases, m.cfg.PrefaultMemory
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
	m.endRun.Do(func() { close(m.runEnded) })
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

// VCPUInfo is where one vCPU stood when PeekVCPUs asked: its instruction
// and stack pointers, flags, page-table root and whether it is halted
// waiting for an interrupt. Its String is one line.
type VCPUInfo = vmm.VCPUInfo

// PeekVCPUs reads where each vCPU stands, for a post-mortem of a guest
// that stopped making progress (a boot that hung before its agent
// answered): each vCPU leaves the guest for the few microseconds its
// registers take to read, on its own thread, and goes on. It fails when
// the machine is not running or is paused, or when ctx ends before every
// vCPU answered (with the answers it has).
func (m *Machine) PeekVCPUs(ctx context.Context) ([]VCPUInfo, error) {
	return m.vm.PeekVCPUs(ctx)
}

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
	for _, b := range m.bases {
		errs = append(errs, b.Close())
	}
	m.bases = nil
	return errors.Join(errs...)
}

// Config returns the configuration the machine was built with (for a
// restored one: the snapshot's, with the host's resources).
func (m *Machine) Config() Config { return m.cfg }
