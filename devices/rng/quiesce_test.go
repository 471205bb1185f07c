package rng_test

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// qFill marks the guest's buffers before the device fills them, so a
// buffer the device did not touch is recognisable.
const qFill = 0xa5

// posted is a request chain of one writable buffer the test made
// available.
type posted struct {
	head uint16
	addr uint64
	len  uint32
}

// post makes n one-buffer requests of size bytes available, filled with
// qFill; it does not kick.
func (e *env) post(n int, size uint32) []posted {
	e.t.Helper()
	var out []posted
	for range n {
		a := e.mem.Alloc(uint64(size), 8)
		if err := e.mem.Write(a, bytes.Repeat([]byte{qFill}, int(size))); err != nil {
			e.t.Fatal(err)
		}
		h, ok := e.q.Add(virtiotest.Buf{Addr: a, Len: size, Writable: true})
		if !ok {
			e.t.Fatal("queue full")
		}
		out = append(out, posted{head: h, addr: a, len: size})
	}
	return out
}

// untouched reports whether the device left p's buffer as the driver
// posted it.
func (e *env) untouched(p posted) bool {
	b := make([]byte, p.len)
	if err := e.mem.Read(p.addr, b); err != nil {
		e.t.Fatal(err)
	}
	return bytes.Count(b, []byte{qFill}) == len(b)
}

// checkServed checks that the used entries are exactly the requests ps,
// in ring order (the worker serves in order), each filled whole: a
// random fill of a few hundred bytes that leaves every byte at qFill,
// or fewer than a quarter changed, is not a fill.
func checkServed(t *testing.T, e *env, used []virtiotest.Used, ps []posted) {
	t.Helper()
	if len(used) != len(ps) {
		t.Fatalf("%d requests returned (%v); want %d", len(used), used, len(ps))
	}
	for i, p := range ps {
		if used[i].ID != p.head || used[i].Len != p.len {
			t.Errorf("used entry %d: head %d, %d bytes; want head %d, %d bytes", i, used[i].ID, used[i].Len, p.head, p.len)
		}
		b := make([]byte, p.len)
		if err := e.mem.Read(p.addr, b); err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte{qFill}); n > len(b)/4 {
			t.Errorf("request %d: %d of its %d bytes still hold the driver's fill", i, n, len(b))
		}
	}
}

// checkPositions checks that the stopped session left the queue with
// want chains popped, pushed and published (the used index in guest
// memory).
func checkPositions(t *testing.T, e *env, want uint16) {
	t.Helper()
	used, err := e.mem.Load16Acquire(e.q.Cfg.Used + 2)
	if err != nil {
		t.Fatal(err)
	}
	if la, nu := e.vq.LastAvail(), e.vq.NextUsed(); la != want || nu != want || used != want {
		t.Errorf("queue at %d popped, %d pushed, used index %d in the ring; want %d each", la, nu, used, want)
	}
}

// checkGoroutines fails the test unless, shortly, no more goroutines run
// than base (the count before the device was activated): the worker is
// gone once Quiesce returns, bar its exit.
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

// quiesce runs Quiesce, failing the test if it does not return.
func quiesce(t *testing.T, d interface{ Quiesce() }) {
	t.Helper()
	done := make(chan struct{})
	go func() { d.Quiesce(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatalf("Quiesce did not return in %v", waitTimeout)
	}
}

// TestQuiesceResume quiesces the device while it serves a stream of
// requests: whatever it took by then is back, filled, with the queue's
// positions final and no worker left; the rest is untouched. A session
// started at those positions, as MMIO.Resume starts one, serves the rest
// and what the driver posted while the device was quiesced, without a
// kick.
func TestQuiesceResume(t *testing.T) {
	base := runtime.NumGoroutine()
	// 64 bytes a millisecond: requests are still in the ring at the
	// quiesce, however many the worker took by then.
	e := newEnv(t, rng.Config{Rate: 64 << 10, Burst: 64})
	ps := e.post(32, 64)
	_ = e.kick.Signal()
	used := e.reap(1)
	quiesce(t, e.dev)
	checkGoroutines(t, base)
	k := e.vq.NextUsed()
	checkPositions(t, e, k)
	// Published already: no waiting for the rest of the used entries.
	checkServed(t, e, append(used, e.q.Reap()...), ps[:k])
	for i, p := range ps[k:] {
		if !e.untouched(p) {
			t.Errorf("request %d, not returned, was written", int(k)+i)
		}
	}

	ps = append(ps[k:], e.post(3, 64)...)
	e.activate(e.vq) // no kick: the new session must look at the ring
	checkServed(t, e, e.reap(len(ps)), ps)
	quiesce(t, e.dev)
	checkPositions(t, e, 32+3)
	checkGoroutines(t, base)
	if f := e.failures(); len(f) != 0 {
		t.Errorf("the device failed: %v", f)
	}
	if st := e.dev.Stats(); st.Requests != 32+3 {
		t.Errorf("%d requests served; want %d", st.Requests, 32+3)
	}
}

// TestQuiesceWhileThrottled quiesces the worker while it waits for the
// rate limit: the chain it waits for goes back to the ring untouched, so
// the positions are final at once rather than when the tokens come. A
// resumed session starts with a full bucket (the bucket is the session's)
// and serves that chain.
func TestQuiesceWhileThrottled(t *testing.T) {
	base := runtime.NumGoroutine()
	// One byte a second: after the first 64-byte burst each request waits
	// a minute, far longer than the test.
	e := newEnv(t, rng.Config{Rate: 1, Burst: 64})
	ps := e.post(3, 64)
	_ = e.kick.Signal()
	checkServed(t, e, e.reap(1), ps[:1])
	waitThrottled(t, e, 1)
	quiesce(t, e.dev)
	checkGoroutines(t, base)
	checkPositions(t, e, 1)
	for i, p := range ps[1:] {
		if !e.untouched(p) {
			t.Errorf("request %d, waiting for tokens, was written", i+1)
		}
	}

	e.activate(e.vq)
	checkServed(t, e, e.reap(1), ps[1:2])
	waitThrottled(t, e, 2)
	quiesce(t, e.dev)
	checkPositions(t, e, 2)
	if !e.untouched(ps[2]) {
		t.Error("request 2, waiting for tokens, was written")
	}
	checkGoroutines(t, base)
}

// waitThrottled waits until the worker has waited for tokens n times in
// all (Stats.Throttled): it has put the chain back and sleeps.
func waitThrottled(t *testing.T, e *env, n uint64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for e.dev.Stats().Throttled < n {
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not wait for the rate limit (Throttled %d; want %d)", e.dev.Stats().Throttled, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// mmioDriver plays a guest driver on a virtio-mmio transport through its
// registers.
type mmioDriver struct{ m *virtio.MMIO }

func (d mmioDriver) r(off uint64) uint32 {
	var b [4]byte
	d.m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (d mmioDriver) w(off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	d.m.Write(off, b[:])
}

// start runs the driver's initialisation (virtio 1.2, 3.1.1) with
// features f and queue 0 at cfg, up to DRIVER_OK.
func (d mmioDriver) start(t *testing.T, f uint64, cfg virtio.QueueConfig) {
	t.Helper()
	add := func(bits uint32) { d.w(virtio.RegStatus, d.r(virtio.RegStatus)|bits) }
	d.w(virtio.RegStatus, 0)
	add(virtio.StatusAcknowledge)
	add(virtio.StatusDriver)
	d.w(virtio.RegDriverFeaturesSel, 1)
	d.w(virtio.RegDriverFeatures, uint32(f>>32))
	d.w(virtio.RegDriverFeaturesSel, 0)
	d.w(virtio.RegDriverFeatures, uint32(f))
	add(virtio.StatusFeaturesOK)
	d.w(virtio.RegQueueSel, 0)
	d.w(virtio.RegQueueNum, uint32(cfg.Size))
	d.w(virtio.RegQueueDescLow, uint32(cfg.Desc))
	d.w(virtio.RegQueueDescHigh, uint32(cfg.Desc>>32))
	d.w(virtio.RegQueueDriverLow, uint32(cfg.Avail))
	d.w(virtio.RegQueueDriverHigh, uint32(cfg.Avail>>32))
	d.w(virtio.RegQueueDeviceLow, uint32(cfg.Used))
	d.w(virtio.RegQueueDeviceHigh, uint32(cfg.Used>>32))
	d.w(virtio.RegQueueReady, 1)
	add(virtio.StatusDriverOK)
	if got := d.r(virtio.RegStatus); got != virtio.StatusAcknowledge|virtio.StatusDriver|virtio.StatusFeaturesOK|virtio.StatusDriverOK {
		t.Fatalf("status after DRIVER_OK: %s", virtio.StatusString(got))
	}
}

// newTransport puts a new rng device behind a new virtio-mmio transport
// over e's guest memory, interrupting into e.irq; both are closed when the
// test ends.
func newTransport(t *testing.T, e *env) (*rng.Device, mmioDriver) {
	t.Helper()
	dev, err := rng.New(rng.Config{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dev.Close)
	m, err := virtio.NewMMIO(dev, e.mem.Memory, func() {
		select {
		case e.irq <- struct{}{}:
		default:
		}
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the device's Close: it resets the device
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return dev, mmioDriver{m}
}

// saved saves the quiesced transport's state, which must succeed (the
// device drained its queue), and returns it with queue 0's positions.
func saved(t *testing.T, d mmioDriver) (s virtio.MMIOState, next, used uint16) {
	t.Helper()
	s, err := d.m.SaveState()
	if err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	if s.Status&virtio.StatusNeedsReset != 0 {
		t.Fatalf("the device failed: status %s", virtio.StatusString(s.Status))
	}
	return s, s.Queues[0].NextAvail, s.Queues[0].UsedIdx
}

// TestQuiesceThroughMMIO runs the pause as the VMM does: MMIO.Quiesce,
// SaveState (which refuses a queue with chains popped and not returned, or
// a used index not in guest memory), MMIO.Resume, and then a restore of
// the saved state into a new transport and device over the same memory;
// each session serves what the driver posted while none ran.
func TestQuiesceThroughMMIO(t *testing.T) {
	base := runtime.NumGoroutine()
	e := &env{t: t, mem: virtiotest.NewMemory(t, 4<<20), irq: make(chan struct{}, 1)}
	e.q = virtiotest.NewQueue(e.mem, rng.DefaultQueueSize, true)
	dev, d := newTransport(t, e)
	d.start(t, dev.Features()|virtio.QueueFeatures, e.q.Cfg)
	ps := e.post(4, 512)
	d.w(virtio.RegQueueNotify, 0)
	checkServed(t, e, e.reap(len(ps)), ps)
	if err := d.m.Quiesce(); err != nil {
		t.Fatalf("MMIO.Quiesce: %v", err)
	}
	checkGoroutines(t, base)
	if _, next, used := saved(t, d); next != 4 || used != 4 {
		t.Errorf("saved positions %d/%d; want 4/4", next, used)
	}

	ps = e.post(2, 512) // the device is paused: no notify
	if err := d.m.Resume(); err != nil {
		t.Fatalf("MMIO.Resume: %v", err)
	}
	checkServed(t, e, e.reap(len(ps)), ps)
	if err := d.m.Quiesce(); err != nil {
		t.Fatalf("second MMIO.Quiesce: %v", err)
	}
	s, next, used := saved(t, d)
	if next != 6 || used != 6 {
		t.Errorf("saved positions %d/%d after the resumed session; want 6/6", next, used)
	}

	ps = e.post(2, 512)
	_, d2 := newTransport(t, e)
	if err := d2.m.RestoreState(s); err != nil {
		t.Fatalf("RestoreState: %v", err)
	}
	checkServed(t, e, e.reap(len(ps)), ps)
	if err := d2.m.Quiesce(); err != nil {
		t.Fatalf("MMIO.Quiesce of the restored device: %v", err)
	}
	if _, next, used := saved(t, d2); next != 8 || used != 8 {
		t.Errorf("saved positions %d/%d after the restored session; want 8/8", next, used)
	}
	checkGoroutines(t, base)
}
