package vmm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/internal/snapshot"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/kvm/loader"
)

// Guest physical layout (docs/machine.md).
const (
	mmioGapStart = 0xc000_0000   // RAM below this, MMIO above
	highRAMStart = 0x1_0000_0000 // RAM beyond the gap continues here
	tssAddr      = 0xfffb_d000   // KVM_SET_TSS_ADDR: 3 pages in the MMIO gap
	lapicBusKHz  = 1_000_000     // KVM's emulated APIC timer runs at 1 GHz
)

// ErrConfig marks an invalid configuration (microvm.ErrConfig is this
// value; the CLI reports it as a usage error).
var ErrConfig = errors.New("invalid configuration")

// IRQChip is the interrupt controller model.
type IRQChip string

// The models (microvm.Config.IRQChip documents them).
const (
	IRQChipSplit  IRQChip = "split"
	IRQChipKernel IRQChip = "kernel"
)

// Config is what the machine floor needs: the guest's kernel, CPUs, memory
// and console. The caller has checked the values (microvm.Config does);
// New checks only what needs the host: the files, and KVM.
type Config struct {
	Kernel, Initrd, Cmdline string
	CPUs                    int
	MemoryBytes             uint64
	HideCPUFeatures         []string
	Console                 io.Writer
	ConsoleInput            io.Reader
	IRQChip                 IRQChip
	NoACPI                  bool
	Log                     logrus.FieldLogger
	// Restore, when set, builds the machine from this snapshot instead of
	// a kernel (snapshot.go): Kernel and Initrd are ignored, guest memory
	// is the snapshot's, mapped copy-on-write, and Restore takes Boot's
	// place. The caller keeps the snapshot open until Close.
	Restore *snapshot.Snapshot
	// RestoreBases, when Restore is a diff snapshot, are the snapshots its
	// memory diffs apply onto, oldest (a full snapshot) first, each the
	// base of the next and the last Restore's (snapshot.MapMemoryChain).
	RestoreBases []*snapshot.Snapshot
	// Prefault, with Restore, reads the snapshot's guest memory in at
	// once (snapshot.Snapshot.Prefault) rather than page by page as the
	// guest touches it.
	Prefault bool
	// TrackDirty logs the pages written to guest memory, by the guest
	// (KVM's dirty log) and by the devices (guestmem.TrackDirty), so that
	// SaveSnapshot can write a diff: the pages written since the machine's
	// previous snapshot, or since its restore. It costs the guest a
	// write-protection fault on the first write to each page after each
	// snapshot.
	TrackDirty bool
}

// ExitKind says why a machine stopped.
type ExitKind int

// Exit kinds.
const (
	ExitDebugPort   ExitKind = iota + 1 // the guest wrote its status to port 0xf4
	ExitReset                           // the guest reset the machine (i8042, ACPI reset register, KVM system event)
	ExitPowerOff                        // the guest powered off (ACPI S5, KVM system event)
	ExitTripleFault                     // KVM_EXIT_SHUTDOWN
	ExitCanceled                        // the Run context was canceled (a signal in the CLI)
	ExitError                           // the VMM failed
	ExitSnapshot                        // a snapshot was taken with the machine to stop after it (StopSnapshotted)
)

// String names the exit kind as logs and test failures show it.
func (k ExitKind) String() string {
	if k < ExitDebugPort || k > ExitSnapshot {
		return "?"
	}
	return [...]string{"?", "debug-exit", "reset", "power-off", "triple-fault", "canceled", "error", "snapshot"}[k]
}

// Exit statuses the CLI uses (docs/cli.md, "Exit status").
const (
	StatusOK          = 0
	StatusError       = 1
	StatusUsage       = 2
	StatusTripleFault = 125
)

// Result is how a machine ended.
type Result struct {
	// Kind says why the machine stopped.
	Kind ExitKind
	// Status is the process exit status the CLI uses for this result.
	Status int
	// Err is set for ExitError.
	Err error
}

// Machine is one KVM virtual machine: memory, interrupt controllers,
// platform devices, virtio-mmio slots and vCPUs. Its life: New, AddVirtio
// for each device, Boot, Run once, Close.
type Machine struct {
	cfg Config
	log logrus.FieldLogger

	sys   *kvm.System
	vm    *kvm.VM
	mem   *guestmem.Memory
	vcpus []*kvm.VCPU

	hide []kvm.Feature // CPUID features hidden from the guest
	msrs []uint32      // the host's MSR index list (msrIndices), read at Boot or Restore

	// The kernel and initrd, open from New until Boot loads them.
	kernel, initrd *os.File
	kimg           loader.Image
	iimg           *loader.Image

	pio, mmio *devices.Bus
	serial    *devices.Serial
	pvwait    *devices.PVWait
	// The platform devices a snapshot saves besides serial and pvwait
	// (snapshot.go); portB and ioapic only with the split irqchip.
	kbd     *devices.I8042
	cmos    *devices.CMOS
	portB   *devices.PortB
	ioapic  *devices.IOAPIC
	slots   []virtioSlot
	closers []func() error // device teardown, run in reverse

	// vmgenid is the VM generation ID, with ACPI (vmgenid.go);
	// announceGeneration says Run is to raise its interrupt (a restore).
	vmgenid            *devices.VMGenID
	announceGeneration bool

	// One set of counters per vCPU (counters.go). Set by Boot and never
	// changed, so Metrics may read them from any goroutine, even after
	// Close.
	vcpuCtrs []*vcpuCounters

	stopOnce sync.Once
	result   Result
	stopped  chan struct{}

	running atomic.Bool // Run started the vCPUs
	pause   pauseState  // pause.go
	peek    peekState   // peek.go
}

// New creates the VM described by cfg up to its virtio devices: the
// kernel (and initrd) opened and checked, KVM's VM, guest memory, the
// interrupt controllers and the platform devices. Errors are one line
// naming what failed.
func New(cfg Config) (*Machine, error) {
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	m := &Machine{cfg: cfg, log: cfg.Log, stopped: make(chan struct{})}
	if err := m.build(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Machine) build() error {
	for _, n := range m.cfg.HideCPUFeatures {
		fs, err := kvm.ParseFeatures(n)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		m.hide = append(m.hide, fs...)
	}
	if err := m.openImages(); err != nil {
		return err
	}
	var err error
	if m.sys, err = kvm.Open(); err != nil {
		return err
	}
	if max := m.sys.MaxVCPUs(); m.cfg.CPUs > max {
		return fmt.Errorf("%w: %d vCPUs; this host's KVM allows %d", ErrConfig, m.cfg.CPUs, max)
	}
	if m.vm, err = m.sys.CreateVM(); err != nil {
		return err
	}
	// Memory slots go in before the irqchip: once the in-kernel irqchip
	// exists, every memslot update waits for an SRCU grace period (measured
	// here: 5-7 ms for one slot, against 0.1 ms before the irqchip).
	if err := m.setupMemory(); err != nil {
		return err
	}
	if err := m.vm.SetTSSAddr(tssAddr); err != nil {
		return err
	}
	if err := m.setupIRQChip(); err != nil {
		return err
	}
	return m.setupDevices()
}

// openImages opens and checks the kernel and initrd (none for a machine
// built from a snapshot). The kernel first: a missing file is the most
// common mistake and deserves its own message, before KVM is even looked
// at.
func (m *Machine) openImages() error {
	if m.cfg.Restore != nil {
		return nil
	}
	var err error
	if m.kernel, err = os.Open(m.cfg.Kernel); err != nil {
		return fmt.Errorf("kernel %s: %w", m.cfg.Kernel, unwrapPath(err))
	}
	if m.kimg, err = loader.FileImage(m.kernel); err != nil {
		return fmt.Errorf("kernel %s: %w", m.cfg.Kernel, err)
	}
	if m.cfg.Initrd != "" {
		if m.initrd, err = os.Open(m.cfg.Initrd); err != nil {
			return fmt.Errorf("initrd %s: %w", m.cfg.Initrd, unwrapPath(err))
		}
		img, err := loader.FileImage(m.initrd)
		if err != nil {
			return fmt.Errorf("initrd %s: %w", m.cfg.Initrd, err)
		}
		m.iimg = &img
	}
	// The kernel's headers are checked before KVM is opened, so a bad file
	// is reported as such on any host (missing files are reported first).
	_, err = loader.Check(m.kimg)
	return err
}

// Boot finishes the machine once its virtio devices are in their slots:
// the ACPI tables, the kernel, initrd and command line (Config.Cmdline,
// then extra, then one virtio_mmio.device= entry per slot) in guest
// memory, and the vCPUs with their CPUID and entry state.
func (m *Machine) Boot(extra []string) error {
	rsdp, err := m.setupACPI()
	if err != nil {
		return err
	}
	boot, err := loader.Load(m.mem, loader.Config{
		Kernel:  m.kimg,
		Initrd:  m.iimg,
		Cmdline: m.cmdline(extra),
		CPUs:    m.cfg.CPUs,
		RSDP:    rsdp,
	})
	if err != nil {
		return err
	}
	m.closeImages()
	m.log.WithFields(logrus.Fields{"format": boot.Kind, "entry": fmt.Sprintf("%#x", boot.RIP),
		"cpus": m.cfg.CPUs, "memory": fmt.Sprintf("%dM", m.cfg.MemoryBytes>>20)}).Debug("kernel loaded")

	cpuid, err := m.sys.SupportedCPUID()
	if err != nil {
		return err
	}
	if _, err := m.msrIndices(); err != nil {
		return err
	}
	if m.sys.CheckExtension(kvm.CapTSCDeadlineTimer) > 0 {
		// KVM emulates it but never reports it; without it Linux needs a
		// PIT to calibrate its LAPIC timer, and the split irqchip has none.
		cpuid.Show(kvm.TSCDeadline)
	}
	for _, f := range m.hide {
		cpuid.Hide(f)
	}
	for i := 0; i < m.cfg.CPUs; i++ {
		v, err := m.vm.CreateVCPU(i)
		if err != nil {
			return err
		}
		m.vcpus = append(m.vcpus, v)
		m.vcpuCtrs = append(m.vcpuCtrs, &vcpuCounters{})
		if i == 0 {
			// Announce the TSC frequency (timing leaf 0x40000010) so a
			// guest can keep time without calibrating against a timer.
			if khz, err := v.TSCKHz(); err == nil && khz > 0 {
				cpuid = cpuid.WithTSCFrequency(khz, lapicBusKHz)
			}
		}
		if err := m.setupVCPU(v, cpuid.ForVCPU(i, m.cfg.CPUs), boot); err != nil {
			return err
		}
	}
	return nil
}

// closeImages closes the kernel and initrd files once loaded (or at Close).
func (m *Machine) closeImages() {
	for _, f := range []**os.File{&m.kernel, &m.initrd} {
		if *f != nil {
			(*f).Close()
			*f = nil
		}
	}
}

// unwrapPath drops the *PathError wrapper so messages name the file once.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// setupIRQChip creates the interrupt controllers (Config.IRQChip). The
// split model's IOAPIC joins the MMIO bus in setupDevices.
func (m *Machine) setupIRQChip() error {
	if m.cfg.IRQChip == IRQChipKernel {
		if err := m.vm.CreateIRQChip(); err != nil {
			return err
		}
		return m.vm.CreatePIT2()
	}
	if err := m.sys.Require(kvm.CapSplitIRQChip); err != nil {
		return fmt.Errorf("%w (use --irqchip kernel)", err)
	}
	return m.vm.EnableSplitIRQChip(devices.IOAPICPins)
}

// updateRoutes installs the IOAPIC's pin routes as KVM's GSI routing table:
// GSI N (where pin N's irqfd signals) becomes the MSI that pin's redirection
// entry describes; masked pins get no route, so their interrupts are dropped.
func (m *Machine) updateRoutes(pins [devices.IOAPICPins]devices.IOAPICRoute) {
	routes := make([]kvm.MSIRoute, 0, len(pins))
	for gsi, p := range pins {
		if !p.Masked {
			routes = append(routes, kvm.MSIRoute{GSI: uint32(gsi), AddrLo: p.MSI.AddrLo, AddrHi: p.MSI.AddrHi, Data: p.MSI.Data})
		}
	}
	if err := m.vm.SetGSIRouting(routes); err != nil {
		m.log.WithError(err).Error("ioapic: routes not installed")
	}
}

// setupMemory maps guest RAM (below the MMIO gap, and above 4 GiB for the
// rest) and registers each range with KVM.
func (m *Machine) setupMemory() error {
	size := m.cfg.MemoryBytes
	ranges := []guestmem.Range{{GPA: 0, Size: min(size, mmioGapStart)}}
	if size > mmioGapStart {
		ranges = append(ranges, guestmem.Range{GPA: highRAMStart, Size: size - mmioGapStart})
	}
	var mem *guestmem.Memory
	var err error
	if m.cfg.Restore != nil {
		mem, err = m.restoreMemory(ranges)
	} else {
		mem, err = guestmem.NewAnonymous(ranges...)
	}
	if err != nil {
		return err
	}
	m.mem = mem
	var flags kvm.MemoryFlags
	if m.cfg.TrackDirty {
		mem.TrackDirty()
		flags = kvm.MemLogDirtyPages
	}
	for slot, r := range ranges {
		addr, err := mem.HostAddr(r.GPA)
		if err != nil {
			return err
		}
		if err := m.vm.SetMemoryRegionFlags(uint32(slot), r.GPA, r.Size, addr, flags); err != nil {
			return err
		}
	}
	return nil
}

// setupDevices builds the buses and the platform devices.
func (m *Machine) setupDevices() error {
	m.pio = devices.NewBus("pio")
	m.mmio = devices.NewBus("mmio")

	irq, err := eventfd.New()
	if err != nil {
		return err
	}
	m.closers = append(m.closers, irq.Close)
	if err := m.registerIRQFD(irq.FD(), devices.COM1IRQ); err != nil {
		return err
	}
	m.serial = devices.NewSerial(m.cfg.Console, func() { _ = irq.Signal() })
	m.closers = append(m.closers, func() error { m.serial.Close(); return nil })

	var low, high uint64
	for _, r := range m.mem.Ranges() {
		if r.GPA < highRAMStart {
			low += r.Size
		} else {
			high += r.Size
		}
	}
	m.pvwait = devices.NewPVWait()
	m.kbd = devices.NewI8042(func() { m.stop(Result{Kind: ExitReset, Status: StatusOK}) })
	m.cmos = devices.NewCMOS(low, high)
	type reg struct {
		base, size uint64
		name       string
		dev        devices.Device
	}
	regs := []reg{
		{devices.COM1Port, devices.SerialPorts, "serial", m.serial},
		{devices.I8042DataPort, 1, "i8042-data", m.kbd.DataPort()},
		{devices.I8042CommandPort, 1, "i8042-cmd", m.kbd.CommandPort()},
		{devices.CMOSPort, devices.CMOSPorts, "cmos", m.cmos},
		{devices.DebugExitPort, 1, "debug-exit", &devices.DebugExit{Exit: func(s int) {
			m.stop(Result{Kind: ExitDebugPort, Status: s})
		}}},
		{devices.PVWaitPort, 4, "pv-wait", m.pvwait},
	}
	if m.cfg.IRQChip != IRQChipKernel {
		m.portB = &devices.PortB{}
		regs = append(regs, reg{devices.PortBPort, 1, "port-b", m.portB})
		m.ioapic = devices.NewIOAPIC(uint8(m.cfg.CPUs), m.updateRoutes)
		if err := m.mmio.Register(devices.IOAPICAddr, devices.IOAPICSize, "ioapic", m.ioapic); err != nil {
			return err
		}
	}
	for _, r := range regs {
		if err := m.pio.Register(r.base, r.size, r.name, r.dev); err != nil {
			return err
		}
	}
	return nil
}

// cmdline is the configured command line, then extra, then the
// virtio-mmio device entries.
func (m *Machine) cmdline(extra []string) string {
	s := m.cfg.Cmdline
	for _, d := range append(extra, m.virtioCmdline()...) {
		if s != "" {
			s += " "
		}
		s += d
	}
	return s
}

// OnClose adds f to what Close runs, before the vCPUs, the VM and guest
// memory go, in the reverse order of the OnClose calls: for the devices
// the caller put in the machine.
func (m *Machine) OnClose(f func() error) { m.closers = append(m.closers, f) }

// ReadMemory copies guest-physical memory at gpa into p. A range outside
// guest RAM is an error; it is valid until Close.
func (m *Machine) ReadMemory(gpa uint64, p []byte) error {
	if m.mem == nil {
		return errors.New("microvm: machine has no memory (closed?)")
	}
	return m.mem.Read(gpa, p)
}

// stop records the first exit condition and makes every vCPU leave KVM_RUN.
// Any goroutine may call it; later calls are ignored.
func (m *Machine) stop(r Result) {
	m.stopOnce.Do(func() {
		m.result = r
		close(m.stopped)
		m.pvwait.Close()
		m.wakeParked()
		for _, v := range m.vcpus {
			v.Kick()
		}
	})
}

// Stopped says whether the machine has stopped or is stopping.
func (m *Machine) Stopped() bool {
	select {
	case <-m.stopped:
		return true
	default:
		return false
	}
}

// Run starts the vCPUs and blocks until the guest exits, an error stops the
// machine, or ctx is canceled; the console's last partial line is written
// before it returns. It may be called once.
func (m *Machine) Run(ctx context.Context) (Result, error) {
	if m.cfg.ConsoleInput != nil {
		go m.pumpConsoleInput()
	}
	m.running.Store(true)
	var wg sync.WaitGroup
	for i, v := range m.vcpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.runVCPU(v, m.vcpuCtrs[i])
		}()
	}
	m.announceGenerationOnRun()
	select {
	case <-m.stopped:
	case <-ctx.Done():
		m.stop(Result{Kind: ExitCanceled, Status: StatusError, Err: ctx.Err()})
	}
	wg.Wait()
	m.serial.Flush()
	r := m.result
	if r.Kind == ExitError {
		return r, r.Err
	}
	return r, nil
}

// pumpConsoleInput copies host input to the UART until EOF or stop. The
// goroutine may stay blocked in Read after the machine stopped (stdin cannot
// be interrupted); it holds nothing the teardown needs.
func (m *Machine) pumpConsoleInput() {
	buf := make([]byte, 256)
	for {
		n, err := m.cfg.ConsoleInput.Read(buf)
		if n > 0 {
			if m.serial.Input(buf[:n]) < n {
				return // closed
			}
		}
		if err != nil {
			return
		}
		select {
		case <-m.stopped:
			return
		default:
		}
	}
}

// runVCPU is the body of a vCPU goroutine. Its OS thread is never
// unlocked: it ends with the goroutine, so the thread's CPU time, which
// ctr reports, is this vCPU's alone (no other goroutine runs on it
// before or after).
func (m *Machine) runVCPU(v *kvm.VCPU, ctr *vcpuCounters) {
	runtime.LockOSThread()
	v.BindThread()
	ctr.bind()
	defer ctr.unbind()
	for {
		select {
		case <-m.stopped:
			return
		default:
		}
		if m.park(v) {
			return
		}
		m.servePeek(v)
		reason, err := v.Run()
		if err != nil {
			m.stop(Result{Kind: ExitError, Status: StatusError, Err: err})
			return
		}
		ctr.exit(reason)
		if err := m.handleExit(v, reason); err != nil {
			m.stop(Result{Kind: ExitError, Status: StatusError, Err: err})
			return
		}
	}
}

// Close releases everything New created, in reverse order: the devices
// (OnClose, AddVirtio), then vCPUs, VM, guest memory and /dev/kvm. The
// machine must not be running.
func (m *Machine) Close() error {
	var errs []error
	m.closeImages()
	for i := len(m.closers) - 1; i >= 0; i-- {
		errs = append(errs, m.closers[i]())
	}
	m.closers = nil
	for i := len(m.vcpus) - 1; i >= 0; i-- {
		errs = append(errs, m.vcpus[i].Close())
	}
	m.vcpus = nil
	if m.vm != nil {
		errs = append(errs, m.vm.Close())
		m.vm = nil
	}
	if m.mem != nil {
		errs = append(errs, m.mem.Close())
		m.mem = nil
	}
	if m.sys != nil {
		errs = append(errs, m.sys.Close())
		m.sys = nil
	}
	return errors.Join(errs...)
}
