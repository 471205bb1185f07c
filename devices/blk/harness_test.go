package blk_test

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

const waitTimeout = 10 * time.Second

// Request types and statuses as a driver writes and reads them.
const (
	tIn, tOut, tFlush, tGetID, tDiscard, tWriteZeroes = 0, 1, 4, 8, 11, 13
	sOK, sIOErr, sUnsupp                              = 0, 1, 2
	noStatus                                          = 0xff // what the status byte holds until the device answers
)

// env is one block device over a temporary image, activated on a
// virtiotest driver queue.
type env struct {
	t    *testing.T
	path string
	dev  *blk.Device
	mem  *virtiotest.Memory
	q    *virtiotest.Queue
	kick *eventfd.EventFD
	irq  chan struct{}
	// vq is the device side of the queue the last activate handed over:
	// the test may read its positions only while no session runs.
	vq *virtio.Queue

	mu    sync.Mutex
	fails []error
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.Out = io.Discard
	if os.Getenv("BLK_TEST_LOG") != "" {
		l.Out = os.Stderr
		l.Level = logrus.DebugLevel
	}
	return l
}

// image writes a size-byte image whose every byte is a function of its
// offset, and returns its path.
func image(t *testing.T, size int) string {
	t.Helper()
	b := make([]byte, size)
	for i := range b {
		b[i] = pattern(i)
	}
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func pattern(off int) byte { return byte(off*7 + off>>9) }

// newEnv opens a block device over a temporary image (a 1 MiB one unless
// cfg.Path names one) and activates it on a virtiotest driver queue, with
// all the features it offers accepted.
func newEnv(t *testing.T, cfg blk.Config) *env {
	t.Helper()
	kick, err := eventfd.NewNonblocking()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kick.Close() }) // after the device's Close, below
	e := openEnv(t, cfg)
	e.kick = kick
	e.activate(nil)
	return e
}

// openEnv opens the device and lays out the driver's queue, without
// activating anything; the device is closed when the test ends.
func openEnv(t *testing.T, cfg blk.Config) *env {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = image(t, 1<<20)
	}
	cfg.Log = quietLog()
	dev, err := blk.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Error(err)
		}
	})
	e := &env{t: t, path: cfg.Path, dev: dev, mem: virtiotest.NewMemory(t, 8<<20), irq: make(chan struct{}, 1)}
	e.q = virtiotest.NewQueue(e.mem, dev.QueueSizes()[0], true)
	return e
}

// activate starts a session on the driver's queue: a fresh one when prev
// is nil, else one that takes over where the session that used prev
// stopped, as MMIO.Resume positions it (Queue.SetIndices at its
// LastAvail). It does not kick.
func (e *env) activate(prev *virtio.Queue) {
	e.t.Helper()
	vq := virtio.NewQueue(e.mem.Memory, e.q.Cfg, true, true)
	if prev != nil {
		if err := vq.SetIndices(prev.LastAvail()); err != nil {
			e.t.Fatal(err)
		}
	}
	aq := &virtio.ActiveQueue{
		Queue: vq,
		Kick:  e.kick,
		Interrupt: func() {
			select {
			case e.irq <- struct{}{}:
			default:
			}
		},
	}
	err := e.dev.Activate(virtio.Activation{Mem: e.mem.Memory, Features: e.dev.Features() | virtio.QueueFeatures,
		Queues: []*virtio.ActiveQueue{aq}, Fail: func(err error) {
			e.mu.Lock()
			e.fails = append(e.fails, err)
			e.mu.Unlock()
		}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.vq = vq
}

func (e *env) failures() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.fails...)
}

// req is one request as the driver laid it out.
type req struct {
	head   uint16
	data   uint64 // guest address of the data buffer (0: none)
	status uint64 // guest address of the status byte
}

func header(typ uint32, sector uint64) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint32(b[0:], typ)
	binary.LittleEndian.PutUint64(b[8:], sector)
	return b
}

// put copies p into fresh guest memory and returns its address.
func (e *env) put(p []byte) uint64 {
	a := e.mem.Alloc(uint64(max(len(p), 1)), 8)
	if err := e.mem.Write(a, p); err != nil {
		e.t.Fatal(err)
	}
	return a
}

// submit makes a request available: header, then data (writable for reads
// when data is nil and n > 0), then the status byte; it does not kick.
func (e *env) submit(typ uint32, sector uint64, data []byte, readLen int) req {
	e.t.Helper()
	r := req{status: e.put([]byte{noStatus})}
	bufs := []virtiotest.Buf{{Addr: e.put(header(typ, sector)), Len: 16}}
	switch {
	case data != nil:
		r.data = e.put(data)
		bufs = append(bufs, virtiotest.Buf{Addr: r.data, Len: uint32(len(data))})
	case readLen > 0:
		r.data = e.mem.Alloc(uint64(readLen), 8)
		bufs = append(bufs, virtiotest.Buf{Addr: r.data, Len: uint32(readLen), Writable: true})
	}
	bufs = append(bufs, virtiotest.Buf{Addr: r.status, Len: 1, Writable: true})
	h, ok := e.q.Add(bufs...)
	if !ok {
		e.t.Fatal("queue full")
	}
	r.head = h
	return r
}

// do submits one request, kicks, waits for it and returns its status and
// used length.
func (e *env) do(typ uint32, sector uint64, data []byte, readLen int) (req, byte, uint32) {
	e.t.Helper()
	r := e.submit(typ, sector, data, readLen)
	_ = e.kick.Signal()
	u := e.reap(1)[0]
	if u.ID != r.head {
		e.t.Fatalf("used id %d; want %d", u.ID, r.head)
	}
	return r, e.statusOf(r), u.Len
}

func (e *env) statusOf(r req) byte {
	var b [1]byte
	if err := e.mem.Read(r.status, b[:]); err != nil {
		e.t.Fatal(err)
	}
	return b[0]
}

// reap waits for n used entries.
func (e *env) reap(n int) []virtiotest.Used {
	e.t.Helper()
	var got []virtiotest.Used
	deadline := time.After(waitTimeout)
	for {
		got = append(got, e.q.Reap()...)
		if len(got) >= n {
			return got
		}
		select {
		case <-e.irq:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			e.t.Fatalf("%d of %d used entries after %v (failures: %v)", len(got), n, waitTimeout, e.failures())
		}
	}
}

// waitFail waits for the device to report a guest error.
func (e *env) waitFail() error {
	e.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		if f := e.failures(); len(f) > 0 {
			return f[0]
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the device reported no guest error")
		}
		time.Sleep(time.Millisecond)
	}
}

func (e *env) read(addr uint64, n int) []byte {
	b := make([]byte, n)
	if err := e.mem.Read(addr, b); err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) file() []byte {
	b, err := os.ReadFile(e.path)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// checkGoroutines fails the test unless, shortly, no more goroutines run
// than base (the count before the device was activated): a session's
// goroutines are gone once Quiesce or Reset returns, bar their exit.
func checkGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines run, %d before the device started:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}
