package virtio_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

const allQueueFeatures uint64 = virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc

// TestMMIOLinuxInit runs the register sequence of Linux's virtio_mmio and
// virtio core (virtio_dev_probe, vm_find_vqs) and then moves a buffer.
func TestMMIOLinuxInit(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)

	type ident struct{ Magic, Version, DeviceID, VendorID uint32 }
	want := ident{0x74726976, 2, virtio.DeviceVsock, virtio.VendorID}
	got := ident{e.r(virtio.RegMagic), e.r(virtio.RegVersion), e.r(virtio.RegDeviceID), e.r(virtio.RegVendorID)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("identification registers (-want +got):\n%s", diff)
	}

	e.w(virtio.RegStatus, 0)
	e.addStatus(virtio.StatusAcknowledge)
	e.addStatus(virtio.StatusDriver)
	if s := e.r(virtio.RegStatus); s != virtio.StatusAcknowledge|virtio.StatusDriver {
		t.Fatalf("status = %s; want ACKNOWLEDGE|DRIVER", virtio.StatusString(s))
	}

	var words [3]uint32
	for sel := range words {
		e.w(virtio.RegDeviceFeaturesSel, uint32(sel))
		words[sel] = e.r(virtio.RegDeviceFeatures)
	}
	offered := dev.features | allQueueFeatures
	if diff := cmp.Diff([3]uint32{uint32(offered), uint32(offered >> 32), 0}, words); diff != "" {
		t.Errorf("device feature words 0..2 (-want +got):\n%s", diff)
	}

	accepted := allQueueFeatures | 1<<0
	e.writeFeatures(accepted)
	e.addStatus(virtio.StatusFeaturesOK)
	if s := e.r(virtio.RegStatus); s&virtio.StatusFeaturesOK == 0 {
		t.Fatalf("FEATURES_OK did not stick: status %s", virtio.StatusString(s))
	}

	// Queues 0 and 1 as the driver sets them up; queue 2 stays unused.
	qs := e.driverQueues(true, 256, 64)
	for i, q := range qs {
		e.w(virtio.RegQueueSel, uint32(i))
		if e.r(virtio.RegQueueReady) != 0 {
			t.Fatalf("queue %d ready before setup", i)
		}
		if got := e.r(virtio.RegQueueNumMax); got != uint32(dev.sizes[i]) {
			t.Errorf("queue %d QueueNumMax = %d; want %d", i, got, dev.sizes[i])
		}
		e.setupQueue(uint32(i), q.Cfg)
		if e.r(virtio.RegQueueReady) != 1 || e.r(virtio.RegQueueNum) != uint32(q.Cfg.Size) {
			t.Errorf("queue %d after setup: ready %d num %d", i, e.r(virtio.RegQueueReady), e.r(virtio.RegQueueNum))
		}
	}
	if acts, _, _ := dev.counts(); acts != 0 {
		t.Fatalf("device activated before DRIVER_OK")
	}
	e.addStatus(virtio.StatusDriverOK)
	if s := e.r(virtio.RegStatus); s != 15 {
		t.Fatalf("status = %s; want ACKNOWLEDGE|DRIVER|FEATURES_OK|DRIVER_OK", virtio.StatusString(s))
	}
	acts, resets, _ := dev.counts()
	if acts != 1 || resets != 0 {
		t.Fatalf("activations, resets = %d, %d; want 1, 0", acts, resets)
	}
	a := dev.lastActivation(t)
	if a.Features != accepted || a.Mem != e.mem.Memory || a.Fail == nil {
		t.Errorf("activation features %#x mem %p fail set %v; want %#x %p true", a.Features, a.Mem, a.Fail != nil, accepted, e.mem.Memory)
	}
	if len(a.Queues) != 3 || a.Queues[2] != nil {
		t.Fatalf("activation queues %v; want 3 with the last nil", a.Queues)
	}
	for i, q := range qs {
		aq := a.Queues[i]
		if diff := cmp.Diff(q.Cfg, aq.Config()); diff != "" {
			t.Errorf("queue %d config (-want +got):\n%s", i, diff)
		}
		if aq.Kick != e.m.KickFDs()[i] || aq.Interrupt == nil {
			t.Errorf("queue %d: kick %v interrupt set %v; want KickFDs()[%d]", i, aq.Kick, aq.Interrupt != nil, i)
		}
	}
	if n := e.m.GuestErrors(); n != 0 {
		t.Errorf("GuestErrors = %d after a clean init", n)
	}

	// One buffer through queue 1: driver adds and notifies, the device
	// is kicked, pops, pushes and interrupts.
	b := virtiotest.Buf{Addr: e.mem.Alloc(64, 8), Len: 64, Writable: true}
	head, _ := qs[1].Add(b)
	e.w(virtio.RegQueueNotify, 1)
	if n, err := a.Queues[1].Kick.Wait(); n != 1 || err != nil {
		t.Fatalf("kick Wait = %d, %v; want 1", n, err)
	}
	var c virtio.Chain
	if ok, err := a.Queues[1].Pop(&c); !ok || err != nil || c.Head != head {
		t.Fatalf("Pop = %v, %v head %d; want head %d", ok, err, c.Head, head)
	}
	if err := a.Queues[1].Push(c.Head, 7); err != nil {
		t.Fatal(err)
	}
	if err := a.Queues[1].Notify(); err != nil {
		t.Fatal(err)
	}
	if e.raised.Load() != 1 || e.r(virtio.RegInterruptStatus) != virtio.IntUsedBuffer {
		t.Errorf("after Notify: raised %d, InterruptStatus %#x; want 1, 1", e.raised.Load(), e.r(virtio.RegInterruptStatus))
	}
	e.w(virtio.RegInterruptACK, virtio.IntUsedBuffer)
	if got := e.r(virtio.RegInterruptStatus); got != 0 {
		t.Errorf("InterruptStatus after ACK = %#x", got)
	}
	if diff := cmp.Diff([]virtiotest.Used{{ID: head, Len: 7}}, qs[1].Reap()); diff != "" {
		t.Errorf("used (-want +got):\n%s", diff)
	}
}

func TestMMIOFeatureNegotiation(t *testing.T) {
	tests := []struct {
		name     string
		accepted uint64
		ok       bool
	}{
		{"VERSION_1 only", virtio.FeatureVersion1, true},
		{"everything offered", allQueueFeatures | 1<<0 | 1<<5, true},
		{"queue features", allQueueFeatures, true},
		{"device bit", virtio.FeatureVersion1 | 1<<5, true},
		{"nothing", 0, false},
		{"no VERSION_1", virtio.FeatureEventIdx | virtio.FeatureIndirectDesc, false},
		{"device bit not offered", virtio.FeatureVersion1 | 1<<1, false},
		{"high bit not offered", virtio.FeatureVersion1 | 1<<40, false},
		{"bit 63", virtio.FeatureVersion1 | 1<<63, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev := newFakeDevice()
			e := newMEnv(t, dev)
			if got := e.negotiate(tt.accepted); got != tt.ok {
				t.Fatalf("FEATURES_OK stuck = %v; want %v", got, tt.ok)
			}
			wantErrs := uint64(0)
			if !tt.ok {
				wantErrs = 1
				// Linux then sets FAILED (virtio_features_ok).
				e.addStatus(virtio.StatusFailed)
				if s := e.r(virtio.RegStatus); s != virtio.StatusAcknowledge|virtio.StatusDriver|virtio.StatusFailed {
					t.Errorf("status = %s; want ACKNOWLEDGE|DRIVER|FAILED", virtio.StatusString(s))
				}
			}
			if n := e.m.GuestErrors(); n != wantErrs {
				t.Errorf("GuestErrors = %d; want %d", n, wantErrs)
			}
			if !tt.ok {
				return
			}
			qs := e.driverQueues(tt.accepted&virtio.FeatureEventIdx != 0, 8)
			e.setupQueue(0, qs[0].Cfg)
			e.addStatus(virtio.StatusDriverOK)
			a := dev.lastActivation(t)
			if a.Features != tt.accepted {
				t.Errorf("activated with %#x; want %#x", a.Features, tt.accepted)
			}
			// The queue follows the negotiated ring features: without
			// EVENT_IDX DisableNotification sets VIRTQ_USED_F_NO_NOTIFY.
			if err := a.Queues[0].DisableNotification(); err != nil {
				t.Fatal(err)
			}
			flags, _ := e.mem.Read16(qs[0].Cfg.Used)
			if wantFlags := uint16(1); tt.accepted&virtio.FeatureEventIdx != 0 {
				wantFlags = 0
				if flags != wantFlags {
					t.Errorf("EVENT_IDX negotiated: used flags %#x; want 0", flags)
				}
			} else if flags != wantFlags {
				t.Errorf("EVENT_IDX not negotiated: used flags %#x; want 1", flags)
			}
			// ... and indirect descriptors work only when negotiated.
			qs[0].AddIndirect(virtiotest.Buf{Addr: e.mem.Alloc(8, 8), Len: 8})
			var c virtio.Chain
			ok, err := a.Queues[0].Pop(&c)
			if want := tt.accepted&virtio.FeatureIndirectDesc != 0; ok != want {
				t.Errorf("Pop of an indirect chain = %v, %v; want %v", ok, err, want)
			}
		})
	}
}

func TestMMIODriverFeaturesMisuse(t *testing.T) {
	e := newMEnv(t, newFakeDevice())
	e.addStatus(virtio.StatusAcknowledge)
	e.writeFeatures(virtio.FeatureVersion1) // before DRIVER: ignored
	if n := e.m.GuestErrors(); n != 2 {
		t.Errorf("GuestErrors = %d after two early feature writes; want 2", n)
	}
	e.addStatus(virtio.StatusDriver)
	e.w(virtio.RegDriverFeaturesSel, 2)
	e.w(virtio.RegDriverFeatures, 0) // word 2 of nothing: fine
	e.w(virtio.RegDriverFeatures, 1)
	if n := e.m.GuestErrors(); n != 3 {
		t.Errorf("GuestErrors = %d after a bit in feature word 2; want 3", n)
	}
	e.addStatus(virtio.StatusFeaturesOK) // features are still 0
	if s := e.r(virtio.RegStatus); s&virtio.StatusFeaturesOK != 0 {
		t.Errorf("FEATURES_OK stuck without VERSION_1 (the early writes were not ignored)")
	}
}

// walkStatus drives the status register through legal moves to the given
// driver status; FEATURES_OK is preceded by accepting VERSION_1.
func (e *menv) walkStatus(tb testing.TB, to uint32) {
	tb.Helper()
	for _, s := range []uint32{1, 3, 11, 15} {
		if s&^to != 0 {
			break
		}
		if s == 11 {
			e.writeFeatures(virtio.FeatureVersion1)
		}
		e.w(virtio.RegStatus, s)
	}
	if to&virtio.StatusFailed != 0 {
		e.addStatus(virtio.StatusFailed)
	}
	if got := e.r(virtio.RegStatus); got != to {
		tb.Fatalf("walked to %s; want %s", virtio.StatusString(got), virtio.StatusString(to))
	}
}

func TestMMIOIllegalStatusMoves(t *testing.T) {
	const (
		A  = virtio.StatusAcknowledge
		D  = virtio.StatusDriver
		F  = virtio.StatusFeaturesOK
		O  = virtio.StatusDriverOK
		NR = virtio.StatusNeedsReset
		X  = virtio.StatusFailed
	)
	tests := []struct{ from, to uint32 }{
		{0, D}, {0, A | D}, {0, F}, {0, O}, {0, A | D | F | O}, {0, 16}, {0, 32},
		{A, A | F}, {A, A | O}, {A, D}, {A, A | D | F}, {A, A | 16},
		{A | D, A}, {A | D, A | D | O}, {A | D, A | D | F | O},
		{A | D | F, A | D}, {A | D | F, A | F}, {A | D | F, A | D | F | 32},
		{A | D | F | O, A | D | F}, {A | D | F | O, A}, {A | D | F | O, 0xff &^ X},
		{A | X, A | D}, {A | D | F | O | X, A | D | F | O},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s->%s", virtio.StatusString(tt.from), virtio.StatusString(tt.to)), func(t *testing.T) {
			dev := newFakeDevice()
			e := newMEnv(t, dev)
			e.walkStatus(t, tt.from)
			acts, _, _ := dev.counts()
			raised := e.raised.Load()

			e.w(virtio.RegStatus, tt.to)
			if got, want := e.r(virtio.RegStatus), tt.from|NR; got != want {
				t.Errorf("status = %s; want %s", virtio.StatusString(got), virtio.StatusString(want))
			}
			if n := e.m.GuestErrors(); n != 1 {
				t.Errorf("GuestErrors = %d; want 1", n)
			}
			if got := e.r(virtio.RegInterruptStatus); got != virtio.IntConfigChange {
				t.Errorf("InterruptStatus = %#x; want the configuration-change bit", got)
			}
			if got := e.raised.Load(); got != raised+1 {
				t.Errorf("interrupt raised %d times; want once", got-raised)
			}
			if got, _, _ := dev.counts(); got != acts {
				t.Errorf("an illegal move activated the device")
			}

			// A second illegal move counts but does not interrupt again.
			e.w(virtio.RegStatus, tt.to)
			if n := e.m.GuestErrors(); n != 2 || e.raised.Load() != raised+1 {
				t.Errorf("second illegal move: GuestErrors %d, raised %d more; want 2, 1", n, e.raised.Load()-raised)
			}

			// Reset recovers.
			e.w(virtio.RegStatus, 0)
			if s, is := e.r(virtio.RegStatus), e.r(virtio.RegInterruptStatus); s != 0 || is != 0 {
				t.Errorf("after reset: status %s, InterruptStatus %#x; want 0, 0", virtio.StatusString(s), is)
			}
			e.walkStatus(t, A|D|F|O)
		})
	}
}

func TestMMIOFailed(t *testing.T) {
	for _, from := range []uint32{0, 1, 3, 11, 15} {
		t.Run(virtio.StatusString(from), func(t *testing.T) {
			dev := newFakeDevice()
			e := newMEnv(t, dev)
			e.walkStatus(t, from)
			e.w(virtio.RegStatus, from|virtio.StatusFailed)
			if got := e.r(virtio.RegStatus); got != from|virtio.StatusFailed {
				t.Errorf("status = %s; want %s|FAILED", virtio.StatusString(got), virtio.StatusString(from))
			}
			acts, resets, _ := dev.counts()
			if n := e.m.GuestErrors(); n != 0 || resets != 0 {
				t.Errorf("FAILED: GuestErrors %d, resets %d; want 0, 0", n, resets)
			}
			e.w(virtio.RegStatus, 0)
			if _, resets, _ := dev.counts(); resets != acts {
				t.Errorf("reset after FAILED: device resets %d; want %d", resets, acts)
			}
		})
	}
}

func TestMMIOReset(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	e.w(virtio.RegStatus, 0) // nothing active: the device is not reset
	if _, resets, _ := dev.counts(); resets != 0 {
		t.Fatalf("reset of an inactive transport reset the device")
	}
	a := e.start(t, allQueueFeatures, e.driverQueues(true, 256, 128, 64))
	a.Queues[0].Interrupt()
	a.Fail(errors.New("test"))
	e.w(virtio.RegQueueNotify, 2) // a kick the device never consumed
	e.w(virtio.RegDeviceFeaturesSel, 1)
	e.w(virtio.RegQueueSel, 2)

	e.w(virtio.RegStatus, 0)
	if _, resets, live := dev.counts(); resets != 1 || live != 0 {
		t.Fatalf("device resets = %d; want 1", resets)
	}
	type regs struct{ Status, IntStatus, Features, QueueSel0Ready uint32 }
	e.w(virtio.RegQueueSel, 0) // the driver selects again after reset
	got := regs{e.r(virtio.RegStatus), e.r(virtio.RegInterruptStatus), e.r(virtio.RegDeviceFeatures), e.r(virtio.RegQueueReady)}
	want := regs{0, 0, uint32(dev.features | allQueueFeatures), 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("registers after reset (-want +got):\n%s", diff)
	}
	for i := range dev.sizes {
		e.w(virtio.RegQueueSel, uint32(i))
		if r, n, max := e.r(virtio.RegQueueReady), e.r(virtio.RegQueueNum), e.r(virtio.RegQueueNumMax); r != 0 || n != 0 || max != uint32(dev.sizes[i]) {
			t.Errorf("queue %d after reset: ready %d num %d max %d", i, r, n, max)
		}
		if n, _ := e.m.KickFDs()[i].Wait(); n != 0 {
			t.Errorf("queue %d: stale kick survived the reset", i)
		}
	}
	// A second initialisation with other features and only queue 1.
	a = e.start(t, virtio.FeatureVersion1, e.driverQueues(false, 0, 16))
	if a.Features != virtio.FeatureVersion1 || a.Queues[0] != nil || a.Queues[1] == nil || a.Queues[2] != nil {
		t.Errorf("second activation: features %#x queues %v", a.Features, a.Queues)
	}
	if acts, resets, live := dev.counts(); acts != 2 || resets != 1 || live != 1 {
		t.Errorf("activations, resets, live = %d, %d, %d; want 2, 1, 1", acts, resets, live)
	}
	if err := e.m.Close(); err != nil { // Close resets an active device
		t.Fatal(err)
	}
	if _, resets, _ := dev.counts(); resets != 2 {
		t.Errorf("Close: device resets = %d; want 2", resets)
	}
}

func TestMMIOActivateError(t *testing.T) {
	dev := newFakeDevice()
	dev.activateErr = errors.New("no backend")
	e := newMEnv(t, dev)
	if !e.negotiate(virtio.FeatureVersion1) {
		t.Fatal("FEATURES_OK did not stick")
	}
	e.addStatus(virtio.StatusDriverOK)
	if got, want := e.r(virtio.RegStatus), uint32(11|virtio.StatusNeedsReset); got != want {
		t.Errorf("status = %s; want %s", virtio.StatusString(got), virtio.StatusString(want))
	}
	if n := e.m.GuestErrors(); n != 1 {
		t.Errorf("GuestErrors = %d; want 1", n)
	}
	e.w(virtio.RegStatus, 0)
	if _, resets, _ := dev.counts(); resets != 0 {
		t.Errorf("a device whose activation failed was reset %d times", resets)
	}
}

func TestMMIOInterrupts(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	a := e.start(t, allQueueFeatures, e.driverQueues(true, 8))
	steps := []struct {
		name string
		do   func()
		want uint32
	}{
		{"queue interrupt", func() { a.Queues[0].Interrupt() }, virtio.IntUsedBuffer},
		{"device failure", func() { a.Fail(errors.New("bad ring")) }, virtio.IntUsedBuffer | virtio.IntConfigChange},
		{"ACK nothing", func() { e.w(virtio.RegInterruptACK, 0) }, virtio.IntUsedBuffer | virtio.IntConfigChange},
		{"ACK used buffer", func() { e.w(virtio.RegInterruptACK, virtio.IntUsedBuffer) }, virtio.IntConfigChange},
		{"write InterruptStatus (read-only)", func() { e.w(virtio.RegInterruptStatus, 0) }, virtio.IntConfigChange},
		{"ACK all", func() { e.w(virtio.RegInterruptACK, ^uint32(0)) }, 0},
		{"interrupt again", func() { a.Queues[0].Interrupt() }, virtio.IntUsedBuffer},
	}
	var got, want []string
	for _, s := range steps {
		s.do()
		got = append(got, fmt.Sprintf("%s: %#x", s.name, e.r(virtio.RegInterruptStatus)))
		want = append(want, fmt.Sprintf("%s: %#x", s.name, s.want))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("InterruptStatus after each step (-want +got):\n%s", diff)
	}
	if n := e.raised.Load(); n != 3 {
		t.Errorf("raise called %d times; want 3 (two queue interrupts, one config change)", n)
	}
	if n := e.m.GuestErrors(); n != 2 {
		t.Errorf("GuestErrors = %d; want 2 (the failure and the read-only write)", n)
	}
	if s := e.r(virtio.RegStatus); s&virtio.StatusNeedsReset == 0 {
		t.Errorf("status after Fail = %s; want NEEDS_RESET", virtio.StatusString(s))
	}
}

func TestMMIOQueueNotify(t *testing.T) {
	e := newMEnv(t, newFakeDevice())
	for _, q := range []uint32{1, 1, 0, 1} {
		e.w(virtio.RegQueueNotify, q)
	}
	e.w(virtio.RegQueueNotify, 3)
	e.w(virtio.RegQueueNotify, 0xffffffff)
	var got []uint64
	for _, k := range e.m.KickFDs() {
		n, err := k.Wait() // non-blocking: 0 when nothing is pending
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	if diff := cmp.Diff([]uint64{1, 3, 0}, got); diff != "" {
		t.Errorf("kicks per queue (-want +got):\n%s", diff)
	}
	if n := e.m.GuestErrors(); n != 2 {
		t.Errorf("GuestErrors = %d; want 2 (notifies of queues 3 and 0xffffffff)", n)
	}
}

// TestMMIOBindKicks checks when the transport asks the VMM to route a
// queue's notifications (BindKicks): once per queue, at the first
// activation that hands it over, never for a queue the driver left unset
// or a device it never started, and a failed bind leaves the queue's kicks
// on the Write path.
func TestMMIOBindKicks(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	var bound []int
	e.m.BindKicks(func(q int, k *eventfd.EventFD) error {
		if k != e.m.KickFDs()[q] {
			t.Errorf("bind of queue %d with another queue's eventfd", q)
		}
		bound = append(bound, q)
		if q == 2 {
			return errors.New("no ioeventfd for you")
		}
		return nil
	})
	qs := e.driverQueues(true, 256, 64)
	if !e.negotiate(allQueueFeatures) {
		t.Fatal("FEATURES_OK did not stick")
	}
	for i, q := range qs {
		e.setupQueue(uint32(i), q.Cfg)
	}
	if len(bound) != 0 {
		t.Fatalf("queues %v bound before DRIVER_OK", bound)
	}
	e.addStatus(virtio.StatusDriverOK)
	if diff := cmp.Diff([]int{0, 1}, bound); diff != "" {
		t.Fatalf("bound after the first DRIVER_OK (-want +got):\n%s", diff)
	}
	// Reset and start again with queues 1 and 2: only 2 is new.
	e.w(virtio.RegStatus, 0)
	e.start(t, allQueueFeatures, e.driverQueues(true, 0, 64, 16))
	// And again: queue 2's bind failed, it is not tried again.
	e.w(virtio.RegStatus, 0)
	e.start(t, allQueueFeatures, e.driverQueues(true, 0, 64, 16))
	if diff := cmp.Diff([]int{0, 1, 2}, bound); diff != "" {
		t.Errorf("bound after three activations (-want +got):\n%s", diff)
	}
	e.w(virtio.RegQueueNotify, 2)
	if n, _ := e.m.KickFDs()[2].Wait(); n != 1 {
		t.Errorf("queue 2 (bind failed): %d kicks through Write; want 1", n)
	}
	if n := e.m.GuestErrors(); n != 0 {
		t.Errorf("GuestErrors = %d; a failed bind is the host's, not the guest's", n)
	}
}

// TestMMIORegisterWidths checks that register accesses other than aligned 4
// bytes are ignored (reads return zeros) and counted.
func TestMMIORegisterWidths(t *testing.T) {
	tests := []struct {
		name  string
		write bool
		off   uint64
		width int
	}{
		{"1-byte read of Magic", false, virtio.RegMagic, 1},
		{"2-byte read of Magic", false, virtio.RegMagic, 2},
		{"8-byte read of Magic", false, virtio.RegMagic, 8},
		{"0-byte read", false, virtio.RegMagic, 0},
		{"misaligned read", false, virtio.RegMagic + 2, 4},
		{"misaligned read of Status", false, virtio.RegStatus + 1, 4},
		{"1-byte Status write", true, virtio.RegStatus, 1},
		{"2-byte Status write", true, virtio.RegStatus, 2},
		{"8-byte Status write", true, virtio.RegStatus, 8},
		{"misaligned Status write", true, virtio.RegStatus + 2, 4},
		{"2-byte QueueNotify", true, virtio.RegQueueNotify, 2},
		{"misaligned QueueNotify", true, virtio.RegQueueNotify + 1, 4},
		{"1-byte InterruptACK", true, virtio.RegInterruptACK, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev := newFakeDevice()
			e := newMEnv(t, dev)
			e.w(virtio.RegStatus, virtio.StatusAcknowledge)
			p := make([]byte, tt.width)
			for i := range p {
				p[i] = 0xff
			}
			if tt.write {
				p[0] = 0 // a status write of 0 would reset
				e.m.Write(tt.off, p)
			} else {
				e.m.Read(tt.off, p)
				if diff := cmp.Diff(make([]byte, tt.width), p); diff != "" {
					t.Errorf("read returned data (-want +got):\n%s", diff)
				}
			}
			if n := e.m.GuestErrors(); n != 1 {
				t.Errorf("GuestErrors = %d; want 1", n)
			}
			if s := e.r(virtio.RegStatus); s != virtio.StatusAcknowledge {
				t.Errorf("status = %s; want ACKNOWLEDGE", virtio.StatusString(s))
			}
			for i, k := range e.m.KickFDs() {
				if n, _ := k.Wait(); n != 0 {
					t.Errorf("queue %d kicked by a bad access", i)
				}
			}
		})
	}
}

func TestMMIOConfigSpace(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	read := func(off uint64, n int) []byte {
		p := make([]byte, n)
		e.m.Read(virtio.RegConfig+off, p)
		return p
	}
	type rd struct {
		off  uint64
		n    int
		want []byte
	}
	reads := []rd{
		{0, 1, []byte{1}},
		{1, 2, []byte{2, 3}},
		{3, 4, []byte{4, 5, 6, 7}},
		{0, 8, []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		{6, 4, []byte{7, 8, 0, 0}},     // runs past the space
		{0x100, 4, []byte{0, 0, 0, 0}}, // beyond it
		{0xefc, 4, []byte{0, 0, 0, 0}}, // last word of the window
		{2, 3, []byte{3, 4, 5}},        // odd width: the device's business
	}
	var wantAccess []cfgAccess
	for _, r := range reads {
		if diff := cmp.Diff(r.want, read(r.off, r.n)); diff != "" {
			t.Errorf("config read at %#x+%d (-want +got):\n%s", r.off, r.n, diff)
		}
		wantAccess = append(wantAccess, cfgAccess{r.off, make([]byte, r.n)})
	}
	if diff := cmp.Diff(wantAccess, dev.cfgReads); diff != "" {
		t.Errorf("ReadConfig calls (-want +got):\n%s", diff)
	}

	e.m.Write(virtio.RegConfig+2, []byte{0xaa, 0xbb})
	e.m.Write(virtio.RegConfig+7, []byte{0xcc, 0xdd}) // half past the end
	want := []cfgAccess{{2, []byte{0xaa, 0xbb}}, {7, []byte{0xcc, 0xdd}}}
	if diff := cmp.Diff(want, dev.cfgWrites); diff != "" {
		t.Errorf("WriteConfig calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]byte{1, 2, 0xaa, 0xbb, 5, 6, 7, 0xcc}, read(0, 8)); diff != "" {
		t.Errorf("config after writes (-want +got):\n%s", diff)
	}
	if n := e.m.GuestErrors(); n != 0 {
		t.Errorf("config accesses counted %d guest errors", n)
	}
}

// TestMMIOStatusMovesExhaustive writes every byte value to the status
// register from every state of the initialisation path (3.1.1) and checks
// the outcome: reset, FAILED, no change, the one legal next step, or an
// illegal move that sets NEEDS_RESET. The NEEDS_RESET bit in a written value
// is ignored: drivers write status back read-modify-write.
func TestMMIOStatusMovesExhaustive(t *testing.T) {
	next := map[uint32]uint32{0: 1, 1: 3, 3: 11, 11: 15}
	for _, from := range []uint32{0, 1, 3, 11, 15} {
		for v := uint32(0); v < 256; v++ {
			dev := newFakeDevice()
			e := newMEnv(t, dev)
			e.walkStatus(t, from)
			if from == 3 {
				e.writeFeatures(virtio.FeatureVersion1)
			}
			e.w(virtio.RegStatus, v)
			want, wantErrs := from, uint64(0)
			m := v &^ virtio.StatusNeedsReset // the device's bit is ignored in writes
			switch {
			case v == 0:
				want = 0
			case m&virtio.StatusFailed != 0:
				want = from | virtio.StatusFailed
			case m == from:
			case next[from] == m && from != 15:
				want = m
			default:
				want, wantErrs = from|virtio.StatusNeedsReset, 1
			}
			got := e.r(virtio.RegStatus)
			if got != want || e.m.GuestErrors() != wantErrs {
				t.Errorf("%s, write %#x: status %s, %d guest errors; want %s, %d", virtio.StatusString(from), v,
					virtio.StatusString(got), e.m.GuestErrors(), virtio.StatusString(want), wantErrs)
			}
			acts, _, live := dev.counts()
			if wantActs := boolInt(from == 15 || want&virtio.StatusDriverOK != 0); acts != wantActs || live != boolInt(want&virtio.StatusDriverOK != 0) {
				t.Errorf("%s, write %#x: %d activations, %d live", virtio.StatusString(from), v, acts, live)
			}
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestMMIONeedsResetWrittenBack is the regression test for counting a
// driver's read-modify-write of status as an illegal move: Linux ORs new
// bits into what it read, so DEVICE_NEEDS_RESET comes back in the write.
func TestMMIONeedsResetWrittenBack(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	e.walkStatus(t, 3)
	e.m.Fail(virtio.ErrGuest)
	if n := e.m.GuestErrors(); n != 1 {
		t.Fatalf("GuestErrors = %d after Fail, want 1", n)
	}
	s := e.r(virtio.RegStatus)
	e.w(virtio.RegStatus, s|virtio.StatusFailed) // what virtio_add_status(FAILED) writes
	if n := e.m.GuestErrors(); n != 1 {
		t.Errorf("writing status back with NEEDS_RESET counted %d guest errors, want 1", n)
	}
	if got := e.r(virtio.RegStatus); got&virtio.StatusFailed == 0 || got&virtio.StatusNeedsReset == 0 {
		t.Errorf("status = %s, want FAILED and NEEDS_RESET", virtio.StatusString(got))
	}
}

// TestMMIOQueueNumMaxWhenReady: QueueNumMax reads the maximum for every
// existing queue, ready or not (0 means "no such queue").
func TestMMIOQueueNumMaxWhenReady(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	e.walkStatus(t, 15)
	e.w(virtio.RegQueueSel, 0)
	if got := e.r(virtio.RegQueueNumMax); got == 0 {
		t.Error("QueueNumMax of a ready queue reads 0")
	}
	e.w(virtio.RegQueueSel, 99)
	if got := e.r(virtio.RegQueueNumMax); got != 0 {
		t.Errorf("QueueNumMax of a missing queue = %d, want 0", got)
	}
}

// TestMMIOStaleFailAfterReset is the regression test for a Fail from a
// previous activation (a device goroutine that outlived Reset) flagging the
// next driver initialisation with NEEDS_RESET.
func TestMMIOStaleFailAfterReset(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	e.walkStatus(t, 15)
	dev.mu.Lock()
	stale := dev.activations[0].Fail
	dev.mu.Unlock()
	e.w(virtio.RegStatus, 0)
	e.walkStatus(t, 15)
	stale(virtio.ErrGuest)
	if s := e.r(virtio.RegStatus); s&virtio.StatusNeedsReset != 0 {
		t.Fatalf("a Fail from the previous activation set NEEDS_RESET: status %s", virtio.StatusString(s))
	}
	dev.mu.Lock()
	cur := dev.activations[len(dev.activations)-1].Fail
	dev.mu.Unlock()
	cur(virtio.ErrGuest)
	if s := e.r(virtio.RegStatus); s&virtio.StatusNeedsReset == 0 {
		t.Fatalf("the current activation's Fail did not set NEEDS_RESET: status %s", virtio.StatusString(s))
	}
}

// TestMMIOStats: each kind of guest error lands in its own counter, the
// interrupts are counted by kind, and activations and driver resets too.
func TestMMIOStats(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	// register: a 2-byte read, a write to a read-only register, a notify
	// of a queue that does not exist.
	e.m.Read(virtio.RegMagic, make([]byte, 2))
	e.w(virtio.RegDeviceID, 1)
	e.w(virtio.RegQueueNotify, 7)
	// features: written before DRIVER.
	e.addStatus(virtio.StatusAcknowledge)
	e.w(virtio.RegDriverFeatures, 1)
	// status: an illegal move (ACKNOWLEDGE -> ACKNOWLEDGE|DRIVER_OK), then
	// the driver resets.
	e.w(virtio.RegStatus, virtio.StatusAcknowledge|virtio.StatusDriverOK)
	e.w(virtio.RegStatus, 0)
	// queue: configured before FEATURES_OK.
	e.addStatus(virtio.StatusAcknowledge)
	e.addStatus(virtio.StatusDriver)
	e.w(virtio.RegQueueSel, 0)
	e.w(virtio.RegQueueNum, 8)
	e.w(virtio.RegStatus, 0)
	// A clean start, two used-buffer interrupts, then the device fails.
	a := e.start(t, allQueueFeatures, e.driverQueues(true, 8))
	a.Queues[0].Interrupt()
	a.Queues[0].Interrupt()
	a.Fail(errors.New("bad ring"))
	e.w(virtio.RegQueueNotify, 0)
	e.w(virtio.RegQueueNotify, 0)

	var want virtio.TransportStats
	want.GuestErrors[virtio.GuestErrRegister] = 3
	want.GuestErrors[virtio.GuestErrFeatures] = 1
	want.GuestErrors[virtio.GuestErrStatus] = 1
	want.GuestErrors[virtio.GuestErrQueue] = 1
	want.GuestErrors[virtio.GuestErrDevice] = 1
	want.UsedBufferInterrupts = 2
	want.ConfigInterrupts = 2 // the illegal move and the failure
	want.Activations = 1
	want.DriverResets = 3 // two above, one in start
	want.NotifyExits = 2  // the register notifies below, before Stats
	if diff := cmp.Diff(want, e.m.Stats()); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	if got := e.m.GuestErrors(); got != 7 {
		t.Errorf("GuestErrors = %d, want the sum of the kinds, 7", got)
	}
	var names []string
	for _, k := range virtio.TransportGuestErrorKinds {
		names = append(names, k.String())
	}
	if diff := cmp.Diff([]string{"register", "features", "queue", "status", "device"}, names); diff != "" {
		t.Errorf("kind names (-want +got):\n%s", diff)
	}
}
