package virtio_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// serve plays the worker of a fakeDevice activation on queue i: it pops
// every available chain, pushes each with its writable length, and
// notifies. It returns the heads in the order it took them.
func serve(tb testing.TB, a virtio.Activation, i int) []uint16 {
	tb.Helper()
	q := a.Queues[i]
	var c virtio.Chain
	var heads []uint16
	for {
		ok, err := q.Pop(&c)
		if err != nil {
			tb.Fatalf("queue %d: Pop: %v", i, err)
		}
		if !ok {
			break
		}
		heads = append(heads, c.Head)
		if err := q.Push(c.Head, uint32(c.WritableLen())); err != nil {
			tb.Fatal(err)
		}
	}
	if len(heads) > 0 {
		if err := q.Notify(); err != nil {
			tb.Fatal(err)
		}
	}
	return heads
}

// post makes n one-buffer chains of wlen writable bytes available on q
// and returns their heads.
func post(tb testing.TB, e *menv, q *virtiotest.Queue, n int, wlen uint32) []uint16 {
	tb.Helper()
	var heads []uint16
	for range n {
		h, ok := q.Add(virtiotest.Buf{Addr: e.mem.Alloc(uint64(wlen), 8), Len: wlen, Writable: true})
		if !ok {
			tb.Fatal("driver out of descriptors")
		}
		heads = append(heads, h)
	}
	return heads
}

// cycleTo runs chains through queue i, up to four at a time, until n have been
// used, reusing one buffer so that memory does not run out.
func cycleTo(tb testing.TB, e *menv, a virtio.Activation, i int, q *virtiotest.Queue, n int) {
	tb.Helper()
	buf := virtiotest.Buf{Addr: e.mem.Alloc(8, 8), Len: 8, Writable: true}
	for done := 0; done < n; {
		for k := 0; k < 4 && q.Free() > 0 && done+k < n; k++ {
			if _, ok := q.Add(buf); !ok {
				tb.Fatal("driver out of descriptors")
			}
		}
		done += len(serve(tb, a, i))
		q.Reap()
	}
}

// roundTrip encodes s with encoding/json and decodes it again, as a
// snapshot file does.
func roundTrip(tb testing.TB, s virtio.MMIOState) virtio.MMIOState {
	tb.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		tb.Fatal(err)
	}
	var out virtio.MMIOState
	if err := json.Unmarshal(b, &out); err != nil {
		tb.Fatal(err)
	}
	return out
}

// restored is a fresh transport and fake device over e's guest memory.
func (e *menv) restored(tb testing.TB, dev virtio.Device) (*menv, error) {
	tb.Helper()
	r := &menv{mem: e.mem}
	if f, ok := dev.(*fakeDevice); ok {
		r.dev = f
	}
	r.m = newMMIO(tb, dev, e.mem.Memory, func() { r.raised.Add(1) })
	return r, nil
}

func usedIdx(tb testing.TB, e *menv, q *virtiotest.Queue) uint16 {
	tb.Helper()
	v, err := e.mem.Load16Acquire(q.Cfg.Used + 2)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// TestMMIOSaveRestore drives a device through the driver's init sequence,
// runs chains through two queues (to the edge of the 16-bit index wrap in
// some cases), quiesces, saves, round-trips the state through JSON and
// restores it into a fresh transport and device over the same memory; the
// driver then carries on: the restored device takes the next chains at
// the saved position, the used ring continues and interrupts follow the
// driver's suppression.
func TestMMIOSaveRestore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		eventIdx bool
		size     uint16
		before   int // chains used on queue 0 before the snapshot
	}{
		{"fresh", true, 8, 0},
		{"some", true, 8, 5},
		{"some no event idx", false, 4, 7},
		{"wrap after restore", true, 4, 65533},
		{"wrapped before", false, 4, 65536 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newMEnv(t, newFakeDevice())
			var bound []int
			e.m.BindKicks(func(q int, _ *eventfd.EventFD) error { bound = append(bound, q); return nil })
			qs := e.driverQueues(tc.eventIdx, tc.size, 0, 2)
			feat := uint64(virtio.FeatureVersion1 | 1<<5)
			if tc.eventIdx {
				feat |= virtio.FeatureEventIdx
			}
			a := e.start(t, feat, qs)
			cycleTo(t, e, a, 0, qs[0], tc.before)
			cycleTo(t, e, a, 2, qs[2], 1)
			e.w(virtio.RegQueueSel, 1)
			e.w(virtio.RegDeviceFeaturesSel, 1)
			// Leave a used-buffer interrupt pending.
			post(t, e, qs[0], 1, 8)
			serve(t, a, 0)
			qs[0].Reap()
			if e.r(virtio.RegInterruptStatus)&virtio.IntUsedBuffer == 0 {
				t.Fatal("no used-buffer interrupt pending before the snapshot")
			}
			// Buffers the driver posts with the device stopped.
			pending := post(t, e, qs[0], 2, 16)

			if err := e.m.Quiesce(); err != nil {
				t.Fatal(err)
			}
			if got := e.r(virtio.RegStatus); got != 15 {
				t.Errorf("status after Quiesce = %s; want it unchanged", virtio.StatusString(got))
			}
			s, err := e.m.SaveState()
			if err != nil {
				t.Fatal(err)
			}
			pos := uint16(tc.before + 1)
			want := virtio.MMIOState{
				DeviceType: virtio.DeviceVsock, Status: 15, DeviceFeaturesSel: 1, DriverFeaturesSel: 0,
				DriverFeatures: feat, QueueSel: 1, InterruptStatus: virtio.IntUsedBuffer,
				Queues: []virtio.MMIOQueueState{
					{Size: tc.size, Ready: true, Desc: qs[0].Cfg.Desc, Avail: qs[0].Cfg.Avail, Used: qs[0].Cfg.Used, NextAvail: pos, UsedIdx: pos},
					{},
					{Size: 2, Ready: true, Desc: qs[2].Cfg.Desc, Avail: qs[2].Cfg.Avail, Used: qs[2].Cfg.Used, NextAvail: 1, UsedIdx: 1},
				},
			}
			if diff := cmp.Diff(want, s); diff != "" {
				t.Errorf("saved state (-want +got):\n%s", diff)
			}
			s = roundTrip(t, s)
			if diff := cmp.Diff(want, s); diff != "" {
				t.Errorf("state after JSON (-want +got):\n%s", diff)
			}
			if err := e.m.Close(); err != nil { // the old process goes away
				t.Fatal(err)
			}

			dev2 := newFakeDevice()
			r, _ := e.restored(t, dev2)
			var bound2 []int
			r.m.BindKicks(func(q int, _ *eventfd.EventFD) error { bound2 = append(bound2, q); return nil })
			if err := r.m.RestoreState(s); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]int{0, 2}, bound2); diff != "" {
				t.Errorf("queues bound by restore (-want +got):\n%s", diff)
			}
			if got := r.r(virtio.RegStatus); got != 15 {
				t.Errorf("restored status = %s", virtio.StatusString(got))
			}
			if got := r.raised.Load(); got != 1 {
				t.Errorf("raise called %d times by restore; want 1 (the pending interrupt)", got)
			}
			for _, reg := range []struct {
				off  uint64
				want uint32
			}{{virtio.RegInterruptStatus, virtio.IntUsedBuffer}, {virtio.RegQueueNum, 0}, {virtio.RegQueueReady, 0}} {
				if got := r.r(reg.off); got != reg.want {
					t.Errorf("register %#x = %#x; want %#x", reg.off, got, reg.want)
				}
			}
			r.w(virtio.RegQueueSel, 0)
			if got := r.r(virtio.RegQueueNum); got != uint32(tc.size) {
				t.Errorf("queue 0 size %d; want %d", got, tc.size)
			}
			a2 := dev2.lastActivation(t)
			if a2.Features != feat || a2.Queues[1] != nil || a2.Queues[0] == nil || a2.Queues[2] == nil {
				t.Fatalf("restored activation: features %#x, queues %v", a2.Features, a2.Queues)
			}
			for i, k := range r.m.KickFDs() {
				n, _ := k.Wait()
				if wantKick := uint64(boolInt(i != 1)); n != wantKick {
					t.Errorf("queue %d kicked %d times by restore; want %d", i, n, wantKick)
				}
			}
			if got := a2.Queues[0].LastAvail(); got != pos {
				t.Errorf("restored queue 0 at %d; want %d", got, pos)
			}
			r.w(virtio.RegInterruptACK, virtio.IntUsedBuffer)

			// The driver carries on: the two buffers it posted while the
			// device was stopped, then more, across the index wrap.
			pending = append(pending, post(t, r, qs[0], 2, 24)...)
			if diff := cmp.Diff(pending, serve(t, a2, 0)); diff != "" {
				t.Errorf("heads taken after restore (-posted +taken):\n%s", diff)
			}
			var got []virtiotest.Used
			got = append(got, qs[0].Reap()...)
			wantUsed := []virtiotest.Used{{ID: pending[0], Len: 16}, {ID: pending[1], Len: 16}, {ID: pending[2], Len: 24}, {ID: pending[3], Len: 24}}
			if diff := cmp.Diff(wantUsed, got); diff != "" {
				t.Errorf("used entries after restore (-want +got):\n%s", diff)
			}
			if got, want := usedIdx(t, r, qs[0]), pos+4; got != want {
				t.Errorf("used index %d; want %d", got, want)
			}
			if r.raised.Load() != 2 || r.r(virtio.RegInterruptStatus) != virtio.IntUsedBuffer {
				t.Errorf("after the first restored push: raised %d, status %#x; want one more interrupt",
					r.raised.Load(), r.r(virtio.RegInterruptStatus))
			}
			cycleTo(t, r, a2, 0, qs[0], 10)
			if got, want := usedIdx(t, r, qs[0]), pos+14; got != want {
				t.Errorf("used index %d after 10 more; want %d", got, want)
			}
			cycleTo(t, r, a2, 2, qs[2], 3)
			if got := usedIdx(t, r, qs[2]); got != 4 {
				t.Errorf("queue 2 used index %d; want 4", got)
			}
			if n := r.m.GuestErrors(); n != 0 {
				t.Errorf("%d guest errors after restore", n)
			}
		})
	}
}

// TestMMIOQuiesceResume pauses a running device and resumes it on the same
// transport: the registers stay, the device is activated again at the
// queue's position, each queue is kicked once, buffers posted meanwhile
// are taken first.
func TestMMIOQuiesceResume(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	binds := 0
	e.m.BindKicks(func(int, *eventfd.EventFD) error { binds++; return nil })
	qs := e.driverQueues(true, 8)
	a := e.start(t, allQueueFeatures, qs)
	cycleTo(t, e, a, 0, qs[0], 11)
	if err := e.m.Resume(); err != nil { // not quiesced: nothing to do
		t.Fatal(err)
	}
	if err := e.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Quiesce(); err != nil { // twice: nothing more to stop
		t.Fatal(err)
	}
	if dev.quiesces != 1 {
		t.Errorf("device quiesced %d times; want 1", dev.quiesces)
	}
	heads := post(t, e, qs[0], 3, 4)
	if err := e.m.Resume(); err != nil {
		t.Fatal(err)
	}
	acts, resets, live := dev.counts()
	if acts != 2 || resets != 0 || live != 1 {
		t.Errorf("after resume: %d activations, %d resets, %d live; want 2, 0, 1", acts, resets, live)
	}
	if binds != 1 {
		t.Errorf("queue bound %d times; want once", binds)
	}
	if n, _ := e.m.KickFDs()[0].Wait(); n != 1 {
		t.Errorf("queue 0 kicked %d times by Resume; want 1", n)
	}
	a2 := dev.lastActivation(t)
	if diff := cmp.Diff(heads, serve(t, a2, 0)); diff != "" {
		t.Errorf("heads after resume (-posted +taken):\n%s", diff)
	}
	if got := usedIdx(t, e, qs[0]); got != 14 {
		t.Errorf("used index %d; want 14", got)
	}
	if st := e.m.Stats(); st.Activations != 2 || st.GuestErrorsTotal() != 0 {
		t.Errorf("stats %+v", st)
	}
	// A reset while quiesced resets the device; the driver starts over.
	if err := e.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	e.w(virtio.RegStatus, 0)
	if _, resets, _ := dev.counts(); resets != 1 {
		t.Errorf("driver reset of a quiesced device: %d device resets; want 1", resets)
	}
	if err := e.m.Resume(); err != nil {
		t.Fatal(err)
	}
	if acts, _, _ := dev.counts(); acts != 2 {
		t.Errorf("Resume after a driver reset activated the device")
	}
}

// noQuiesce is a device without Quiescer.
type noQuiesce struct{ virtio.Device }

func TestMMIOQuiesceRefusals(t *testing.T) {
	e := newMEnv(t, newFakeDevice())
	qs := e.driverQueues(true, 8)
	a := e.start(t, allQueueFeatures, qs)
	if _, err := e.m.SaveState(); !errors.Is(err, virtio.ErrNotQuiesced) {
		t.Errorf("SaveState of a running device: %v; want ErrNotQuiesced", err)
	}
	post(t, e, qs[0], 2, 4)
	var c virtio.Chain
	if ok, err := a.Queues[0].Pop(&c); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := e.m.Quiesce(); !errors.Is(err, virtio.ErrNotDrained) {
		t.Errorf("Quiesce with a chain popped: %v; want ErrNotDrained", err)
	}
	if _, err := e.m.SaveState(); !errors.Is(err, virtio.ErrNotDrained) {
		t.Errorf("SaveState with a chain popped: %v; want ErrNotDrained", err)
	}
	if err := a.Queues[0].PushNoPublish(c.Head, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.SaveState(); !errors.Is(err, virtio.ErrNotDrained) {
		t.Errorf("SaveState with a push not published: %v; want ErrNotDrained", err)
	}
	if err := a.Queues[0].Publish(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.SaveState(); err != nil {
		t.Errorf("SaveState once drained: %v", err)
	}

	nq := &noQuiesce{newFakeDevice()}
	e2 := &menv{mem: virtiotest.NewMemory(t, 1<<20), dev: nq.Device.(*fakeDevice)}
	e2.m = newMMIO(t, nq, e2.mem.Memory, func() {})
	e2.start(t, allQueueFeatures, e2.driverQueues(true, 8))
	if err := e2.m.Quiesce(); !errors.Is(err, virtio.ErrNoQuiesce) {
		t.Errorf("Quiesce of a device without Quiescer: %v; want ErrNoQuiesce", err)
	}
	if _, _, live := e2.dev.counts(); live != 1 {
		t.Error("a refused Quiesce stopped the device")
	}
	// A device the driver never started needs no Quiescer.
	e3 := &menv{mem: virtiotest.NewMemory(t, 1<<20)}
	e3.m = newMMIO(t, &noQuiesce{newFakeDevice()}, e3.mem.Memory, func() {})
	if err := e3.m.Quiesce(); err != nil {
		t.Errorf("Quiesce of an idle transport: %v", err)
	}
	if _, err := e3.m.SaveState(); err != nil {
		t.Errorf("SaveState of an idle transport: %v", err)
	}
}

// savedEnv is a running transport with a snapshot taken after 5 chains on
// queue 0 (size 8) and none on queue 2 (size 2); queue 1 is unset.
func savedEnv(t testing.TB) (*menv, virtio.MMIOState) {
	t.Helper()
	e := newMEnv(t, newFakeDevice())
	qs := e.driverQueues(true, 8, 0, 2)
	a := e.start(t, allQueueFeatures, qs)
	cycleTo(t, e, a, 0, qs[0], 5)
	if err := e.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	s, err := e.m.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	return e, roundTrip(t, s)
}

// TestMMIORestoreRefusals changes one field of a good state at a time;
// each change makes RestoreState refuse with ErrBadState and leave the
// fresh transport untouched.
func TestMMIORestoreRefusals(t *testing.T) {
	e, good := savedEnv(t)
	const n = 15 // status with DRIVER_OK
	for _, tc := range []struct {
		name string
		mod  func(s *virtio.MMIOState)
	}{
		{"device type", func(s *virtio.MMIOState) { s.DeviceType = virtio.DeviceBlock }},
		{"status skips a step", func(s *virtio.MMIOState) { s.Status = virtio.StatusAcknowledge | virtio.StatusDriverOK }},
		{"status unknown bit", func(s *virtio.MMIOState) { s.Status |= 16 }},
		{"status high bit", func(s *virtio.MMIOState) { s.Status |= 1 << 8 }},
		{"features not offered", func(s *virtio.MMIOState) { s.DriverFeatures |= 1 << 7 }},
		{"features without VERSION_1", func(s *virtio.MMIOState) { s.DriverFeatures &^= virtio.FeatureVersion1 }},
		{"features before DRIVER", func(s *virtio.MMIOState) {
			s.Status = virtio.StatusAcknowledge
			s.Queues = make([]virtio.MMIOQueueState, 3)
		}},
		{"interrupt status bit", func(s *virtio.MMIOState) { s.InterruptStatus = 4 }},
		{"too few queues", func(s *virtio.MMIOState) { s.Queues = s.Queues[:2] }},
		{"too many queues", func(s *virtio.MMIOState) { s.Queues = append(s.Queues, virtio.MMIOQueueState{}) }},
		{"no queues", func(s *virtio.MMIOState) { s.Queues = nil }},
		{"queue before FEATURES_OK", func(s *virtio.MMIOState) {
			s.Status = virtio.StatusAcknowledge | virtio.StatusDriver
			s.Queues[0].NextAvail, s.Queues[0].UsedIdx = 0, 0
			s.Queues[2] = virtio.MMIOQueueState{}
		}},
		{"size not a power of two", func(s *virtio.MMIOState) { s.Queues[0].Size = 6 }},
		{"size over max", func(s *virtio.MMIOState) { s.Queues[2].Size = 128 }},
		{"unready queue size", func(s *virtio.MMIOState) { s.Queues[1].Size = 3 }},
		{"ready queue size 0", func(s *virtio.MMIOState) { s.Queues[2].Size = 0 }},
		{"desc misaligned", func(s *virtio.MMIOState) { s.Queues[0].Desc += 8 }},
		{"used misaligned", func(s *virtio.MMIOState) { s.Queues[0].Used += 2 }},
		{"desc outside memory", func(s *virtio.MMIOState) { s.Queues[0].Desc = 1 << 40 }},
		{"avail past the end", func(s *virtio.MMIOState) { s.Queues[0].Avail = 1<<20 - 8 }},
		{"used address wraps", func(s *virtio.MMIOState) { s.Queues[2].Used = ^uint64(3) }},
		{"in flight", func(s *virtio.MMIOState) { s.Queues[0].NextAvail++ }},
		{"used index not the ring's", func(s *virtio.MMIOState) { s.Queues[0].NextAvail++; s.Queues[0].UsedIdx++ }},
		{"positions of an unset queue", func(s *virtio.MMIOState) { s.Queues[1].NextAvail, s.Queues[1].UsedIdx = 1, 1 }},
		{"positions before DRIVER_OK", func(s *virtio.MMIOState) { s.Status = n &^ virtio.StatusDriverOK }},
		{"positions under NEEDS_RESET", func(s *virtio.MMIOState) { s.Status |= virtio.StatusNeedsReset }},
		{"device state for a device without", func(s *virtio.MMIOState) { s.Device = json.RawMessage(`{"x":1}`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := roundTrip(t, good)
			s.Queues = append([]virtio.MMIOQueueState(nil), good.Queues...)
			tc.mod(&s)
			dev := newFakeDevice()
			r, _ := e.restored(t, dev)
			err := r.m.RestoreState(s)
			if !errors.Is(err, virtio.ErrBadState) {
				t.Fatalf("RestoreState: %v; want ErrBadState", err)
			}
			if acts, _, _ := dev.counts(); acts != 0 || r.raised.Load() != 0 || r.m.Status() != 0 {
				t.Errorf("a refused restore changed the transport: %d activations, %d interrupts, status %s",
					acts, r.raised.Load(), virtio.StatusString(r.m.Status()))
			}
			// The transport is still fresh: the good state goes in.
			if err := r.m.RestoreState(good); err != nil {
				t.Errorf("good state after a refusal: %v", err)
			}
		})
	}
	r, _ := e.restored(t, newFakeDevice())
	if err := r.m.RestoreState(good); err != nil {
		t.Fatal(err)
	}
	if err := r.m.RestoreState(good); !errors.Is(err, virtio.ErrInUse) {
		t.Errorf("second RestoreState: %v; want ErrInUse", err)
	}
}

// TestMMIORestoreNeedsReset: a device saved with DEVICE_NEEDS_RESET comes
// back marked so and is not activated; the driver's reset then works as
// usual.
func TestMMIORestoreNeedsReset(t *testing.T) {
	e := newMEnv(t, newFakeDevice())
	a := e.start(t, allQueueFeatures, e.driverQueues(true, 8))
	a.Fail(errors.New("bad ring"))
	if err := e.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	s, err := e.m.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	dev := newFakeDevice()
	r, _ := e.restored(t, dev)
	if err := r.m.RestoreState(roundTrip(t, s)); err != nil {
		t.Fatal(err)
	}
	if got := r.r(virtio.RegStatus); got != 15|virtio.StatusNeedsReset {
		t.Errorf("status %s", virtio.StatusString(got))
	}
	if acts, _, _ := dev.counts(); acts != 0 {
		t.Errorf("a device needing reset was activated")
	}
	if err := r.m.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := r.r(virtio.RegInterruptStatus); got != virtio.IntConfigChange {
		t.Errorf("interrupt status %#x; want the configuration change", got)
	}
	r.w(virtio.RegStatus, 0)
	if acts, resets, _ := dev.counts(); acts != 0 || resets != 1 {
		t.Errorf("driver reset: %d activations, %d resets; want 0, 1", acts, resets)
	}
	r.start(t, allQueueFeatures, r.driverQueues(true, 8))
}

// statefulDev is a fakeDevice with device state.
type statefulDev struct {
	*fakeDevice
	state    string
	restored []string
}

func (d *statefulDev) SaveDeviceState() (json.RawMessage, error) {
	return json.Marshal(map[string]string{"s": d.state})
}

func (d *statefulDev) RestoreDeviceState(st json.RawMessage) error {
	var v struct{ S string }
	if st != nil {
		if err := json.Unmarshal(st, &v); err != nil || v.S == "bad" {
			return fmt.Errorf("%w: state %s", virtio.ErrBadState, st)
		}
	}
	d.restored = append(d.restored, v.S)
	return nil
}

func TestMMIODeviceState(t *testing.T) {
	dev := &statefulDev{fakeDevice: newFakeDevice(), state: "cid 3"}
	e := &menv{mem: virtiotest.NewMemory(t, 1<<20), dev: dev.fakeDevice}
	e.m = newMMIO(t, dev, e.mem.Memory, func() {})
	e.start(t, allQueueFeatures, e.driverQueues(true, 8))
	if err := e.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	s, err := e.m.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(s)
	if want := `"Device":{"s":"cid 3"}`; !strings.Contains(string(b), want) {
		t.Errorf("state JSON %s lacks %s", b, want)
	}
	s = roundTrip(t, s)
	for _, tc := range []struct {
		name    string
		st      json.RawMessage
		wantErr bool
		want    string
	}{
		{"saved", s.Device, false, "cid 3"},
		{"absent", nil, false, ""},
		{"refused", json.RawMessage(`{"s":"bad"}`), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d2 := &statefulDev{fakeDevice: newFakeDevice()}
			r := &menv{mem: e.mem, dev: d2.fakeDevice}
			r.m = newMMIO(t, d2, e.mem.Memory, func() {})
			s2 := s
			s2.Device = tc.st
			err := r.m.RestoreState(s2)
			if tc.wantErr {
				if !errors.Is(err, virtio.ErrBadState) {
					t.Errorf("RestoreState: %v; want ErrBadState", err)
				}
				if acts, _, _ := d2.counts(); acts != 0 || r.m.Status() != 0 {
					t.Error("a refused device state changed the transport")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{tc.want}, d2.restored); diff != "" {
				t.Errorf("device states restored (-want +got):\n%s", diff)
			}
			if acts, _, _ := d2.counts(); acts != 1 {
				t.Errorf("%d activations; want 1", acts)
			}
		})
	}
}

// echoDev is a fakeDevice with a real session: one worker goroutine per
// activation that waits for a kick first (so only the transport's kick
// after a restore gets it going), then takes every chain of queue 0 and
// holds the first `hold` of them, returning the rest with their writable
// length. Its session is a virtio.Drainer that returns the held chains,
// unless noDrain, which makes Drain drop them as Stop does (a device
// breaking the Quiescer contract).
type echoDev struct {
	*fakeDevice
	hold    int
	noDrain bool
	life    virtio.Lifecycle[*echoSession]
}

type echoSession struct {
	d    *echoDev
	q    *virtio.ActiveQueue
	stop *eventfd.EventFD
	done chan struct{}
	held []uint16 // owned by the worker, then by Drain
}

func (d *echoDev) Activate(a virtio.Activation) error {
	if err := d.fakeDevice.Activate(a); err != nil {
		return err
	}
	return d.life.Activate(func() (*echoSession, error) {
		stop, err := eventfd.NewNonblocking()
		if err != nil {
			return nil, err
		}
		s := &echoSession{d: d, q: a.Queues[0], stop: stop, done: make(chan struct{})}
		go s.run()
		return s, nil
	})
}

func (d *echoDev) Reset()   { d.life.Reset(); d.fakeDevice.Reset() }
func (d *echoDev) Quiesce() { d.life.Quiesce(); d.fakeDevice.Quiesce() }

func (s *echoSession) run() {
	defer close(s.done)
	fds := []unix.PollFd{{Fd: int32(s.q.Kick.FD()), Events: unix.POLLIN}, {Fd: int32(s.stop.FD()), Events: unix.POLLIN}}
	var c virtio.Chain
	for {
		if stopped, err := eventfd.PollStop(fds, -1); err != nil || stopped {
			return
		}
		_, _ = s.q.Kick.Wait()
		pushed := false
		for {
			ok, err := s.q.Pop(&c)
			if err != nil || !ok {
				break
			}
			if len(s.held) < s.d.hold {
				s.held = append(s.held, c.Head)
				continue
			}
			if err := s.q.Push(c.Head, uint32(c.WritableLen())); err != nil {
				return
			}
			pushed = true
		}
		if pushed {
			_ = s.q.Notify()
		}
	}
}

func (s *echoSession) Stop() {
	_ = s.stop.Signal()
	<-s.done
	s.stop.Close()
}

// Drain finishes the held chains: it returns them (written length 0) and
// notifies, as blk completes its in-flight requests.
func (s *echoSession) Drain() {
	s.Stop()
	if s.d.noDrain {
		return
	}
	for _, h := range s.held {
		_ = s.q.Push(h, 0)
	}
	if len(s.held) > 0 {
		_ = s.q.Notify()
	}
}

// reapN reaps from q until n used entries have come, or fails.
func reapN(tb testing.TB, q *virtiotest.Queue, n int) []virtiotest.Used {
	tb.Helper()
	var got []virtiotest.Used
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n {
		got = append(got, q.Reap()...)
		if time.Now().After(deadline) {
			tb.Fatalf("reaped %d used entries in 5s; want %d", len(got), n)
		}
		time.Sleep(time.Millisecond)
	}
	return got
}

// TestMMIOQuiesceDrainsInFlight: a device with chains in flight returns
// them when quiesced (Lifecycle.Quiesce calls Drain), so the state can be
// saved; restored, a device that waits for a kick gets one from the
// transport and takes the buffers the driver posted meanwhile; interrupts
// reach the restored transport.
func TestMMIOQuiesceDrainsInFlight(t *testing.T) {
	dev := &echoDev{fakeDevice: newFakeDevice(), hold: 2}
	e := &menv{mem: virtiotest.NewMemory(t, 1<<20), dev: dev.fakeDevice}
	e.m = newMMIO(t, dev, e.mem.Memory, func() { e.raised.Add(1) })
	qs := e.driverQueues(true, 8)
	e.start(t, allQueueFeatures, qs)
	heads := post(t, e, qs[0], 5, 8)
	e.w(virtio.RegQueueNotify, 0)
	got := reapN(t, qs[0], 3)
	if err := e.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	got = append(got, qs[0].Reap()...)
	want := []virtiotest.Used{{ID: heads[2], Len: 8}, {ID: heads[3], Len: 8}, {ID: heads[4], Len: 8}, {ID: heads[0]}, {ID: heads[1]}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("used entries up to the quiesce (-want +got):\n%s", diff)
	}
	s, err := e.m.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if q := s.Queues[0]; q.NextAvail != 5 || q.UsedIdx != 5 {
		t.Errorf("saved positions %d/%d; want 5/5", q.NextAvail, q.UsedIdx)
	}
	more := post(t, e, qs[0], 3, 8) // no kick: the device is stopped

	dev2 := &echoDev{fakeDevice: newFakeDevice()}
	r := &menv{mem: e.mem, dev: dev2.fakeDevice}
	r.m = newMMIO(t, dev2, e.mem.Memory, func() { r.raised.Add(1) })
	if err := r.m.RestoreState(roundTrip(t, s)); err != nil {
		t.Fatal(err)
	}
	got = reapN(t, qs[0], 3)
	want = []virtiotest.Used{{ID: more[0], Len: 8}, {ID: more[1], Len: 8}, {ID: more[2], Len: 8}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("used entries after restore (-want +got):\n%s", diff)
	}
	if r.raised.Load() == 0 || r.r(virtio.RegInterruptStatus)&virtio.IntUsedBuffer == 0 {
		t.Error("no used-buffer interrupt from the restored device")
	}
	// And once more through the register path.
	last := post(t, r, qs[0], 1, 8)
	r.w(virtio.RegQueueNotify, 0)
	if got := reapN(t, qs[0], 1); got[0].ID != last[0] {
		t.Errorf("used %v; want head %d", got, last[0])
	}
}

// TestMMIOQuiesceNotDrained: a device whose session drops its in-flight
// chains cannot be saved.
func TestMMIOQuiesceNotDrained(t *testing.T) {
	dev := &echoDev{fakeDevice: newFakeDevice(), hold: 1, noDrain: true}
	e := &menv{mem: virtiotest.NewMemory(t, 1<<20), dev: dev.fakeDevice}
	e.m = newMMIO(t, dev, e.mem.Memory, func() {})
	qs := e.driverQueues(true, 8)
	e.start(t, allQueueFeatures, qs)
	post(t, e, qs[0], 2, 8)
	e.w(virtio.RegQueueNotify, 0)
	reapN(t, qs[0], 1)
	if err := e.m.Quiesce(); !errors.Is(err, virtio.ErrNotDrained) {
		t.Errorf("Quiesce: %v; want ErrNotDrained", err)
	}
	if _, err := e.m.SaveState(); !errors.Is(err, virtio.ErrNotDrained) {
		t.Errorf("SaveState: %v; want ErrNotDrained", err)
	}
}

// FuzzMMIORestoreState restores JSON-decoded states into fresh transports:
// RestoreState never panics, a refusal wraps ErrBadState and leaves the
// transport untouched, and an accepted state is what SaveState gives back
// after a Quiesce.
func FuzzMMIORestoreState(f *testing.F) {
	seed := func(s virtio.MMIOState) {
		b, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	{
		e := newMEnv(f, newFakeDevice())
		qs := e.driverQueues(true, 8, 0, 2)
		e.start(f, allQueueFeatures, qs)
		if err := e.m.Quiesce(); err != nil {
			f.Fatal(err)
		}
		s, err := e.m.SaveState()
		if err != nil {
			f.Fatal(err)
		}
		seed(s)
		s.Status |= virtio.StatusNeedsReset
		s.InterruptStatus = 3
		seed(s)
		s.Status = 11
		seed(s)
	}
	_, s := savedEnv(f)
	seed(s)
	f.Add([]byte(`{"DeviceType":19,"Queues":[{},{},{}],"Device":null}`))
	f.Add([]byte(`{"DeviceType":19,"Status":3,"DriverFeatures":18446744073709551615,"Queues":[{},{},{}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s virtio.MMIOState
		if json.Unmarshal(data, &s) != nil {
			return
		}
		dev := newFakeDevice()
		e := newMEnv(t, dev)
		if err := e.m.RestoreState(s); err != nil {
			if !errors.Is(err, virtio.ErrBadState) {
				t.Fatalf("refusal %v does not wrap ErrBadState", err)
			}
			if acts, _, _ := dev.counts(); acts != 0 || e.raised.Load() != 0 || e.m.Status() != 0 {
				t.Fatal("a refused restore changed the transport")
			}
			return
		}
		if err := e.m.Quiesce(); err != nil {
			t.Fatal(err)
		}
		got, err := e.m.SaveState()
		if err != nil {
			t.Fatal(err)
		}
		s.Device = nil
		if diff := cmp.Diff(s, got, cmp.Comparer(func(a, b []virtio.MMIOQueueState) bool {
			return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b))
		})); diff != "" {
			t.Fatalf("saved again (-restored +saved):\n%s", diff)
		}
		if err := e.m.Resume(); err != nil {
			t.Fatal(err)
		}
		e.w(virtio.RegStatus, 0) // the driver resets whatever it was
	})
}
