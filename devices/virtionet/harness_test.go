package virtionet

import (
	"encoding/binary"
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// waitTimeout bounds every wait in these tests.
const waitTimeout = 10 * time.Second

// fakeTAP is the device's end of a SOCK_DGRAM socketpair: like a TAP
// opened with IFF_VNET_HDR, one read is one frame and one write sends one.
// The test holds the other end, the host's side of the TAP.
type fakeTAP struct {
	fd int

	mu      sync.Mutex // guards offload
	offload []uint
}

func (f *fakeTAP) FD() int { return f.fd }

func (f *fakeTAP) VnetHeader() bool { return true }

func (f *fakeTAP) SetOffload(flags uint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.offload = append(f.offload, flags)
	return nil
}

func (f *fakeTAP) Close() error { return unix.Close(f.fd) }

func (f *fakeTAP) lastOffload() uint {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.offload) == 0 {
		return ^uint(0)
	}
	return f.offload[len(f.offload)-1]
}

// env is one device on a fake TAP, driven by a virtiotest guest.
type env struct {
	tb       testing.TB
	dev      *Device
	tap      *fakeTAP
	host     int // the test's end of the socketpair
	features uint64
	mem      *virtiotest.Memory
	rx, tx   *virtiotest.Queue
	rxKick   *eventfd.EventFD
	txKick   *eventfd.EventFD
	irq      chan struct{}
	// rxq and txq are the device's side of the queues of the last
	// activation made by activate (nil behind a transport).
	rxq, txq *virtio.ActiveQueue
	// m is the transport when envOpts.mmio put the device behind one.
	m *virtio.MMIO
	// queueSize is the size of both queues (envOpts.queueSize).
	queueSize uint16
	// backlog holds used entries reaped beyond what a reap call asked for.
	backlog map[*virtiotest.Queue][]virtiotest.Used

	mu    sync.Mutex // guards fails
	fails []error
}

type envOpts struct {
	features  uint64 // device features the driver accepts (queue features are added)
	queueSize uint16 // default 256
	eventIdx  bool
	// tapSndBuf is SO_SNDBUF of the device's end, 0: default. Writes to a
	// socketpair block (EAGAIN) on the sender's buffer alone, not on the
	// peer's queue length.
	tapSndBuf int
	// plain puts the device on its socket back-end (NewSocket): frames
	// without a virtio-net header. e.tap is nil then.
	plain bool
	// mmio puts the device behind a virtio-mmio transport (e.m), which
	// the test drives through its registers (startMMIO).
	mmio bool
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	if os.Getenv("NET_TEST_LOG") == "" {
		l.Out = io.Discard
	} else {
		l.Level = logrus.DebugLevel
	}
	return l
}

func newEnv(tb testing.TB, o envOpts) *env {
	tb.Helper()
	e := newDeviceEnv(tb, o)
	if o.mmio {
		e.mem = virtiotest.NewMemory(tb, 64<<20)
		e.rx = virtiotest.NewQueue(e.mem, e.queueSize, o.eventIdx)
		e.tx = virtiotest.NewQueue(e.mem, e.queueSize, o.eventIdx)
		e.attachMMIO()
		e.startMMIO()
	} else {
		e.activate(e.queueSize)
	}
	return e
}

// newDeviceEnv is newEnv up to the device, which it leaves inactive, with
// no guest memory or queues.
func newDeviceEnv(tb testing.TB, o envOpts) *env {
	tb.Helper()
	base := runtime.NumGoroutine()
	tb.Cleanup(func() { checkGoroutines(tb, base) })
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if o.tapSndBuf > 0 {
		if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, o.tapSndBuf); err != nil {
			tb.Fatal(err)
		}
	}
	e := &env{tb: tb, host: fds[1], irq: make(chan struct{}, 1)}
	tb.Cleanup(func() { unix.Close(e.host) })
	if o.queueSize == 0 {
		o.queueSize = 256
	}
	cfg := Config{QueueSize: o.queueSize, Log: quietLog()}
	var dev *Device
	if o.plain {
		dev, err = NewSocket(cfg, fds[0])
	} else {
		e.tap = &fakeTAP{fd: fds[0]}
		dev, err = newDevice(cfg, e.tap)
	}
	if err != nil {
		tb.Fatal(err)
	}
	e.dev = dev
	tb.Cleanup(func() { dev.Close() })
	e.features = o.features | virtio.FeatureVersion1
	if o.eventIdx {
		e.features |= virtio.FeatureEventIdx
	}
	e.queueSize = o.queueSize
	return e
}

func (e *env) activate(n uint16) {
	tb := e.tb
	tb.Helper()
	e.mu.Lock()
	e.fails = nil
	e.mu.Unlock()
	e.mem = virtiotest.NewMemory(tb, 64<<20)
	ev := e.features&virtio.FeatureEventIdx != 0
	e.rx = virtiotest.NewQueue(e.mem, n, ev)
	e.tx = virtiotest.NewQueue(e.mem, n, ev)
	var err error
	if e.rxKick, err = eventfd.NewNonblocking(); err != nil {
		tb.Fatal(err)
	}
	if e.txKick, err = eventfd.NewNonblocking(); err != nil {
		tb.Fatal(err)
	}
	e.rxq, e.txq = e.activeQueue(e.rx, e.rxKick), e.activeQueue(e.tx, e.txKick)
	e.activateQueues()
	tb.Cleanup(e.reset)
}

// activeQueue is the device's side of the driver's queue q.
func (e *env) activeQueue(q *virtiotest.Queue, kick *eventfd.EventFD) *virtio.ActiveQueue {
	tb := e.tb
	tb.Helper()
	if err := q.Cfg.Validate(e.mem.Memory, q.Cfg.Size); err != nil {
		tb.Fatal(err)
	}
	return &virtio.ActiveQueue{
		Queue:     virtio.NewQueue(e.mem.Memory, q.Cfg, q.EventIdx, false),
		Kick:      kick,
		Interrupt: e.interrupt,
	}
}

// activateQueues activates the device on e.rxq and e.txq.
func (e *env) activateQueues() {
	e.tb.Helper()
	a := virtio.Activation{
		Mem: e.mem.Memory, Features: e.features,
		Queues: []*virtio.ActiveQueue{e.rxq, e.txq},
		Fail:   e.fail,
	}
	if err := e.dev.Activate(a); err != nil {
		e.tb.Fatal(err)
	}
}

// resume activates the device again on the same rings, each queue at the
// position the last activation left it, and kicks both queues once: what
// MMIO.Resume does after MMIO.Quiesce.
func (e *env) resume() {
	tb := e.tb
	tb.Helper()
	rxAt, txAt := e.rxq.LastAvail(), e.txq.LastAvail()
	e.rxq, e.txq = e.activeQueue(e.rx, e.rxKick), e.activeQueue(e.tx, e.txKick)
	if err := e.rxq.SetIndices(rxAt); err != nil {
		tb.Fatal(err)
	}
	if err := e.txq.SetIndices(txAt); err != nil {
		tb.Fatal(err)
	}
	e.activateQueues()
	_ = e.rxKick.Signal()
	_ = e.txKick.Signal()
}

// attachMMIO puts the device behind a new virtio-mmio transport over
// e.mem (as a VMM does, also to restore); the kicks are the transport's
// eventfds, which the test signals as KVM's ioeventfd would. Its
// interrupt wakes reap. Closing it (cleanup) resets the device.
func (e *env) attachMMIO() {
	tb := e.tb
	tb.Helper()
	m, err := virtio.NewMMIO(e.dev, e.mem.Memory, e.interrupt, quietLog())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Error(err)
		}
	})
	e.m = m
	e.rxKick, e.txKick = m.KickFDs()[QueueRX], m.KickFDs()[QueueTX]
}

// reg reads a transport register.
func (e *env) reg(off uint64) uint32 {
	var b [4]byte
	e.m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// setReg writes a transport register.
func (e *env) setReg(off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	e.m.Write(off, b[:])
}

// startMMIO runs the driver's initialisation through the registers, as
// Linux's virtio_mmio does: status bits one at a time, features high word
// first, both queues, DRIVER_OK.
func (e *env) startMMIO() {
	tb := e.tb
	tb.Helper()
	addStatus := func(bits uint32) { e.setReg(virtio.RegStatus, e.reg(virtio.RegStatus)|bits) }
	e.setReg(virtio.RegStatus, 0)
	addStatus(virtio.StatusAcknowledge)
	addStatus(virtio.StatusDriver)
	e.setReg(virtio.RegDriverFeaturesSel, 1)
	e.setReg(virtio.RegDriverFeatures, uint32(e.features>>32))
	e.setReg(virtio.RegDriverFeaturesSel, 0)
	e.setReg(virtio.RegDriverFeatures, uint32(e.features))
	addStatus(virtio.StatusFeaturesOK)
	for i, q := range []*virtiotest.Queue{QueueRX: e.rx, QueueTX: e.tx} {
		c := q.Cfg
		e.setReg(virtio.RegQueueSel, uint32(i))
		e.setReg(virtio.RegQueueNum, uint32(c.Size))
		e.setReg(virtio.RegQueueDescLow, uint32(c.Desc))
		e.setReg(virtio.RegQueueDescHigh, uint32(c.Desc>>32))
		e.setReg(virtio.RegQueueDriverLow, uint32(c.Avail))
		e.setReg(virtio.RegQueueDriverHigh, uint32(c.Avail>>32))
		e.setReg(virtio.RegQueueDeviceLow, uint32(c.Used))
		e.setReg(virtio.RegQueueDeviceHigh, uint32(c.Used>>32))
		e.setReg(virtio.RegQueueReady, 1)
	}
	addStatus(virtio.StatusDriverOK)
	if got := e.reg(virtio.RegStatus); got != 15 {
		tb.Fatalf("status after DRIVER_OK = %s", virtio.StatusString(got))
	}
}

// interrupt is the transport's interrupt line: it wakes reap.
func (e *env) interrupt() {
	select {
	case e.irq <- struct{}{}:
	default:
	}
}

// reset resets the device and closes the kick eventfds after its workers
// have stopped.
func (e *env) reset() {
	e.dev.Reset()
	e.rxKick.Close()
	e.txKick.Close()
}

func (e *env) fail(err error) {
	e.mu.Lock()
	e.fails = append(e.fails, err)
	e.mu.Unlock()
	select {
	case e.irq <- struct{}{}:
	default:
	}
}

func (e *env) failures() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.fails...)
}

// rxBuf is an RX chain the guest posted.
type rxBuf struct {
	addr []uint64
	size []uint32
}

// postRX posts n RX chains, each of the given descriptor sizes, and kicks.
func (e *env) postRX(n int, sizes ...uint32) map[uint16]rxBuf {
	e.tb.Helper()
	out := map[uint16]rxBuf{}
	for i := 0; i < n; i++ {
		var b rxBuf
		var bufs []virtiotest.Buf
		for _, sz := range sizes {
			a := e.mem.Alloc(uint64(sz), 8)
			b.addr = append(b.addr, a)
			b.size = append(b.size, sz)
			bufs = append(bufs, virtiotest.Buf{Addr: a, Len: sz, Writable: true})
		}
		head, ok := e.rx.Add(bufs...)
		if !ok {
			e.tb.Fatalf("postRX: ring full after %d chains", i)
		}
		out[head] = b
	}
	_ = e.rxKick.Signal()
	return out
}

// read returns the first n bytes of an RX chain's buffers.
func (e *env) read(b rxBuf, n uint32) []byte {
	var out []byte
	for i, a := range b.addr {
		k := min(n, b.size[i])
		p := make([]byte, k)
		if err := e.mem.Read(a, p); err != nil {
			e.tb.Fatal(err)
		}
		out = append(out, p...)
		n -= k
	}
	return out
}

// sendTX puts hdr+frame in a TX chain (header and frame in separate
// descriptors, as Linux does) and kicks.
func (e *env) sendTX(hdr []byte, frame []byte) uint16 {
	e.tb.Helper()
	var bufs []virtiotest.Buf
	for _, p := range [][]byte{hdr, frame} {
		if len(p) == 0 {
			continue
		}
		a := e.mem.Alloc(uint64(len(p)), 8)
		if err := e.mem.Write(a, p); err != nil {
			e.tb.Fatal(err)
		}
		bufs = append(bufs, virtiotest.Buf{Addr: a, Len: uint32(len(p))})
	}
	head, ok := e.tx.Add(bufs...)
	if !ok {
		e.tb.Fatal("sendTX: ring full")
	}
	_ = e.txKick.Signal()
	return head
}

// reap waits until q has returned n more used entries and returns
// exactly those, in order; later ones wait for the next call.
func (e *env) reap(q *virtiotest.Queue, n int) []virtiotest.Used {
	e.tb.Helper()
	if e.backlog == nil {
		e.backlog = map[*virtiotest.Queue][]virtiotest.Used{}
	}
	got := e.backlog[q]
	defer func() { e.backlog[q] = got[n:] }()
	deadline := time.Now().Add(waitTimeout)
	for len(got) < n {
		got = append(got, q.Reap()...)
		if len(got) >= n {
			break
		}
		if f := e.failures(); len(f) > 0 {
			e.tb.Fatalf("device failed: %v", f)
		}
		if time.Now().After(deadline) {
			e.tb.Fatalf("%d of %d used entries after %v (stats %+v)", len(got), n, waitTimeout, e.dev.Stats())
		}
		select {
		case <-e.irq:
		case <-time.After(5 * time.Millisecond):
		}
	}
	return got[:n:n]
}

// hostRead reads one frame (header first) from the host end.
func (e *env) hostRead() []byte {
	e.tb.Helper()
	buf := make([]byte, HeaderSize+MaxFrame+1)
	fds := []unix.PollFd{{Fd: int32(e.host), Events: unix.POLLIN}}
	var n int
	var err error
	for deadline := time.Now().Add(waitTimeout); ; {
		// The Go runtime's preemption signal interrupts poll: retry
		// with what is left of the wait.
		n, err = unix.Poll(fds, int(max(time.Until(deadline), 0)/time.Millisecond))
		if err != unix.EINTR {
			break
		}
	}
	if err != nil || n == 0 {
		e.tb.Fatalf("host read: nothing after %v (%v; stats %+v)", waitTimeout, err, e.dev.Stats())
	}
	k, err := unix.Read(e.host, buf)
	if err != nil {
		e.tb.Fatalf("host read: %v", err)
	}
	return buf[:k]
}

// hostWrite sends one frame (header first) to the device.
func (e *env) hostWrite(p []byte) {
	e.tb.Helper()
	if _, err := unix.Write(e.host, p); err != nil {
		e.tb.Fatalf("host write: %v", err)
	}
}

// checkGoroutines fails tb when goroutines started during the test are
// still running shortly after it.
func checkGoroutines(tb testing.TB, base int) {
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			tb.Errorf("%d goroutines left (%d before):\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
