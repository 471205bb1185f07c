package virtio_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

type chainShape struct {
	Readable, Writable []int
	RLen, WLen         uint64
}

func shapeOf(c *virtio.Chain) chainShape {
	return chainShape{lens(c.Readable()), lens(c.Writable()), c.ReadableLen(), c.WritableLen()}
}

type bufSpec struct {
	n        uint32
	writable bool
}

func TestPopPushRoundTrip(t *testing.T) {
	r := func(n uint32) bufSpec { return bufSpec{n, false} }
	w := func(n uint32) bufSpec { return bufSpec{n, true} }
	tests := []struct {
		name     string
		bufs     []bufSpec
		indirect bool
		want     chainShape
	}{
		{"one readable", []bufSpec{r(64)}, false, chainShape{[]int{64}, nil, 64, 0}},
		{"one writable", []bufSpec{w(64)}, false, chainShape{nil, []int{64}, 0, 64}},
		{"header payload status", []bufSpec{r(16), r(100), w(1)}, false, chainShape{[]int{16, 100}, []int{1}, 116, 1}},
		{"zero-length parts skipped", []bufSpec{r(0), r(8), w(0), w(4)}, false, chainShape{[]int{8}, []int{4}, 8, 4}},
		{"all zero-length", []bufSpec{r(0), w(0)}, false, chainShape{nil, nil, 0, 0}},
		{"eight descriptors", []bufSpec{r(1), r(2), r(3), r(4), w(5), w(6), w(7), w(8)}, false,
			chainShape{[]int{1, 2, 3, 4}, []int{5, 6, 7, 8}, 10, 26}},
		{"indirect split", []bufSpec{r(16), r(32), w(64)}, true, chainShape{[]int{16, 32}, []int{64}, 48, 64}},
		{"indirect one writable", []bufSpec{w(4096)}, true, chainShape{nil, []int{4096}, 0, 4096}},
		{"indirect longer than the queue", []bufSpec{r(1), r(1), r(1), r(1), r(1), r(1), r(1), r(1), r(1), w(1)}, true,
			chainShape{[]int{1, 1, 1, 1, 1, 1, 1, 1, 1}, []int{1}, 9, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newQEnv(t, qopts{size: 8, indirect: tt.indirect})
			var bufs []virtiotest.Buf
			var wantRead []byte
			for i, s := range tt.bufs {
				b := e.buf(s.n, s.writable, byte(16*i))
				bufs = append(bufs, b)
				if !s.writable {
					p := make([]byte, s.n)
					if err := e.mem.Read(b.Addr, p); err != nil {
						t.Fatal(err)
					}
					wantRead = append(wantRead, p...)
				}
			}
			var head uint16
			var ok bool
			if tt.indirect {
				head, ok = e.drv.AddIndirect(bufs...)
			} else {
				head, ok = e.drv.Add(bufs...)
			}
			if !ok {
				t.Fatal("driver could not add the chain")
			}
			c := e.pop(t)
			if c.Head != head {
				t.Errorf("Head = %d; want %d", c.Head, head)
			}
			if diff := cmp.Diff(tt.want, shapeOf(c)); diff != "" {
				t.Errorf("chain shape (-want +got):\n%s", diff)
			}
			got := make([]byte, c.ReadableLen())
			virtio.CopyFrom(c.Readable(), 0, got)
			if !bytes.Equal(got, wantRead) {
				t.Errorf("readable bytes = %x; want %x", got, wantRead)
			}
			// The device fills the writable part; the driver sees it in
			// its buffers.
			fill := bytes.Repeat([]byte{0xa5}, int(c.WritableLen()))
			if n := virtio.CopyTo(c.Writable(), 0, fill); n != len(fill) {
				t.Errorf("CopyTo wrote %d bytes; want %d", n, len(fill))
			}
			var seen []byte
			for _, b := range bufs {
				if b.Writable {
					p := make([]byte, b.Len)
					if err := e.mem.Read(b.Addr, p); err != nil {
						t.Fatal(err)
					}
					seen = append(seen, p...)
				}
			}
			if !bytes.Equal(seen, fill) {
				t.Errorf("driver sees %x in its writable buffers; want %x", seen, fill)
			}
			written := uint32(c.WritableLen())
			if err := e.dev.Push(head, written); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]virtiotest.Used{{ID: head, Len: written}}, e.drv.Reap()); diff != "" {
				t.Errorf("used entries (-want +got):\n%s", diff)
			}
			if ok, err := e.dev.Pop(&e.c); ok || err != nil {
				t.Errorf("second Pop = %v, %v; want false, nil", ok, err)
			}
			pops, pushes, _ := e.dev.Stats()
			if pops != 1 || pushes != 1 {
				t.Errorf("Stats pops, pushes = %d, %d; want 1, 1", pops, pushes)
			}
		})
	}
}

// TestRingWraparound runs more than 65536 chains through small queues so
// that both the free-running 16-bit indices and the ring slots wrap, in
// batches that do not divide the queue size.
func TestRingWraparound(t *testing.T) {
	for _, tt := range []struct {
		size     uint16
		batch    int
		eventIdx bool
	}{
		{1, 1, false},
		{4, 1, false},
		{4, 3, true},
		{8, 5, false},
		{16, 16, true},
	} {
		t.Run(fmt.Sprintf("size=%d/batch=%d/eventidx=%v", tt.size, tt.batch, tt.eventIdx), func(t *testing.T) {
			e := newQEnv(t, qopts{size: tt.size, eventIdx: tt.eventIdx})
			b := e.buf(8, true, 0)
			const total = 70000
			done := 0
			var heads []uint16
			for done < total {
				heads = heads[:0]
				for i := 0; i < tt.batch; i++ {
					h, ok := e.drv.Add(b)
					if !ok {
						t.Fatalf("op %d: driver has no free descriptor", done)
					}
					heads = append(heads, h)
				}
				for i, h := range heads {
					c := e.pop(t)
					if c.Head != h {
						t.Fatalf("op %d: popped head %d; want %d", done+i, c.Head, h)
					}
					if err := e.dev.Push(c.Head, uint32(done+i)); err != nil {
						t.Fatal(err)
					}
				}
				used := e.drv.Reap()
				if len(used) != len(heads) {
					t.Fatalf("op %d: reaped %d entries; want %d", done, len(used), len(heads))
				}
				for i, u := range used {
					if want := (virtiotest.Used{ID: heads[i], Len: uint32(done + i)}); u != want {
						t.Fatalf("op %d: used %+v; want %+v", done+i, u, want)
					}
				}
				done += len(heads)
			}
			if got, want := e.dev.LastAvail(), uint16(done); got != want {
				t.Errorf("LastAvail = %d; want %d", got, want)
			}
			used, err := e.mem.Read16(e.drv.Cfg.Used + 2)
			if err != nil || used != uint16(done) {
				t.Errorf("used->idx = %d, %v; want %d", used, err, uint16(done))
			}
		})
	}
}

// TestAvailIndexAhead checks how far the driver's available index may run
// ahead of the device (at most the queue size, 2.7.13).
func TestAvailIndexAhead(t *testing.T) {
	const size = 8
	tests := []struct {
		name    string
		ahead   uint16
		want    bool
		wantErr bool
	}{
		{"none", 0, false, false},
		{"one", 1, true, false},
		{"queue size", size, true, false},
		{"queue size plus one", size + 1, false, true},
		{"half the index space", 0x8000, false, true},
		{"behind by one", 0xffff, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newQEnv(t, qopts{size: size})
			b := e.buf(8, false, 0)
			for i := 0; i < size; i++ {
				e.drv.Add(b) // fill every ring slot with a valid head
			}
			// Move the device to 100 so that "behind" does not start at 0.
			if err := e.dev.SetIndices(100); err != nil {
				t.Fatal(err)
			}
			e.drv.SetAvailIdx(100 + tt.ahead)
			got, err := e.dev.HasAvailable()
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("HasAvailable = %v, %v; want %v, error %v", got, err, tt.want, tt.wantErr)
			}
			ok, err := e.dev.Pop(&e.c)
			if ok != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("Pop = %v, %v; want %v, error %v", ok, err, tt.want, tt.wantErr)
			}
			if tt.wantErr {
				wantGuestErr(t, "HasAvailable", err)
				if e.dev.LastAvail() != 100 {
					t.Errorf("LastAvail moved to %d after an error", e.dev.LastAvail())
				}
			}
		})
	}
}

func TestHasAvailableAndUndo(t *testing.T) {
	e := newQEnv(t, qopts{size: 4})
	if ok, err := e.dev.HasAvailable(); ok || err != nil {
		t.Fatalf("empty queue: HasAvailable = %v, %v", ok, err)
	}
	b := e.buf(8, false, 0)
	h1, _ := e.drv.Add(b)
	h2, _ := e.drv.Add(b)
	if ok, err := e.dev.HasAvailable(); !ok || err != nil {
		t.Fatalf("HasAvailable = %v, %v; want true", ok, err)
	}
	if c := e.pop(t); c.Head != h1 {
		t.Fatalf("first Pop head %d; want %d", c.Head, h1)
	}
	e.dev.Undo()
	if e.dev.LastAvail() != 0 {
		t.Errorf("LastAvail after Undo = %d; want 0", e.dev.LastAvail())
	}
	for _, want := range []uint16{h1, h2} {
		if c := e.pop(t); c.Head != want {
			t.Errorf("Pop head %d; want %d", c.Head, want)
		}
	}
	if ok, err := e.dev.HasAvailable(); ok || err != nil {
		t.Errorf("drained queue: HasAvailable = %v, %v", ok, err)
	}
}

// TestUndoAcrossWrap undoes a pop whose index wrapped from 0xffff to 0.
func TestUndoAcrossWrap(t *testing.T) {
	e := newQEnv(t, qopts{size: 4})
	b := e.buf(8, false, 0)
	e.drv.SetAvailIdx(0xffff)
	if err := e.dev.SetIndices(0xffff); err != nil {
		t.Fatal(err)
	}
	h, _ := e.drv.Add(b)
	e.pop(t)
	if e.dev.LastAvail() != 0 {
		t.Fatalf("LastAvail = %d; want 0 after the wrap", e.dev.LastAvail())
	}
	e.dev.Undo()
	if e.dev.LastAvail() != 0xffff {
		t.Fatalf("LastAvail after Undo = %#x; want 0xffff", e.dev.LastAvail())
	}
	if c := e.pop(t); c.Head != h {
		t.Errorf("re-popped head %d; want %d", c.Head, h)
	}
}

// TestSetIndicesRestore hands a queue from one device-side owner to another
// the way vhost-user GET_VRING_BASE/SET_VRING_BASE does.
func TestSetIndicesRestore(t *testing.T) {
	e := newQEnv(t, qopts{size: 8})
	b := e.buf(8, true, 0)
	var heads []uint16
	for i := 0; i < 5; i++ {
		h, _ := e.drv.Add(b)
		heads = append(heads, h)
	}
	for i := 0; i < 3; i++ {
		c := e.pop(t)
		if err := e.dev.Push(c.Head, 1); err != nil {
			t.Fatal(err)
		}
	}
	base := e.dev.LastAvail()
	if base != 3 {
		t.Fatalf("LastAvail = %d; want 3", base)
	}

	next := virtio.NewQueue(e.mem.Memory, e.drv.Cfg, false, false)
	if err := next.SetIndices(base); err != nil {
		t.Fatal(err)
	}
	if next.LastAvail() != base {
		t.Errorf("restored LastAvail = %d; want %d", next.LastAvail(), base)
	}
	var c virtio.Chain
	for _, want := range heads[3:] {
		ok, err := next.Pop(&c)
		if !ok || err != nil || c.Head != want {
			t.Fatalf("restored Pop = %v, %v head %d; want head %d", ok, err, c.Head, want)
		}
		if err := next.Push(c.Head, 2); err != nil {
			t.Fatal(err)
		}
	}
	var want []virtiotest.Used
	for i, h := range heads {
		want = append(want, virtiotest.Used{ID: h, Len: uint32(1 + i/3)})
	}
	if diff := cmp.Diff(want, e.drv.Reap()); diff != "" {
		t.Errorf("used entries across the handover (-want +got):\n%s", diff)
	}
}

func TestSetIndicesUsedRingOutsideMemory(t *testing.T) {
	e := newQEnv(t, qopts{size: 8})
	cfg := e.drv.Cfg
	cfg.Used = 1 << 40
	q := virtio.NewQueue(e.mem.Memory, cfg, false, false)
	wantGuestErr(t, "SetIndices", q.SetIndices(0))
}

// TestPushNoPublishBatch checks that used entries stay invisible to the
// driver until Publish stores the used index.
func TestPushNoPublishBatch(t *testing.T) {
	e := newQEnv(t, qopts{size: 8})
	b := e.buf(8, true, 0)
	var want []virtiotest.Used
	for i := 0; i < 3; i++ {
		h, _ := e.drv.Add(b)
		want = append(want, virtiotest.Used{ID: h, Len: uint32(10 + i)})
	}
	for i := range want {
		c := e.pop(t)
		if err := e.dev.PushNoPublish(c.Head, want[i].Len); err != nil {
			t.Fatal(err)
		}
		if got := e.drv.Reap(); len(got) != 0 {
			t.Fatalf("after PushNoPublish %d the driver reaped %v", i, got)
		}
	}
	if err := e.dev.Publish(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, e.drv.Reap()); diff != "" {
		t.Errorf("after Publish (-want +got):\n%s", diff)
	}
	if err := e.dev.Publish(); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.Reap(); len(got) != 0 {
		t.Errorf("a second Publish showed %v", got)
	}
}

func TestPushHeadOutOfRangePanics(t *testing.T) {
	e := newQEnv(t, qopts{size: 8})
	defer func() {
		if recover() == nil {
			t.Error("Push of head 8 on a queue of 8 did not panic (a device bug must not pass silently)")
		}
	}()
	_ = e.dev.Push(8, 0)
}

// TestPopPushDoesNotAllocate asserts the hot path is allocation-free once
// the chain's storage has grown.
func TestPopPushDoesNotAllocate(t *testing.T) {
	for _, tt := range []struct {
		name     string
		eventIdx bool
		indirect bool
	}{{"plain", false, false}, {"eventidx", true, false}, {"indirect", false, true}} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(t, 64, 4, tt.eventIdx, tt.indirect)
			r.step(t) // warm up: grow the chain's slices
			if n := testing.AllocsPerRun(1000, func() { r.step(t) }); n != 0 {
				t.Errorf("Pop+Push+NeedsNotification allocates %v times per chain; want 0", n)
			}
		})
	}
}

// NotifyAfter makes the driver kick on its next buffer even while the
// device still holds unconsumed ones (which EnableNotification, set at
// the device's own position, would not), with and without EVENT_IDX.
func TestNotifyAfter(t *testing.T) {
	for _, eventIdx := range []bool{false, true} {
		t.Run(fmt.Sprintf("eventidx=%v", eventIdx), func(t *testing.T) {
			e := newQEnv(t, qopts{size: 8, eventIdx: eventIdx})
			b := e.buf(4, true, 0)
			for range 3 {
				e.drv.Add(b)
			}
			e.pop(t) // two left unconsumed
			if err := e.dev.DisableNotification(); err != nil {
				t.Fatal(err)
			}
			idx, err := e.dev.AvailIdx()
			if err != nil || idx != 3 {
				t.Fatalf("AvailIdx = %d, %v; want 3", idx, err)
			}
			if err := e.dev.NotifyAfter(idx); err != nil {
				t.Fatal(err)
			}
			old := e.drv.AvailIdx()
			e.drv.Add(b)
			if !e.drv.NeedsKick(old) {
				t.Error("no kick for the buffer after the watched index")
			}
		})
	}
}
