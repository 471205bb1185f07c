package virtiotest_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

func TestAllocAlignment(t *testing.T) {
	m := virtiotest.NewMemory(t, 1<<16)
	prev := uint64(0)
	for _, a := range []struct{ n, align uint64 }{{1, 1}, {3, 16}, {5, 2}, {7, 4096}, {0, 8}} {
		got := m.Alloc(a.n, a.align)
		if got%a.align != 0 || got < 4096 || got < prev {
			t.Errorf("Alloc(%d, %d) = %#x: misaligned, in page 0 or overlapping", a.n, a.align, got)
		}
		prev = got + a.n
	}
	defer func() {
		if recover() == nil {
			t.Error("Alloc past the end of memory did not panic")
		}
	}()
	m.Alloc(1<<16, 1)
}

// TestFreeListAccounting checks that the driver hands out and takes back
// exactly the descriptors of each chain, direct or indirect.
func TestFreeListAccounting(t *testing.T) {
	m := virtiotest.NewMemory(t, 1<<20)
	q := virtiotest.NewQueue(m, 8, true)
	dev := virtio.NewQueue(m.Memory, q.Cfg, true, true)
	buf := func(w bool) virtiotest.Buf { return virtiotest.Buf{Addr: m.Alloc(16, 8), Len: 16, Writable: w} }

	h1, ok1 := q.Add(buf(false), buf(false), buf(true))
	h2, ok2 := q.Add(buf(true), buf(true))
	h3, ok3 := q.AddIndirect(buf(false), buf(true), buf(true), buf(true))
	if !ok1 || !ok2 || !ok3 || q.Free() != 2 {
		t.Fatalf("Add results %v %v %v, %d free; want all ok and 2 free", ok1, ok2, ok3, q.Free())
	}
	if _, ok := q.Add(buf(false), buf(false), buf(false)); ok {
		t.Error("Add of 3 descriptors with 2 free succeeded")
	}
	if _, ok := q.Add(); ok {
		t.Error("Add of no buffers succeeded")
	}
	if q.AvailIdx() != 3 {
		t.Errorf("AvailIdx = %d; want 3", q.AvailIdx())
	}
	type shape struct{ R, W int }
	var got []shape
	var c virtio.Chain
	for {
		ok, err := dev.Pop(&c)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, shape{len(c.Readable()), len(c.Writable())})
		if err := dev.Push(c.Head, uint32(c.WritableLen())); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]shape{{2, 1}, {0, 2}, {1, 3}}, got); diff != "" {
		t.Errorf("chains as the device sees them (-want +got):\n%s", diff)
	}
	want := []virtiotest.Used{{ID: h1, Len: 16}, {ID: h2, Len: 32}, {ID: h3, Len: 48}}
	if diff := cmp.Diff(want, q.Reap()); diff != "" {
		t.Errorf("Reap (-want +got):\n%s", diff)
	}
	if q.Free() != 8 {
		t.Errorf("%d descriptors free after reaping everything; want 8", q.Free())
	}
	// Reap with EVENT_IDX asks for an interrupt at the next entry.
	ev, err := m.Read16(q.Cfg.Avail + 4 + 2*8)
	if err != nil || ev != 3 {
		t.Errorf("used_event = %d, %v; want 3", ev, err)
	}
}
