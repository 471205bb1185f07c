package rng_test

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

const waitTimeout = 10 * time.Second

// env is one rng device activated on a virtiotest driver queue.
type env struct {
	t    *testing.T
	dev  *rng.Device
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
	return l
}

func newEnv(t *testing.T, cfg rng.Config) *env {
	t.Helper()
	cfg.Log = quietLog()
	dev, err := rng.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dev: dev, mem: virtiotest.NewMemory(t, 4<<20), irq: make(chan struct{}, 1)}
	e.q = virtiotest.NewQueue(e.mem, dev.QueueSizes()[0], true)
	if e.kick, err = eventfd.NewNonblocking(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close(); e.kick.Close() })
	e.activate(nil)
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
	err := e.dev.Activate(virtio.Activation{Mem: e.mem.Memory, Features: virtio.QueueFeatures,
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

// reap waits for n used entries.
func (e *env) reap(n int) []virtiotest.Used {
	e.t.Helper()
	var got []virtiotest.Used
	deadline := time.After(waitTimeout)
	for len(got) < n {
		got = append(got, e.q.Reap()...)
		if len(got) >= n {
			break
		}
		select {
		case <-e.irq:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			e.t.Fatalf("%d of %d used entries after %v (failures: %v)", len(got), n, waitTimeout, e.failures())
		}
	}
	return got
}

func TestFillsBuffers(t *testing.T) {
	e := newEnv(t, rng.Config{})
	sizes := []uint32{1, 16, 4096, 100000} // the last is over MaxRequest
	addrs := make([]uint64, len(sizes))
	heads := map[uint16]int{}
	for i, n := range sizes {
		addrs[i] = e.mem.Alloc(uint64(n), 8)
		h, ok := e.q.Add(virtiotest.Buf{Addr: addrs[i], Len: n, Writable: true})
		if !ok {
			t.Fatal("queue full")
		}
		heads[h] = i
	}
	// A chain of two writable buffers is filled across both.
	a1, a2 := e.mem.Alloc(64, 8), e.mem.Alloc(64, 8)
	h, _ := e.q.Add(virtiotest.Buf{Addr: a1, Len: 64, Writable: true}, virtiotest.Buf{Addr: a2, Len: 64, Writable: true})
	heads[h] = -1
	_ = e.kick.Signal()
	for _, u := range e.reap(len(sizes) + 1) {
		i := heads[u.ID]
		if i < 0 {
			if u.Len != 128 {
				t.Errorf("two-buffer chain: used length %d; want 128", u.Len)
			}
			continue
		}
		want := min(sizes[i], rng.MaxRequest)
		if u.Len != want {
			t.Errorf("buffer of %d: used length %d; want %d", sizes[i], u.Len, want)
		}
		if u.Len >= 16 {
			buf := make([]byte, u.Len)
			if err := e.mem.Read(addrs[i], buf); err != nil {
				t.Fatal(err)
			}
			if bytes.Count(buf, []byte{0}) > len(buf)/8+4 {
				t.Errorf("buffer of %d is mostly zeros after the fill", u.Len)
			}
		}
	}
	st := e.dev.Stats()
	if st.Requests != uint64(len(sizes)+1) || st.GuestErrors != 0 {
		t.Errorf("stats %+v; want %d requests and no guest errors", st, len(sizes)+1)
	}
	if f := e.failures(); len(f) != 0 {
		t.Errorf("device failed: %v", f)
	}
}

func TestRateLimit(t *testing.T) {
	const rate, burst = 32 << 10, 1 << 10
	e := newEnv(t, rng.Config{Rate: rate, Burst: burst})
	const total = 16 << 10
	start := time.Now()
	var got uint64
	a := e.mem.Alloc(4096, 8)
	for got < total {
		if _, ok := e.q.Add(virtiotest.Buf{Addr: a, Len: 4096, Writable: true}); !ok {
			t.Fatal("queue full")
		}
		_ = e.kick.Signal()
		for _, u := range e.reap(1) {
			if u.Len != burst {
				t.Fatalf("used length %d; want the %d-byte burst", u.Len, burst)
			}
			got += uint64(u.Len)
		}
	}
	el := time.Since(start)
	// The bucket starts full: (total-burst) bytes must accrue at rate.
	if min := time.Duration(float64(total-burst) / rate * float64(time.Second)); el < min*9/10 {
		t.Errorf("%d bytes in %v; the rate limit allows no fewer than %v", got, el, min)
	}
	if e.dev.Stats().Throttled == 0 {
		t.Error("Throttled = 0 after running into the rate limit")
	}
}

func TestResetWhileThrottled(t *testing.T) {
	e := newEnv(t, rng.Config{Rate: 64, Burst: 64})
	for range 2 {
		a := e.mem.Alloc(64, 8)
		e.q.Add(virtiotest.Buf{Addr: a, Len: 64, Writable: true})
	}
	_ = e.kick.Signal()
	e.reap(1)
	done := make(chan struct{})
	go func() { e.dev.Reset(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("Reset did not return while the worker waited for tokens")
	}
}

func TestMalformedChains(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind virtio.GuestErrorKind
		add  func(e *env)
	}{
		{"readable buffer", virtio.GuestErrLayout, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.mem.Alloc(16, 8), Len: 16})
		}},
		{"readable then writable", virtio.GuestErrLayout, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.mem.Alloc(16, 8), Len: 16}, virtiotest.Buf{Addr: e.mem.Alloc(16, 8), Len: 16, Writable: true})
		}},
		{"zero-length writable", virtio.GuestErrLayout, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.mem.Alloc(16, 8), Len: 0, Writable: true})
		}},
		{"buffer outside memory", virtio.GuestErrQueue, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: 1 << 40, Len: 16, Writable: true})
		}},
		{"head out of range", virtio.GuestErrQueue, func(e *env) { e.q.PublishHead(1000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, rng.Config{})
			tc.add(e)
			_ = e.kick.Signal()
			deadline := time.Now().Add(waitTimeout)
			for len(e.failures()) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no Fail for a malformed chain")
				}
				time.Sleep(time.Millisecond)
			}
			if f := e.failures(); !errors.Is(f[0], virtio.ErrGuest) {
				t.Errorf("Fail(%v); want an ErrGuest", f[0])
			}
			if u := e.q.Reap(); len(u) != 0 {
				t.Errorf("the device returned %v for a malformed chain", u)
			}
			var want virtio.GuestErrorCounts
			want[tc.kind] = 1
			if st := e.dev.Stats(); st.GuestErrors != 1 || st.GuestErrorsByKind != want {
				t.Errorf("GuestErrors = %d, by kind %v; want 1, %v (%v)", st.GuestErrors, st.GuestErrorsByKind, want, tc.kind)
			}
			// A second kick after the failure is ignored, not a second
			// report.
			_ = e.kick.Signal()
			time.Sleep(20 * time.Millisecond)
			if n := len(e.failures()); n != 1 {
				t.Errorf("%d failures reported; want 1", n)
			}
		})
	}
}

func TestConfigBounds(t *testing.T) {
	for _, cfg := range []rng.Config{{Rate: rng.MaxRate + 1}, {Rate: 1, Burst: rng.MaxRate + 1}, {QueueSize: 3}} {
		if _, err := rng.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	d, err := rng.New(rng.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Type() != virtio.DeviceRNG || d.Features() != 0 {
		t.Errorf("type %d features %#x; want %d and 0", d.Type(), d.Features(), virtio.DeviceRNG)
	}
	if err := d.Activate(virtio.Activation{Queues: []*virtio.ActiveQueue{nil}}); !errors.Is(err, virtio.ErrGuest) {
		t.Errorf("Activate without a queue: %v; want ErrGuest", err)
	}
}
