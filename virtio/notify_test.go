package virtio_test

import (
	"fmt"
	"testing"
)

// startAt moves both sides of a fresh queue to ring index start, so that
// tests can place the free-running indices just before a wrap. The driver
// must not Reap afterwards (its private used index stays at 0).
func (e *qenv) startAt(tb testing.TB, start uint16) {
	tb.Helper()
	if err := e.mem.Store16Release(e.drv.Cfg.Used+2, start); err != nil {
		tb.Fatal(err)
	}
	e.drv.SetAvailIdx(start)
	if err := e.dev.SetIndices(start); err != nil {
		tb.Fatal(err)
	}
}

// cycle adds, pops and pushes n one-descriptor chains.
func (e *qenv) cycle(tb testing.TB, n int) {
	tb.Helper()
	b := e.buf(4, true, 0)
	for i := 0; i < n; i++ {
		if _, ok := e.drv.Add(b); !ok {
			tb.Fatal("driver out of descriptors")
		}
		c := e.pop(tb)
		if err := e.dev.Push(c.Head, 4); err != nil {
			tb.Fatal(err)
		}
	}
}

func (e *qenv) needsNotification(tb testing.TB) bool {
	tb.Helper()
	need, err := e.dev.NeedsNotification()
	if err != nil {
		tb.Fatal(err)
	}
	return need
}

func (e *qenv) usedFlags(tb testing.TB) uint16 {
	tb.Helper()
	v, err := e.mem.Read16(e.drv.Cfg.Used)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

func (e *qenv) availEvent(tb testing.TB) uint16 {
	tb.Helper()
	v, err := e.mem.Read16(e.drv.Cfg.Used + 4 + 8*uint64(e.drv.Cfg.Size))
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

func TestInterruptSuppressionNoEventIdx(t *testing.T) {
	e := newQEnv(t, qopts{size: 8})
	if e.needsNotification(t) {
		t.Error("NeedsNotification before any push = true")
	}
	e.cycle(t, 1)
	if !e.needsNotification(t) {
		t.Error("NeedsNotification after a push = false")
	}
	if e.needsNotification(t) {
		t.Error("NeedsNotification again with nothing new = true")
	}
	e.drv.SetNoInterrupt(true)
	e.cycle(t, 2)
	if e.needsNotification(t) {
		t.Error("NeedsNotification with VIRTQ_AVAIL_F_NO_INTERRUPT = true")
	}
	e.drv.SetNoInterrupt(false)
	if !e.needsNotification(t) {
		t.Error("NeedsNotification after the driver cleared NO_INTERRUPT, with entries unsignalled = false")
	}
	if _, _, n := e.dev.Stats(); n != 2 {
		t.Errorf("Stats notifies = %d; want 2", n)
	}
}

func TestKickSuppressionNoEventIdx(t *testing.T) {
	e := newQEnv(t, qopts{size: 8})
	if !e.drv.NeedsKick(0) || e.usedFlags(t) != 0 {
		t.Fatalf("fresh queue: used flags %#x; want the driver to kick", e.usedFlags(t))
	}
	for i := 0; i < 2; i++ { // idempotent
		if err := e.dev.DisableNotification(); err != nil {
			t.Fatal(err)
		}
		if got := e.usedFlags(t); got != 1 {
			t.Errorf("used flags after DisableNotification = %#x; want VIRTQ_USED_F_NO_NOTIFY", got)
		}
	}
	old := e.drv.AvailIdx()
	h, _ := e.drv.Add(e.buf(4, false, 0))
	if e.drv.NeedsKick(old) {
		t.Error("driver kicks while notifications are disabled")
	}
	got, err := e.dev.EnableNotification()
	if err != nil || !got {
		t.Errorf("EnableNotification with a buffer added meanwhile = %v, %v; want true", got, err)
	}
	if e.usedFlags(t) != 0 || !e.drv.NeedsKick(old) {
		t.Errorf("used flags after EnableNotification = %#x; want 0", e.usedFlags(t))
	}
	if c := e.pop(t); c.Head != h {
		t.Fatalf("popped %d; want %d", c.Head, h)
	}
	if got, err := e.dev.EnableNotification(); got || err != nil {
		t.Errorf("EnableNotification on an empty ring = %v, %v; want false", got, err)
	}
}

// TestUsedEvent checks vring_need_event for interrupts (virtio 1.2, 2.7.10):
// the device interrupts when the used index moves past used_event, i.e. when
// used_event is in [old, new) modulo 2^16.
func TestUsedEvent(t *testing.T) {
	tests := []struct {
		start, event uint16
		pushes       int
		want         bool
	}{
		{0, 0, 1, true},
		{0, 1, 1, false},
		{0, 1, 2, true},
		{5, 4, 1, false}, // stale event: already passed
		{5, 5, 3, true},  // a batch passes it
		{5, 7, 3, true},  // the last entry of a batch
		{5, 8, 3, false}, // new == event: not passed yet
		{0, 0xffff, 1, false},
		{0x8000, 0, 1, false},
		{0xfffe, 0xffff, 2, true}, // new index wraps to 0
		{0xfffe, 0, 2, false},
		{0xfffe, 0, 3, true},
		{0xffff, 0xffff, 1, true},
		{0xffff, 0xfffe, 4, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("start=%#x/event=%#x/pushes=%d", tt.start, tt.event, tt.pushes), func(t *testing.T) {
			e := newQEnv(t, qopts{size: 8, eventIdx: true})
			e.startAt(t, tt.start)
			e.drv.SetUsedEvent(tt.event)
			e.cycle(t, tt.pushes)
			if got := e.needsNotification(t); got != tt.want {
				t.Errorf("NeedsNotification = %v; want %v", got, tt.want)
			}
			if e.needsNotification(t) {
				t.Error("a second NeedsNotification with nothing new = true")
			}
		})
	}
}

func TestUsedEventIgnoresNoInterruptFlag(t *testing.T) {
	// With EVENT_IDX the device ignores VIRTQ_AVAIL_F_NO_INTERRUPT
	// (2.7.10: "The device MUST ignore the lower bit of flags").
	e := newQEnv(t, qopts{size: 8, eventIdx: true})
	e.drv.SetNoInterrupt(true)
	e.drv.SetUsedEvent(0)
	e.cycle(t, 1)
	if !e.needsNotification(t) {
		t.Error("NeedsNotification = false; want true: used_event decides, not the flag")
	}
}

// TestAvailEvent checks the device's side of kick suppression with
// EVENT_IDX: EnableNotification publishes avail_event = the next entry it
// will consume, DisableNotification leaves it stale, and EnableNotification
// reports buffers that arrived while the driver was not kicking.
func TestAvailEvent(t *testing.T) {
	for _, start := range []uint16{0, 100, 0xfffe, 0xffff} {
		t.Run(fmt.Sprintf("start=%#x", start), func(t *testing.T) {
			e := newQEnv(t, qopts{size: 8, eventIdx: true})
			e.startAt(t, start)
			b := e.buf(4, false, 0)
			if got, err := e.dev.EnableNotification(); got || err != nil {
				t.Fatalf("EnableNotification on an empty ring = %v, %v", got, err)
			}
			if got := e.availEvent(t); got != start {
				t.Fatalf("avail_event = %#x; want %#x", got, start)
			}
			old := e.drv.AvailIdx()
			e.drv.Add(b)
			if !e.drv.NeedsKick(old) {
				t.Error("first buffer after EnableNotification: driver does not kick")
			}
			old = e.drv.AvailIdx()
			e.drv.Add(b)
			if e.drv.NeedsKick(old) {
				t.Error("second buffer: driver kicks although avail_event was passed")
			}
			if err := e.dev.DisableNotification(); err != nil {
				t.Fatal(err)
			}
			if e.usedFlags(t) != 0 || e.availEvent(t) != start {
				t.Errorf("DisableNotification wrote used flags %#x, avail_event %#x; want both untouched",
					e.usedFlags(t), e.availEvent(t))
			}
			e.pop(t)
			e.pop(t)
			if got, err := e.dev.EnableNotification(); got || err != nil {
				t.Errorf("EnableNotification after draining = %v, %v; want false", got, err)
			}
			if got, want := e.availEvent(t), start+2; got != want {
				t.Errorf("avail_event = %#x; want %#x", got, want)
			}
			// A buffer arrives while notifications are disabled: the
			// driver does not kick, so EnableNotification must report it.
			if err := e.dev.DisableNotification(); err != nil {
				t.Fatal(err)
			}
			e.drv.Add(b)
			if got, err := e.dev.EnableNotification(); !got || err != nil {
				t.Errorf("EnableNotification with a buffer added in the window = %v, %v; want true", got, err)
			}
			old = e.drv.AvailIdx()
			e.drv.Add(b)
			if e.drv.NeedsKick(old) {
				t.Error("driver kicks for a buffer behind an unconsumed one")
			}
		})
	}
}
