package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices"
	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/internal/metricsrv"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/kvm/loader"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
)

// Guest physical layout (docs/machine.md).
const (
	mmioGapStart = 0xc000_0000   // RAM below this, MMIO above
	highRAMStart = 0x1_0000_0000 // RAM beyond the gap continues here
	tssAddr      = 0xfffb_d000   // KVM_SET_TSS_ADDR: 3 pages in the MMIO gap
	lapicBusKHz  = 1_000_000     // KVM's emulated APIC timer runs at 1 GHz
)

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
)

// String names the exit kind as logs and test failures show it.
func (k ExitKind) String() string {
	return [...]string{"?", "debug-exit", "reset", "power-off", "triple-fault", "canceled", "error"}[k]
}

// Exit statuses the CLI uses (README: exit codes).
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

// Machine is a configured VM ready to Run.
type Machine struct {
	cfg Config
	log logrus.FieldLogger

	sys   *kvm.System
	vm    *kvm.VM
	mem   *guestmem.Memory
	vcpus []*kvm.VCPU
	boot  *loader.Boot

	pio, mmio   *devices.Bus
	serial      *devices.Serial
	pvwait      *devices.PVWait
	virtio      []*virtioSlot
	vsock       *vsock.Device
	uds         *vsock.UDS
	vsockRouter *vsockRouter // the device's Dialer: ListenVsock listeners, else uds_<port>
	nets        []*virtionet.Device
	rng         *rng.Device
	disks       []*blk.Device  // Config.Disks, in order
	closers     []func() error // device teardown, run in reverse

	// Counters (metrics.go): each device's transport, and one set per
	// vCPU. Set by New and never changed, so Metrics may read them from
	// any goroutine, even after Close.
	vsockMMIO, rngMMIO *virtio.MMIO
	diskMMIO, netMMIO  []*virtio.MMIO
	vcpuCtrs           []*vcpuCounters
	metricsSrv         *metricsrv.Server // Config.MetricsSocket; nil without

	stopOnce sync.Once
	result   Result
	stopped  chan struct{}
}

// New creates the machine described by cfg: KVM VM, memory, devices, kernel.
// Errors are one line naming what failed.
func New(cfg Config) (*Machine, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Machine{cfg: c, log: c.Log, stopped: make(chan struct{})}
	if err := m.build(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Machine) build() error {
	hide := make([]kvm.Feature, 0, len(m.cfg.HideCPUFeatures))
	for _, n := range m.cfg.HideCPUFeatures {
		fs, err := kvm.ParseFeatures(n)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		hide = append(hide, fs...)
	}
	// Open the kernel first: a missing file is the most common mistake and
	// deserves its own message, before KVM is even looked at.
	kf, err := os.Open(m.cfg.Kernel)
	if err != nil {
		return fmt.Errorf("kernel %s: %w", m.cfg.Kernel, unwrapPath(err))
	}
	defer kf.Close()
	kimg, err := loader.FileImage(kf)
	if err != nil {
		return fmt.Errorf("kernel %s: %w", m.cfg.Kernel, err)
	}
	var iimg *loader.Image
	if m.cfg.Initrd != "" {
		f, err := os.Open(m.cfg.Initrd)
		if err != nil {
			return fmt.Errorf("initrd %s: %w", m.cfg.Initrd, unwrapPath(err))
		}
		defer f.Close()
		img, err := loader.FileImage(f)
		if err != nil {
			return fmt.Errorf("initrd %s: %w", m.cfg.Initrd, err)
		}
		iimg = &img
	}
	// The kernel's headers are checked before KVM is opened, so a bad file
	// is reported as such on any host (missing files are reported first).
	if _, err := loader.Check(kimg); err != nil {
		return err
	}

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
	if err := m.setupDevices(); err != nil {
		return err
	}
	rsdp, err := m.setupACPI()
	if err != nil {
		return err
	}

	m.boot, err = loader.Load(m.mem, loader.Config{
		Kernel:  kimg,
		Initrd:  iimg,
		Cmdline: m.cmdline(),
		CPUs:    m.cfg.CPUs,
		RSDP:    rsdp,
	})
	if err != nil {
		return err
	}
	m.log.WithFields(logrus.Fields{"format": m.boot.Kind, "entry": fmt.Sprintf("%#x", m.boot.RIP),
		"cpus": m.cfg.CPUs, "memory": FormatSize(m.cfg.MemoryBytes)}).Debug("kernel loaded")

	cpuid, err := m.sys.SupportedCPUID()
	if err != nil {
		return err
	}
	if m.sys.CheckExtension(kvm.CapTSCDeadlineTimer) > 0 {
		// KVM emulates it but never reports it; without it Linux needs a
		// PIT to calibrate its LAPIC timer, and the split irqchip has none.
		cpuid.Show(kvm.TSCDeadline)
	}
	for _, f := range hide {
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
		if err := m.setupVCPU(v, cpuid.ForVCPU(i, m.cfg.CPUs)); err != nil {
			return err
		}
	}
	// Last, once nothing else can fail: the metrics server reads what
	// the steps above built.
	if p := m.cfg.MetricsSocket; p != "" {
		if m.metricsSrv, err = metricsrv.Start(p, m.MetricsHandler(), m.log); err != nil {
			return err
		}
	}
	return nil
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
	mem, err := guestmem.NewAnonymous(ranges...)
	if err != nil {
		return err
	}
	m.mem = mem
	for slot, r := range ranges {
		addr, err := mem.HostAddr(r.GPA)
		if err != nil {
			return err
		}
		if err := m.vm.SetMemoryRegion(uint32(slot), r.GPA, r.Size, addr); err != nil {
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
	if err := m.vm.RegisterIRQFD(irq.FD(), devices.COM1IRQ); err != nil {
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
	kbd := devices.NewI8042(func() { m.stop(Result{Kind: ExitReset, Status: StatusOK}) })
	regs := []struct {
		base, size uint64
		name       string
		dev        devices.Device
	}{
		{devices.COM1Port, devices.SerialPorts, "serial", m.serial},
		{devices.I8042DataPort, 1, "i8042-data", kbd.DataPort()},
		{devices.I8042CommandPort, 1, "i8042-cmd", kbd.CommandPort()},
		{devices.CMOSPort, devices.CMOSPorts, "cmos", devices.NewCMOS(low, high)},
		{devices.DebugExitPort, 1, "debug-exit", &devices.DebugExit{Exit: func(s int) {
			m.stop(Result{Kind: ExitDebugPort, Status: s})
		}}},
		{devices.PVWaitPort, 4, "pv-wait", m.pvwait},
	}
	if m.cfg.IRQChip == IRQChipSplit {
		regs = append(regs, struct {
			base, size uint64
			name       string
			dev        devices.Device
		}{devices.PortBPort, 1, "port-b", &devices.PortB{}})
		ioapic := devices.NewIOAPIC(uint8(m.cfg.CPUs), m.updateRoutes)
		if err := m.mmio.Register(devices.IOAPICAddr, devices.IOAPICSize, "ioapic", ioapic); err != nil {
			return err
		}
	}
	for _, r := range regs {
		if err := m.pio.Register(r.base, r.size, r.name, r.dev); err != nil {
			return err
		}
	}
	return m.setupVirtio()
}

// cmdline is the configured command line plus the root disk and the
// virtio-mmio device entries.
func (m *Machine) cmdline() string {
	s := m.cfg.Cmdline
	extra := m.virtioCmdline()
	if r := m.cfg.rootCmdline(); r != "" {
		extra = append([]string{r}, extra...)
	}
	for _, d := range extra {
		if s != "" {
			s += " "
		}
		s += d
	}
	return s
}

// ReadMemory copies guest-physical memory at gpa into p (for example a
// result the guest left behind). A range outside guest RAM is an error; it
// is valid until Close.
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
		for _, v := range m.vcpus {
			v.Kick()
		}
	})
}

// hasStopped says whether the machine has stopped or is stopping.
func (m *Machine) hasStopped() bool {
	select {
	case <-m.stopped:
		return true
	default:
		return false
	}
}

// Run starts the vCPUs and blocks until the guest exits, an error stops the
// machine, or ctx is canceled. It may be called once.
func (m *Machine) Run(ctx context.Context) (Result, error) {
	if m.cfg.ConsoleInput != nil {
		go m.pumpConsoleInput()
	}
	m.startDevices()
	var wg sync.WaitGroup
	for i, v := range m.vcpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.runVCPU(v, m.vcpuCtrs[i])
		}()
	}
	select {
	case <-m.stopped:
	case <-ctx.Done():
		m.stop(Result{Kind: ExitCanceled, Status: StatusError, Err: ctx.Err()})
	}
	wg.Wait()
	m.serial.Flush()
	if m.vsock != nil {
		// The guest will not run again: close its connections now, so
		// host peers (a DialVsock caller, a Unix-socket client) see the
		// end instead of waiting until Close. Stats stay readable.
		m.vsock.Close()
	}
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

// Close releases everything New created, in reverse order. The machine must
// not be running.
func (m *Machine) Close() error {
	var errs []error
	if m.metricsSrv != nil {
		// First: a scrape in flight finishes before anything goes away.
		errs = append(errs, m.metricsSrv.Close())
		m.metricsSrv = nil
	}
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
