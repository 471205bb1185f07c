package virtio_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// TestMMIOInspect: an inspection reads each ready ring's indices and event
// fields from guest memory as the driver and the device left them, and the
// interrupt bits the driver has not acknowledged; a queue that is not ready
// is not listed, and nothing is listed once the driver resets the device.
func TestMMIOInspect(t *testing.T) {
	dev := newFakeDevice()
	e := newMEnv(t, dev)
	if s := e.m.Inspect(); s.Active || len(s.Rings) != 0 || s.Status != 0 {
		t.Fatalf("before the driver: %+v", s)
	}
	qs := e.driverQueues(true, 8, 0)
	a := e.start(t, allQueueFeatures, qs)

	// Driver: three buffers posted on queue 0, used_event 2. Device: one
	// popped and returned, avail_event 1, an interrupt raised.
	for i := range 3 {
		qs[0].Add(virtiotest.Buf{Addr: 0x8000 + uint64(i)*64, Len: 64})
	}
	qs[0].SetUsedEvent(2)
	q := a.Queues[0]
	var c virtio.Chain
	if ok, err := q.Pop(&c); !ok || err != nil {
		t.Fatalf("pop: %v %v", ok, err)
	}
	if err := q.Push(c.Head, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := q.EnableNotification(); err != nil {
		t.Fatal(err)
	}
	q.Interrupt()

	s := e.m.Inspect()
	want := []virtio.RingState{{Queue: 0, Size: 8, AvailIdx: 3, UsedIdx: 1, UsedEvent: 2, AvailEvent: 1}}
	if diff := cmp.Diff(want, s.Rings); diff != "" || s.Err != nil {
		t.Errorf("rings (-want +got):\n%s (err %v)", diff, s.Err)
	}
	if !s.Active || s.Status != 15 || s.InterruptStatus != virtio.IntUsedBuffer {
		t.Errorf("status %#x interrupt status %#x active %v; want 0xf, %#x, true", s.Status, s.InterruptStatus, s.Active, virtio.IntUsedBuffer)
	}
	if str := s.String(); !strings.Contains(str, "q0 size=8 avail=3 used=1 outstanding=2 ") {
		t.Errorf("String: %s", str)
	}

	e.w(virtio.RegInterruptACK, virtio.IntUsedBuffer)
	e.w(virtio.RegStatus, 0)
	if s := e.m.Inspect(); s.Active || len(s.Rings) != 0 || s.InterruptStatus != 0 {
		t.Errorf("after the driver's reset: %+v", s)
	}
}
