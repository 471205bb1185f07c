package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/kvm/guestmem"
)

// virtio-mmio register offsets, version 2 (virtio 1.2, 4.2.2).
const (
	RegMagic             = 0x000
	RegVersion           = 0x004
	RegDeviceID          = 0x008
	RegVendorID          = 0x00c
	RegDeviceFeatures    = 0x010
	RegDeviceFeaturesSel = 0x014
	RegDriverFeatures    = 0x020
	RegDriverFeaturesSel = 0x024
	RegQueueSel          = 0x030
	RegQueueNumMax       = 0x034
	RegQueueNum          = 0x038
	RegQueueReady        = 0x044
	RegQueueNotify       = 0x050
	RegInterruptStatus   = 0x060
	RegInterruptACK      = 0x064
	RegStatus            = 0x070
	RegQueueDescLow      = 0x080
	RegQueueDescHigh     = 0x084
	RegQueueDriverLow    = 0x090
	RegQueueDriverHigh   = 0x094
	RegQueueDeviceLow    = 0x0a0
	RegQueueDeviceHigh   = 0x0a4
	RegConfigGeneration  = 0x0fc
	RegConfig            = 0x100

	// MMIOSize is the size of a virtio-mmio register window.
	MMIOSize = 0x1000

	mmioMagic   = 0x74726976 // "virt"
	mmioVersion = 2
	// VendorID is what microvm devices report ("MVM\0").
	VendorID = 0x004d564d

	// Interrupt status bits (4.2.2).
	IntUsedBuffer   = 1
	IntConfigChange = 2
)

// queueRegs is the driver's configuration of one queue.
type queueRegs struct {
	size              uint16
	ready             bool
	desc, avail, used uint64
}

// MMIO is the virtio-mmio transport of one device: the register file, the
// status state machine (status.go), feature negotiation and queue setup. It
// activates the device when the driver sets DRIVER_OK.
//
// Concurrency: Read and Write come from vCPU goroutines and are serialised
// by mu. The interrupt status has its own lock (irqMu), taken by device
// workers through the queues' Interrupt and by Fail.
type MMIO struct {
	dev   Device
	log   logrus.FieldLogger
	mem   *guestmem.Memory
	raise func() // pulses the device's interrupt line
	kicks []*eventfd.EventFD

	mu sync.Mutex // guards the fields below
	// bind, when set (BindKicks), routes queue i's notifications to
	// kicks[i] without a vCPU exit (under KVM: an ioeventfd). It is called
	// once per queue, the first time an activation hands that queue to
	// the device; bound records which were.
	bind       func(queue int, kick *eventfd.EventFD) error
	bound      []bool
	status     uint32 // driver-visible bits except NEEDS_RESET
	devFeatSel uint32
	drvFeatSel uint32
	drvFeat    uint64
	queueSel   uint32
	queues     []queueRegs
	active     bool // the device's session runs
	configGen  uint32
	// quiesced says the driver set DRIVER_OK but no session runs:
	// Quiesce stopped it, or RestoreState found DEVICE_NEEDS_RESET and
	// started none (state.go). DRIVER_OK is set exactly when active or
	// quiesced is. live are the queues the last activation handed the
	// device (nil where a queue was not ready), from which Resume and
	// SaveState take the positions.
	live     []*Queue
	quiesced bool

	needsReset  atomic.Bool
	activations atomic.Uint64 // bumped on each activation and reset
	irqMu       sync.Mutex    // guards intStatus
	intStatus   uint32

	// Counters (TransportStats), atomics bumped by whichever goroutine
	// sees the event: vCPU goroutines for register accesses, device
	// workers for interrupts and Fail.
	guestErrors             GuestErrors
	usedIRQs, configIRQs    atomic.Uint64
	activated, driverResets atomic.Uint64
	notifyExits             atomic.Uint64
}

// TransportGuestErrorKinds are the kinds the transport reports
// (TransportStats.GuestErrors).
var TransportGuestErrorKinds = []GuestErrorKind{GuestErrRegister, GuestErrFeatures, GuestErrQueue, GuestErrStatus, GuestErrDevice}

// TransportStats are the transport's counters for its device: what every
// virtio-mmio device has, whatever its type.
type TransportStats struct {
	// UsedBufferInterrupts and ConfigInterrupts count the interrupts the
	// transport raised (used-buffer notifications from the device's
	// queues; configuration changes, which microvm sends only with
	// DEVICE_NEEDS_RESET). Each is one irqfd signal.
	UsedBufferInterrupts, ConfigInterrupts uint64
	// GuestErrors counts driver errors by kind (the transport's kinds,
	// TransportGuestErrorKinds); each was logged.
	GuestErrors GuestErrorCounts
	// Activations counts DRIVER_OK moves that started the device;
	// DriverResets the driver's writes of 0 to the status register.
	Activations, DriverResets uint64
	// NotifyExits counts queue notifications that reached the transport
	// as register writes, each a vCPU exit: those before the queue was
	// bound (BindKicks), or all of them where nothing binds. Under KVM a
	// driver that notifies only after DRIVER_OK, as the spec has it,
	// leaves this at 0.
	NotifyExits uint64
}

// GuestErrorsTotal is the sum of GuestErrors.
func (s TransportStats) GuestErrorsTotal() uint64 { return s.GuestErrors.Total() }

// NewMMIO returns the transport for dev over guest memory mem. raise pulses
// the device's interrupt line (under KVM: signals an irqfd). The transport
// creates one kick eventfd per queue (KickFDs) for the VMM to register as
// ioeventfds.
func NewMMIO(dev Device, mem *guestmem.Memory, raise func(), log logrus.FieldLogger) (*MMIO, error) {
	t := &MMIO{dev: dev, mem: mem, raise: raise, log: log}
	for range dev.QueueSizes() {
		e, err := eventfd.NewNonblocking()
		if err != nil {
			t.Close()
			return nil, err
		}
		t.kicks = append(t.kicks, e)
	}
	t.queues = make([]queueRegs, len(t.kicks))
	t.bound = make([]bool, len(t.kicks))
	return t, nil
}

// KickFDs returns the (non-blocking) eventfd of each queue. A driver's
// write of queue i to RegQueueNotify signals KickFDs()[i]: through Write,
// or without a vCPU exit once BindKicks's bind has routed it.
func (t *MMIO) KickFDs() []*eventfd.EventFD { return t.kicks }

// BindKicks has the transport call bind(i, KickFDs()[i]) the first time a
// DRIVER_OK hands queue i to the device, on the vCPU goroutine writing the
// status: the VMM registers an ioeventfd on RegQueueNotify with a datamatch
// on i there. Binding at first use rather than at creation means a device
// its driver never starts costs no ioeventfd: KVM waits for an SRCU grace
// period on each registration and each removal, which a short-lived VM
// pays in its start-up and teardown (docs/benchmarks.md, "Start-up"). A
// failed bind is logged and the queue's kicks keep arriving through
// Write. Call before the guest runs.
func (t *MMIO) BindKicks(bind func(queue int, kick *eventfd.EventFD) error) {
	t.mu.Lock()
	t.bind = bind
	t.mu.Unlock()
}

// Close resets the device and closes the kick eventfds.
func (t *MMIO) Close() error {
	t.mu.Lock()
	if t.active || t.quiesced {
		t.dev.Reset()
		t.active, t.quiesced = false, false
	}
	t.mu.Unlock()
	var errs []error
	for _, k := range t.kicks {
		errs = append(errs, k.Close())
	}
	return errors.Join(errs...)
}

// GuestErrors counts driver errors seen by the transport and the device
// (all kinds).
func (t *MMIO) GuestErrors() uint64 { return t.Stats().GuestErrorsTotal() }

// Stats returns a snapshot of the transport's counters. Safe from any
// goroutine.
func (t *MMIO) Stats() TransportStats {
	return TransportStats{
		UsedBufferInterrupts: t.usedIRQs.Load(), ConfigInterrupts: t.configIRQs.Load(),
		Activations: t.activated.Load(), DriverResets: t.driverResets.Load(),
		NotifyExits: t.notifyExits.Load(),
		GuestErrors: t.guestErrors.Counts(),
	}
}

// Status returns the device status byte as the driver would read it.
func (t *MMIO) Status() uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statusLocked()
}

func (t *MMIO) statusLocked() uint32 {
	s := t.status
	if t.needsReset.Load() {
		s |= StatusNeedsReset
	}
	return s
}

// Fail records a guest error: counted, logged, and the device is marked
// DEVICE_NEEDS_RESET with a configuration-change interrupt (2.1.2). Safe
// from any goroutine; it does not take mu. It counts as GuestErrDevice.
func (t *MMIO) Fail(err error) { t.fail(GuestErrDevice, err) }

// fail is Fail for an error of the given kind.
func (t *MMIO) fail(kind GuestErrorKind, err error) {
	t.guestErrors.Add(kind)
	t.log.WithError(err).Warn("virtio: guest error, device needs reset")
	if t.needsReset.Swap(true) {
		return
	}
	t.interrupt(IntConfigChange)
}

// guestError counts and logs a register misuse that does not stop the
// device.
func (t *MMIO) guestError(kind GuestErrorKind, format string, args ...any) {
	t.guestErrors.Report(t.log, kind, "virtio-mmio: ", format, args...)
}

func (t *MMIO) interrupt(bits uint32) {
	if bits&IntUsedBuffer != 0 {
		t.usedIRQs.Add(1)
	}
	if bits&IntConfigChange != 0 {
		t.configIRQs.Add(1)
	}
	t.irqMu.Lock()
	t.intStatus |= bits
	t.irqMu.Unlock()
	t.raise()
}

// Read implements devices.Device for the register window.
func (t *MMIO) Read(offset uint64, data []byte) {
	clear(data)
	if offset >= RegConfig {
		t.mu.Lock()
		t.dev.ReadConfig(offset-RegConfig, data)
		t.mu.Unlock()
		return
	}
	if len(data) != 4 || offset%4 != 0 {
		t.guestError(GuestErrRegister, "%d-byte read at register offset %#x", len(data), offset)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var v uint32
	switch offset {
	case RegMagic:
		v = mmioMagic
	case RegVersion:
		v = mmioVersion
	case RegDeviceID:
		v = t.dev.Type()
	case RegVendorID:
		v = VendorID
	case RegDeviceFeatures:
		f := t.dev.Features() | QueueFeatures
		switch t.devFeatSel {
		case 0:
			v = uint32(f)
		case 1:
			v = uint32(f >> 32)
		}
	case RegQueueNumMax:
		// 0 means "queue not available" (4.2.2), so only for a queue
		// that does not exist.
		if q := t.selected(); q >= 0 {
			v = uint32(t.dev.QueueSizes()[q])
		}
	case RegQueueNum:
		if q := t.selected(); q >= 0 {
			v = uint32(t.queues[q].size)
		}
	case RegQueueReady:
		if q := t.selected(); q >= 0 && t.queues[q].ready {
			v = 1
		}
	case RegInterruptStatus:
		t.irqMu.Lock()
		v = t.intStatus
		t.irqMu.Unlock()
	case RegStatus:
		v = t.statusLocked()
	case RegConfigGeneration:
		v = t.configGen
	default:
		// Write-only or reserved registers read as zero.
	}
	binary.LittleEndian.PutUint32(data, v)
}

// selected returns the selected queue index, or -1 when QueueSel names no
// queue.
func (t *MMIO) selected() int {
	if int(t.queueSel) < len(t.queues) {
		return int(t.queueSel)
	}
	return -1
}

// Write implements devices.Device for the register window.
func (t *MMIO) Write(offset uint64, data []byte) {
	if offset >= RegConfig {
		t.mu.Lock()
		t.dev.WriteConfig(offset-RegConfig, data)
		t.mu.Unlock()
		return
	}
	if len(data) != 4 || offset%4 != 0 {
		t.guestError(GuestErrRegister, "%d-byte write at register offset %#x", len(data), offset)
		return
	}
	v := binary.LittleEndian.Uint32(data)
	if offset == RegQueueNotify {
		// Once the device has started, normally caught by the ioeventfd
		// (BindKicks); this path serves kicks before that and setups
		// without one (tests, or a failed registration).
		if int(v) < len(t.kicks) {
			t.notifyExits.Add(1)
			_ = t.kicks[v].Signal()
		} else {
			t.guestError(GuestErrRegister, "notify of queue %d; the device has %d", v, len(t.kicks))
		}
		return
	}
	if offset == RegInterruptACK {
		t.irqMu.Lock()
		t.intStatus &^= v
		t.irqMu.Unlock()
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch offset {
	case RegDeviceFeaturesSel:
		t.devFeatSel = v
	case RegDriverFeaturesSel:
		t.drvFeatSel = v
	case RegDriverFeatures:
		if t.status != StatusAcknowledge|StatusDriver {
			t.guestError(GuestErrFeatures, "driver features written in status %s", StatusString(t.status))
			return
		}
		switch t.drvFeatSel {
		case 0:
			t.drvFeat = t.drvFeat&^0xffffffff | uint64(v)
		case 1:
			t.drvFeat = t.drvFeat&0xffffffff | uint64(v)<<32
		default:
			if v != 0 {
				t.guestError(GuestErrFeatures, "driver features word %d = %#x; only words 0 and 1 exist", t.drvFeatSel, v)
			}
		}
	case RegQueueSel:
		t.queueSel = v
	case RegQueueNum, RegQueueDescLow, RegQueueDescHigh, RegQueueDriverLow, RegQueueDriverHigh,
		RegQueueDeviceLow, RegQueueDeviceHigh:
		t.writeQueueReg(offset, v)
	case RegQueueReady:
		t.writeQueueReady(v)
	case RegStatus:
		t.writeStatus(v)
	default:
		t.guestError(GuestErrRegister, "write of %#x to read-only or reserved register %#x", v, offset)
	}
}

// queueConfigurable reports whether the driver may configure the selected
// queue now: after FEATURES_OK, before DRIVER_OK, while the queue is not
// ready (4.2.3.2).
func (t *MMIO) queueConfigurable() (int, bool) {
	q := t.selected()
	switch {
	case q < 0:
		t.guestError(GuestErrQueue, "queue %d selected; the device has %d", t.queueSel, len(t.queues))
		return q, false
	case t.status != StatusAcknowledge|StatusDriver|StatusFeaturesOK:
		t.guestError(GuestErrQueue, "queue %d configured in status %s", q, StatusString(t.status))
		return q, false
	case t.queues[q].ready:
		t.guestError(GuestErrQueue, "queue %d configured while ready", q)
		return q, false
	}
	return q, true
}

func (t *MMIO) writeQueueReg(offset uint64, v uint32) {
	q, ok := t.queueConfigurable()
	if !ok {
		return
	}
	r := &t.queues[q]
	lo := func(p *uint64) { *p = *p&^0xffffffff | uint64(v) }
	hi := func(p *uint64) { *p = *p&0xffffffff | uint64(v)<<32 }
	switch offset {
	case RegQueueNum:
		if v == 0 || v > uint32(t.dev.QueueSizes()[q]) || v&(v-1) != 0 {
			t.guestError(GuestErrQueue, "queue %d size %d: want a power of two up to %d", q, v, t.dev.QueueSizes()[q])
			return
		}
		r.size = uint16(v)
	case RegQueueDescLow:
		lo(&r.desc)
	case RegQueueDescHigh:
		hi(&r.desc)
	case RegQueueDriverLow:
		lo(&r.avail)
	case RegQueueDriverHigh:
		hi(&r.avail)
	case RegQueueDeviceLow:
		lo(&r.used)
	case RegQueueDeviceHigh:
		hi(&r.used)
	}
}

func (t *MMIO) writeQueueReady(v uint32) {
	if v == 0 {
		// Disabling a queue needs VIRTIO_F_RING_RESET, which we do not
		// offer; before DRIVER_OK it simply undoes the setting.
		if q := t.selected(); q >= 0 && t.status&StatusDriverOK == 0 {
			t.queues[q].ready = false
			return
		}
		t.guestError(GuestErrQueue, "queue %d disabled while the device runs", t.queueSel)
		return
	}
	q, ok := t.queueConfigurable()
	if !ok {
		return
	}
	r := &t.queues[q]
	if r.size == 0 {
		r.size = t.dev.QueueSizes()[q] // QueueNum defaults to QueueNumMax
	}
	cfg := QueueConfig{Size: r.size, Desc: r.desc, Avail: r.avail, Used: r.used}
	if err := cfg.Validate(t.mem, t.dev.QueueSizes()[q]); err != nil {
		t.fail(GuestErrQueue, fmt.Errorf("queue %d: %w", q, err))
		return
	}
	r.ready = true
}

func (t *MMIO) writeStatus(v uint32) {
	if v == 0 {
		t.driverResets.Add(1)
		t.reset()
		return
	}
	// Drivers update status read-modify-write (Linux: get_status() | bit),
	// so DEVICE_NEEDS_RESET, which only the device sets, comes back here;
	// it is not a move the driver makes.
	v &^= StatusNeedsReset
	cur := t.status
	if v&StatusFailed != 0 {
		// The driver gave up (2.1.1); it will reset before trying again.
		t.status |= StatusFailed
		t.log.Warnf("virtio-mmio: driver set FAILED (status %s)", StatusString(v))
		return
	}
	if v == cur {
		return
	}
	step, ok := lookupStep(cur, v)
	if !ok {
		t.fail(GuestErrStatus, fmt.Errorf("%w: illegal status move %s -> %s", ErrGuest, StatusString(cur), StatusString(v)))
		return
	}
	switch step.action {
	case actNegotiate:
		offered := t.dev.Features() | QueueFeatures
		if t.drvFeat&^offered != 0 {
			t.guestError(GuestErrFeatures, "driver accepted features %#x that were not offered", t.drvFeat&^offered)
			return // FEATURES_OK does not stick (3.1.1 step 6)
		}
		if t.drvFeat&FeatureVersion1 == 0 {
			t.guestError(GuestErrFeatures, "driver did not accept VIRTIO_F_VERSION_1 (legacy drivers are not supported)")
			return
		}
	case actActivate:
		if err := t.activate(nil); err != nil {
			t.Fail(err)
			return
		}
	}
	t.status = v
}

// activate hands the ready queues to the device: fresh ones (at nil), or,
// after Quiesce or for RestoreState, each positioned at at[i] (its next
// available entry; the used index is the ring's) and kicked once, since
// the driver may have posted buffers while the previous session had
// notifications suppressed.
func (t *MMIO) activate(at []uint16) error {
	sizes := t.dev.QueueSizes()
	// A Fail that arrives after this activation was reset (from a device
	// goroutine the reset did not wait for) must not flag the next one.
	gen := t.activations.Add(1)
	fail := func(err error) {
		if t.activations.Load() == gen {
			t.Fail(err)
		}
	}
	a := Activation{Mem: t.mem, Features: t.drvFeat, Fail: fail, Queues: make([]*ActiveQueue, len(sizes)), SharedInterrupt: true}
	live := make([]*Queue, len(sizes))
	for i, r := range t.queues {
		if !r.ready {
			continue
		}
		cfg := QueueConfig{Size: r.size, Desc: r.desc, Avail: r.avail, Used: r.used}
		q := NewQueue(t.mem, cfg, t.drvFeat&FeatureEventIdx != 0, t.drvFeat&FeatureIndirectDesc != 0)
		if at != nil {
			if err := q.SetIndices(at[i]); err != nil {
				return fmt.Errorf("queue %d: %w", i, err)
			}
		}
		live[i] = q
		a.Queues[i] = &ActiveQueue{
			Queue:     q,
			Kick:      t.kicks[i],
			Interrupt: func() { t.interrupt(IntUsedBuffer) },
		}
	}
	if err := t.dev.Activate(a); err != nil {
		return fmt.Errorf("activate %s device: %w", deviceName(t.dev.Type()), err)
	}
	t.bindReadyQueues()
	t.active, t.quiesced, t.live = true, false, live
	if at != nil {
		for i, q := range live {
			if q != nil {
				_ = t.kicks[i].Signal()
			}
		}
	}
	t.activated.Add(1)
	t.log.WithField("features", fmt.Sprintf("%#x", t.drvFeat)).Debug("virtio-mmio: device activated")
	return nil
}

// bindReadyQueues binds each queue the activation handed over that has no
// binding yet (BindKicks). Until a binding is in place the queue's kicks
// come through Write, so a kick racing this loses nothing. Called with mu
// held.
func (t *MMIO) bindReadyQueues() {
	if t.bind == nil {
		return
	}
	for i, r := range t.queues {
		if !r.ready || t.bound[i] {
			continue
		}
		if err := t.bind(i, t.kicks[i]); err != nil {
			t.log.WithError(err).Warnf("virtio-mmio: queue %d notifications stay on the MMIO exit path", i)
		}
		t.bound[i] = true // tried once: a failure would fail the same way again
	}
}

// reset returns the transport to its initial state (4.2.3.1), resetting an
// active device first.
func (t *MMIO) reset() {
	if t.active || t.quiesced {
		t.dev.Reset()
		t.active = false
	}
	t.live, t.quiesced = nil, false
	t.activations.Add(1)
	t.status, t.devFeatSel, t.drvFeatSel, t.drvFeat, t.queueSel = 0, 0, 0, 0, 0
	clear(t.queues)
	t.needsReset.Store(false)
	t.irqMu.Lock()
	t.intStatus = 0
	t.irqMu.Unlock()
	for _, k := range t.kicks {
		_, _ = k.Wait() // non-blocking: drops a stale kick
	}
}

func deviceName(id uint32) string {
	switch id {
	case DeviceNet:
		return "net"
	case DeviceBlock:
		return "block"
	case DeviceRNG:
		return "rng"
	case Device9P:
		return "9p"
	case DeviceVsock:
		return "vsock"
	}
	return fmt.Sprintf("type-%d", id)
}
