package blk_test

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// ioGate holds the device's requests before their I/O until it is opened:
// a disk as slow as the test needs, so that requests are in flight, known
// ones, when it quiesces or resets the device.
type ioGate struct {
	entered chan uint64 // the sector of each request that reached the gate
	release chan struct{}
	once    sync.Once
}

// holdIO installs a gate on every worker. Call it after the device is set
// up (newEnv, newMMIOEnv): the test's end then opens the gate before it
// closes the device, whose Close waits for the workers.
func holdIO(t *testing.T) *ioGate {
	// entered has room for more requests than any test sends, so a worker
	// never blocks on it once the gate is open.
	g := &ioGate{entered: make(chan uint64, 1024), release: make(chan struct{})}
	blk.SetTestHookIO(t, func(sector uint64) {
		g.entered <- sector
		<-g.release
	})
	t.Cleanup(g.open)
	return g
}

func (g *ioGate) open() { g.once.Do(func() { close(g.release) }) }

// wait waits until n more requests are held at the gate.
func (g *ioGate) wait(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-g.entered:
		case <-time.After(waitTimeout):
			t.Fatalf("%d of %d requests reached the device's I/O after %v", i, n, waitTimeout)
		}
	}
}

// within waits for ch to be closed or to yield, failing the test after
// waitTimeout.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("%s: not after %v", what, waitTimeout)
		panic("unreachable")
	}
}

// stopHeld stops the device's session with stop (in a goroutine: it waits
// for the held I/O) and opens the gate once the session has begun to stop,
// so that the requests held are exactly the ones in flight at the stop.
// It returns once stop has.
func stopHeld[T any](t *testing.T, dev *blk.Device, g *ioGate, stop func() T) T {
	t.Helper()
	stopping := blk.Stopping(dev)
	if stopping == nil {
		t.Fatal("no session runs")
	}
	done := make(chan T, 1)
	go func() { done <- stop() }()
	within(t, stopping, "the session to begin stopping")
	select {
	case <-done:
		t.Fatal("the session stopped while its requests' I/O was held")
	default:
	}
	g.open()
	return within(t, done, "the stop to return once the I/O was let through")
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

// checkDone checks that the used entries are exactly the requests reqs,
// each with status OK and used length wantLen[i].
func checkDone(t *testing.T, e *env, used []virtiotest.Used, reqs []req, wantLen []uint32) {
	t.Helper()
	got := map[uint16]uint32{}
	for _, u := range used {
		if _, dup := got[u.ID]; dup {
			t.Errorf("head %d returned twice", u.ID)
		}
		got[u.ID] = u.Len
	}
	if len(got) != len(reqs) {
		t.Errorf("%d requests returned (%v); want %d", len(got), used, len(reqs))
	}
	for i, r := range reqs {
		n, ok := got[r.head]
		switch {
		case !ok:
			t.Errorf("request %d (head %d) not returned", i, r.head)
		case n != wantLen[i]:
			t.Errorf("request %d: used length %d; want %d", i, n, wantLen[i])
		}
		if st := e.statusOf(r); st != sOK {
			t.Errorf("request %d: status %d; want OK", i, st)
		}
	}
}

// checkRead checks that the read r of n bytes at sector got the image's
// bytes.
func checkRead(t *testing.T, e *env, r req, sector uint64, n int) {
	t.Helper()
	off := int(sector) * blk.SectorSize
	if !bytes.Equal(e.read(r.data, n), e.file()[off:off+n]) {
		t.Errorf("the read of sector %d did not return the image's bytes", sector)
	}
}

// TestQuiesceFinishesInFlight: with every worker holding a request (two
// reads, a write, a flush) and more requests in the ring, Quiesce waits
// for the held I/O, returns each of those requests with its status and
// data, takes no other, and leaves the queue's positions final with no
// goroutine of the device running. A session started at those positions,
// as MMIO.Resume starts one, serves the rest and a request posted while
// the device was quiesced, without a kick.
func TestQuiesceFinishesInFlight(t *testing.T) {
	base := runtime.NumGoroutine()
	e := newEnv(t, blk.Config{InFlight: 4})
	g := holdIO(t)
	data := bytes.Repeat([]byte("quiesced"), 1024/8)
	held := []req{
		e.submit(tIn, 10, nil, 2048),
		e.submit(tOut, 40, data, 0),
		e.submit(tIn, 60, nil, 1024),
		e.submit(tFlush, 0, nil, 0),
	}
	var waiting []req
	for i := range 3 {
		waiting = append(waiting, e.submit(tIn, uint64(100+8*i), nil, 1024))
	}
	_ = e.kick.Signal()
	g.wait(t, len(held)) // every slot is taken: the dispatcher pops no more
	stopHeld(t, e.dev, g, func() struct{} { e.dev.Quiesce(); return struct{}{} })
	checkGoroutines(t, base)

	// Everything is published by now: no waiting for the used entries.
	checkDone(t, e, e.q.Reap(), held, []uint32{2048 + 1, 1, 1024 + 1, 1})
	checkPositions(t, e, uint16(len(held)))
	checkRead(t, e, held[0], 10, 2048)
	checkRead(t, e, held[2], 60, 1024)
	if !bytes.Equal(e.file()[40*blk.SectorSize:40*blk.SectorSize+len(data)], data) {
		t.Error("the write held at the quiesce is not in the image")
	}
	for i, r := range waiting {
		if st := e.statusOf(r); st != noStatus {
			t.Errorf("request %d, left in the ring, has status %d", i, st)
		}
	}
	if f := e.failures(); len(f) != 0 {
		t.Fatalf("the device failed: %v", f)
	}

	later := e.submit(tIn, 200, nil, 512)
	e.activate(e.vq) // no kick: the new session must look at the ring
	rest := append(waiting, later)
	checkDone(t, e, e.reap(len(rest)), rest, []uint32{1025, 1025, 1025, 513})
	for i, r := range waiting {
		checkRead(t, e, r, uint64(100+8*i), 1024)
	}
	checkRead(t, e, later, 200, 512)
	e.dev.Quiesce()
	checkPositions(t, e, uint16(len(held)+len(rest)))
	checkGoroutines(t, base)
	if s := e.dev.Stats(); s.Reads != 6 || s.Writes != 1 || s.Flushes != 1 || s.GuestErrors != 0 {
		t.Errorf("stats %+v; want 6 reads, a write and a flush", s)
	}
}

// TestResetAbandonsInFlight is the contrast: a driver reset also finishes
// the held I/O (the write reaches the image) but returns nothing, since
// the driver is tearing its rings down.
func TestResetAbandonsInFlight(t *testing.T) {
	base := runtime.NumGoroutine()
	e := newEnv(t, blk.Config{InFlight: 2})
	g := holdIO(t)
	data := bytes.Repeat([]byte{0x5a}, 512)
	e.submit(tOut, 4, data, 0)
	e.submit(tIn, 8, nil, 512)
	_ = e.kick.Signal()
	g.wait(t, 2)
	stopHeld(t, e.dev, g, func() struct{} { e.dev.Reset(); return struct{}{} })
	checkGoroutines(t, base)
	if u := e.q.Reap(); len(u) != 0 {
		t.Errorf("Reset returned %v", u)
	}
	if la, nu := e.vq.LastAvail(), e.vq.NextUsed(); la != 2 || nu != 0 {
		t.Errorf("after Reset: %d popped, %d pushed; want 2 and 0", la, nu)
	}
	if !bytes.Equal(e.file()[4*blk.SectorSize:5*blk.SectorSize], data) {
		t.Error("the write held at the reset is not in the image")
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

// newMMIOEnv is an env whose device sits behind a virtio-mmio transport
// the driver has started; e.kick is the transport's kick eventfd, and
// e.vq and e.failures are unused (the transport keeps the queue and turns
// a failure into DEVICE_NEEDS_RESET).
func newMMIOEnv(t *testing.T, cfg blk.Config) (*env, mmioDriver) {
	t.Helper()
	e := openEnv(t, cfg)
	m, err := virtio.NewMMIO(e.dev, e.mem.Memory, func() {
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
	e.kick = m.KickFDs()[0]
	d := mmioDriver{m}
	d.start(t, e.dev.Features()|virtio.QueueFeatures, e.q.Cfg)
	return e, d
}

// savedPositions saves the quiesced transport's state, which must succeed
// (the device drained its queue), and returns queue 0's positions.
func savedPositions(t *testing.T, d mmioDriver) (next, used uint16) {
	t.Helper()
	s, err := d.m.SaveState()
	if err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	if s.Status&virtio.StatusNeedsReset != 0 {
		t.Fatalf("the device failed: status %s", virtio.StatusString(s.Status))
	}
	return s.Queues[0].NextAvail, s.Queues[0].UsedIdx
}

// TestQuiesceThroughMMIO runs the pause as the VMM does, through the
// transport: MMIO.Quiesce with requests in flight returns them, SaveState
// accepts the queue (nothing popped and not returned, the used index in
// guest memory), and MMIO.Resume starts a session that serves what was
// left in the ring and what the driver posted meanwhile.
func TestQuiesceThroughMMIO(t *testing.T) {
	base := runtime.NumGoroutine()
	e, d := newMMIOEnv(t, blk.Config{InFlight: 2})
	g := holdIO(t)
	data := bytes.Repeat([]byte("snapshot"), 2048/8)
	held := []req{e.submit(tOut, 8, data, 0), e.submit(tIn, 16, nil, 4096)}
	waiting := e.submit(tIn, 24, nil, 512)
	d.w(virtio.RegQueueNotify, 0)
	g.wait(t, len(held))
	if err := stopHeld(t, e.dev, g, d.m.Quiesce); err != nil {
		t.Fatalf("MMIO.Quiesce: %v", err)
	}
	checkGoroutines(t, base)
	if next, used := savedPositions(t, d); next != 2 || used != 2 {
		t.Errorf("saved positions %d/%d; want 2/2", next, used)
	}
	checkDone(t, e, e.q.Reap(), held, []uint32{1, 4096 + 1})
	checkRead(t, e, held[1], 16, 4096)
	if !bytes.Equal(e.file()[8*blk.SectorSize:8*blk.SectorSize+len(data)], data) {
		t.Error("the write held at the quiesce is not in the image")
	}

	later := e.submit(tIn, 32, nil, 512) // the device is paused: no notify
	if err := d.m.Resume(); err != nil {
		t.Fatalf("MMIO.Resume: %v", err)
	}
	rest := []req{waiting, later}
	checkDone(t, e, e.reap(len(rest)), rest, []uint32{513, 513})
	checkRead(t, e, waiting, 24, 512)
	checkRead(t, e, later, 32, 512)
	if err := d.m.Quiesce(); err != nil {
		t.Fatalf("second MMIO.Quiesce: %v", err)
	}
	if next, used := savedPositions(t, d); next != 4 || used != 4 {
		t.Errorf("saved positions %d/%d after the resumed session; want 4/4", next, used)
	}
	checkGoroutines(t, base)
}

// TestQuiesceIdle: Quiesce of a device with no session, or with an idle
// one, returns at once and changes nothing the next session needs.
func TestQuiesceIdle(t *testing.T) {
	e := newEnv(t, blk.Config{})
	e.dev.Quiesce()
	e.dev.Quiesce() // no session: nothing to do
	checkPositions(t, e, 0)
	e.activate(e.vq)
	r, st, _ := e.do(tIn, 1, nil, 512)
	if st != sOK {
		t.Fatalf("read after an idle quiesce: status %d", st)
	}
	checkRead(t, e, r, 1, 512)
	e.dev.Quiesce()
	checkPositions(t, e, 1)
}
