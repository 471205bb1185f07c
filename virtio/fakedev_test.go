package virtio_test

import (
	"encoding/binary"
	"io"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// fakeDevice is a scriptable virtio device that records what the transport
// asks of it.
type fakeDevice struct {
	typ         uint32
	features    uint64
	sizes       []uint16
	activateErr error
	// onActivate and onReset, when set, run inside Activate and Reset
	// (with the transport's lock held, as in real use).
	onActivate func(a virtio.Activation)
	onReset    func()

	mu          sync.Mutex
	config      []byte
	activations []virtio.Activation
	resets      int
	quiesces    int
	live        int // successful activations since the last Reset
	cfgReads    []cfgAccess
	cfgWrites   []cfgAccess
}

type cfgAccess struct {
	Off  uint64
	Data []byte // for reads, only the length matters
}

func (d *fakeDevice) Type() uint32         { return d.typ }
func (d *fakeDevice) Features() uint64     { return d.features }
func (d *fakeDevice) QueueSizes() []uint16 { return d.sizes }

func (d *fakeDevice) ReadConfig(off uint64, p []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfgReads = append(d.cfgReads, cfgAccess{off, make([]byte, len(p))})
	clear(p)
	if off < uint64(len(d.config)) {
		copy(p, d.config[off:])
	}
}

func (d *fakeDevice) WriteConfig(off uint64, p []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfgWrites = append(d.cfgWrites, cfgAccess{off, append([]byte(nil), p...)})
	if off < uint64(len(d.config)) {
		copy(d.config[off:], p)
	}
}

func (d *fakeDevice) Activate(a virtio.Activation) error {
	if d.activateErr != nil {
		return d.activateErr
	}
	d.mu.Lock()
	d.activations = append(d.activations, a)
	d.live++
	d.mu.Unlock()
	if d.onActivate != nil {
		d.onActivate(a)
	}
	return nil
}

func (d *fakeDevice) Reset() {
	if d.onReset != nil {
		d.onReset()
	}
	d.mu.Lock()
	d.resets++
	d.live = 0
	d.mu.Unlock()
}

// Quiesce implements virtio.Quiescer: the fake has no workers (tests
// pop and push on its activations' queues themselves), so it only records
// the call and that no session runs.
func (d *fakeDevice) Quiesce() {
	d.mu.Lock()
	d.quiesces++
	d.live = 0
	d.mu.Unlock()
}

// counts returns activations, resets and live activations.
func (d *fakeDevice) counts() (acts, resets, live int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.activations), d.resets, d.live
}

func (d *fakeDevice) lastActivation(tb testing.TB) virtio.Activation {
	tb.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.activations) == 0 {
		tb.Fatal("the device was never activated")
	}
	return d.activations[len(d.activations)-1]
}

func newFakeDevice() *fakeDevice {
	return &fakeDevice{
		typ:      virtio.DeviceVsock,
		features: 1<<0 | 1<<5,
		sizes:    []uint16{256, 128, 64},
		config:   []byte{1, 2, 3, 4, 5, 6, 7, 8},
	}
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// menv is a virtio-mmio transport over a fake device, driven through its
// registers as a guest driver would.
type menv struct {
	mem    *virtiotest.Memory
	dev    *fakeDevice
	m      *virtio.MMIO
	raised atomic.Int64
}

func newMEnv(tb testing.TB, dev *fakeDevice) *menv {
	tb.Helper()
	e := &menv{mem: virtiotest.NewMemory(tb, 1<<20), dev: dev}
	e.m = newMMIO(tb, dev, e.mem.Memory, func() { e.raised.Add(1) })
	return e
}

func newMMIO(tb testing.TB, dev virtio.Device, mem *guestmem.Memory, raise func()) *virtio.MMIO {
	tb.Helper()
	m, err := virtio.NewMMIO(dev, mem, raise, quietLog())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Error(err)
		}
	})
	return m
}

func (e *menv) r(off uint64) uint32 {
	var b [4]byte
	e.m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (e *menv) w(off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	e.m.Write(off, b[:])
}

// addStatus does what Linux's virtio_add_status does: read, or in, write.
func (e *menv) addStatus(bits uint32) { e.w(virtio.RegStatus, e.r(virtio.RegStatus)|bits) }

// writeFeatures writes the driver's features, high word first as Linux does.
func (e *menv) writeFeatures(f uint64) {
	e.w(virtio.RegDriverFeaturesSel, 1)
	e.w(virtio.RegDriverFeatures, uint32(f>>32))
	e.w(virtio.RegDriverFeaturesSel, 0)
	e.w(virtio.RegDriverFeatures, uint32(f))
}

// negotiate resets the device and runs the init sequence up to
// FEATURES_OK, and reports whether FEATURES_OK stuck.
func (e *menv) negotiate(f uint64) bool {
	e.w(virtio.RegStatus, 0)
	e.addStatus(virtio.StatusAcknowledge)
	e.addStatus(virtio.StatusDriver)
	e.writeFeatures(f)
	e.addStatus(virtio.StatusFeaturesOK)
	return e.r(virtio.RegStatus)&virtio.StatusFeaturesOK != 0
}

// setupQueue programs queue i with cfg and sets it ready.
func (e *menv) setupQueue(i uint32, cfg virtio.QueueConfig) {
	e.w(virtio.RegQueueSel, i)
	e.w(virtio.RegQueueNum, uint32(cfg.Size))
	e.w(virtio.RegQueueDescLow, uint32(cfg.Desc))
	e.w(virtio.RegQueueDescHigh, uint32(cfg.Desc>>32))
	e.w(virtio.RegQueueDriverLow, uint32(cfg.Avail))
	e.w(virtio.RegQueueDriverHigh, uint32(cfg.Avail>>32))
	e.w(virtio.RegQueueDeviceLow, uint32(cfg.Used))
	e.w(virtio.RegQueueDeviceHigh, uint32(cfg.Used>>32))
	e.w(virtio.RegQueueReady, 1)
}

// driverQueues allocates a driver-side queue for each size; size 0 leaves
// that queue unset.
func (e *menv) driverQueues(eventIdx bool, sizes ...uint16) []*virtiotest.Queue {
	qs := make([]*virtiotest.Queue, len(sizes))
	for i, s := range sizes {
		if s != 0 {
			qs[i] = virtiotest.NewQueue(e.mem, s, eventIdx)
		}
	}
	return qs
}

// start negotiates f, sets up the non-nil queues and sets DRIVER_OK.
func (e *menv) start(tb testing.TB, f uint64, qs []*virtiotest.Queue) virtio.Activation {
	tb.Helper()
	if !e.negotiate(f) {
		tb.Fatalf("FEATURES_OK did not stick for %#x", f)
	}
	for i, q := range qs {
		if q != nil {
			e.setupQueue(uint32(i), q.Cfg)
		}
	}
	e.addStatus(virtio.StatusDriverOK)
	if got := e.r(virtio.RegStatus); got != 15 {
		tb.Fatalf("status after DRIVER_OK = %s", virtio.StatusString(got))
	}
	return e.dev.lastActivation(tb)
}
