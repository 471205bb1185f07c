package virtio_test

import "testing"

// TestWalkReadableAfterEmptyWritable: the walker decided "after a writable
// descriptor" by whether it had collected a writable buffer, and it collects
// none for a zero-length descriptor, so a readable buffer after an empty
// writable descriptor was accepted, against 2.7.4.2 and the walker's own doc.
func TestWalkReadableAfterEmptyWritable(t *testing.T) {
	for _, indirect := range []bool{false, true} {
		e := newQEnv(t, qopts{size: 8, indirect: indirect})
		data := e.mem.Alloc(64, 16)
		tb := e.drv.Cfg.Desc
		if indirect {
			tb = e.table(3)
			e.desc(0, tb, 48, fI, 0)
		}
		e.drv.WriteDesc(tb, 0, data, 8, fN, 1)
		e.drv.WriteDesc(tb, 1, data, 0, fW|fN, 2)
		e.drv.WriteDesc(tb, 2, data, 16, 0, 0)
		e.drv.PublishHead(0)
		ok, err := e.dev.Pop(&e.c)
		if ok {
			t.Errorf("indirect=%v: accepted a readable buffer after an empty writable one: %+v", indirect, shapeOf(&e.c))
		}
		wantGuestErr(t, "Pop", err)
	}
}
