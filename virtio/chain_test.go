package virtio_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/virtio"
)

// Descriptor flags, spelled out for crafted tables.
const (
	fN = 1 // NEXT
	fW = 2 // WRITE
	fI = 4 // INDIRECT
)

const walkMem = 1 << 20

// walkCase crafts descriptors by hand; build returns the head to publish.
type walkCase struct {
	name     string
	indirect bool // VIRTIO_F_INDIRECT_DESC negotiated
	build    func(e *qenv, data uint64) uint16
}

// desc writes descriptor i of the queue's own table.
func (e *qenv) desc(i uint16, addr uint64, n uint32, flags, next uint16) {
	e.drv.WriteDesc(e.drv.Cfg.Desc, i, addr, n, flags, next)
}

// table allocates an indirect table of n entries.
func (e *qenv) table(n int) uint64 { return e.mem.Alloc(16*uint64(n), 16) }

func TestWalkRejects(t *testing.T) {
	const size = 8
	tests := []walkCase{
		{"head equals size", false, func(e *qenv, data uint64) uint16 { return size }},
		{"head 0xffff", false, func(e *qenv, data uint64) uint16 { return 0xffff }},
		{"next equals size", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 16, fN, size)
			return 0
		}},
		{"next 0xffff", false, func(e *qenv, data uint64) uint16 {
			e.desc(3, data, 16, fN, 0xffff)
			return 3
		}},
		{"self loop", false, func(e *qenv, data uint64) uint16 {
			e.desc(2, data, 16, fN, 2)
			return 2
		}},
		{"loop a b a", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 16, fN, 1)
			e.desc(1, data, 16, fN, 0)
			return 0
		}},
		{"chain longer than the table", false, func(e *qenv, data uint64) uint16 {
			for i := uint16(0); i < size; i++ {
				e.desc(i, data, 16, fN, (i+1)%size)
			}
			return 0
		}},
		{"loop of writable zero-length descriptors", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, 0, 0, fW|fN, 1)
			e.desc(1, 0, 0, fW|fN, 0)
			return 0
		}},
		{"unknown flag 8", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 16, 8, 0)
			return 0
		}},
		{"unknown flag 0x8000 on a later descriptor", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 16, fN, 1)
			e.desc(1, data, 16, 0x8000|fW, 0)
			return 0
		}},
		{"indirect without the feature", false, func(e *qenv, data uint64) uint16 {
			tb := e.table(1)
			e.drv.WriteDesc(tb, 0, data, 16, 0, 0)
			e.desc(0, tb, 16, fI, 0)
			return 0
		}},
		{"nested indirect", true, func(e *qenv, data uint64) uint16 {
			inner, outer := e.table(1), e.table(1)
			e.drv.WriteDesc(inner, 0, data, 16, 0, 0)
			e.drv.WriteDesc(outer, 0, inner, 16, fI, 0)
			e.desc(0, outer, 16, fI, 0)
			return 0
		}},
		{"indirect with NEXT", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(1)
			e.drv.WriteDesc(tb, 0, data, 16, 0, 0)
			e.desc(0, tb, 16, fI|fN, 1)
			e.desc(1, data, 16, fW, 0)
			return 0
		}},
		{"indirect table of 0 bytes", true, func(e *qenv, data uint64) uint16 {
			e.desc(0, e.table(1), 0, fI, 0)
			return 0
		}},
		{"indirect table of 8 bytes", true, func(e *qenv, data uint64) uint16 {
			e.desc(0, e.table(1), 8, fI, 0)
			return 0
		}},
		{"indirect table of 24 bytes", true, func(e *qenv, data uint64) uint16 {
			e.desc(0, e.table(2), 24, fI, 0)
			return 0
		}},
		{"indirect table of 32769 entries", true, func(e *qenv, data uint64) uint16 {
			e.desc(0, 0x1000, 16*32769, fI, 0)
			return 0
		}},
		{"indirect table past the end of memory", true, func(e *qenv, data uint64) uint16 {
			e.desc(0, walkMem-16, 32, fI, 0)
			return 0
		}},
		{"indirect table outside memory", true, func(e *qenv, data uint64) uint16 {
			e.desc(0, 1<<40, 16, fI, 0)
			return 0
		}},
		{"indirect table wraps the address space", true, func(e *qenv, data uint64) uint16 {
			e.desc(0, ^uint64(0)&^15, 32, fI, 0)
			return 0
		}},
		{"indirect next outside its table", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(2)
			e.drv.WriteDesc(tb, 0, data, 16, fN, 2) // the queue has 8, the table 2
			e.drv.WriteDesc(tb, 1, data, 16, 0, 0)
			e.desc(0, tb, 32, fI, 0)
			return 0
		}},
		{"indirect loop", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(2)
			e.drv.WriteDesc(tb, 0, data, 16, fN, 1)
			e.drv.WriteDesc(tb, 1, data, 16, fN, 0)
			e.desc(0, tb, 32, fI, 0)
			return 0
		}},
		{"unknown flag in an indirect table", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(1)
			e.drv.WriteDesc(tb, 0, data, 16, 16, 0)
			e.desc(0, tb, 16, fI, 0)
			return 0
		}},
		{"buffer outside memory", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, walkMem, 1, 0, 0)
			return 0
		}},
		{"buffer across the end of memory", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, walkMem-1, 2, fW, 0)
			return 0
		}},
		{"buffer longer than memory", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 0xffffffff, 0, 0)
			return 0
		}},
		{"buffer wraps the address space", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, ^uint64(0), 2, 0, 0)
			return 0
		}},
		{"second buffer outside memory", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 16, fN, 1)
			e.desc(1, ^uint64(0)-7, 8, fW, 0)
			return 0
		}},
		{"buffer in an indirect table outside memory", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(1)
			e.drv.WriteDesc(tb, 0, 1<<40, 16, fW, 0)
			e.desc(0, tb, 16, fI, 0)
			return 0
		}},
		{"readable after writable", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 16, fW|fN, 1)
			e.desc(1, data, 16, 0, 0)
			return 0
		}},
		{"zero-length readable after writable", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 16, fW|fN, 1)
			e.desc(1, data, 0, fN, 2)
			e.desc(2, data, 16, fW, 0)
			return 0
		}},
		{"readable after writable in an indirect table", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(3)
			e.drv.WriteDesc(tb, 0, data, 16, fN, 1)
			e.drv.WriteDesc(tb, 1, data, 16, fW|fN, 2)
			e.drv.WriteDesc(tb, 2, data, 16, 0, 0)
			e.desc(0, tb, 48, fI, 0)
			return 0
		}},
		{"readable indirect after a writable direct descriptor", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(1)
			e.drv.WriteDesc(tb, 0, data, 16, 0, 0)
			e.desc(0, data, 16, fW|fN, 1)
			e.desc(1, tb, 16, fI, 0)
			return 0
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newQEnv(t, qopts{size: size, memSize: walkMem, indirect: tt.indirect})
			data := e.mem.Alloc(4096, 16)
			head := tt.build(e, data)
			e.drv.PublishHead(head)
			ok, err := e.dev.Pop(&e.c)
			if ok {
				t.Fatalf("Pop accepted the chain: %+v", shapeOf(&e.c))
			}
			wantGuestErr(t, "Pop", err)
			if e.dev.LastAvail() != 0 {
				t.Errorf("LastAvail = %d after a rejected chain; want 0", e.dev.LastAvail())
			}
		})
	}
}

func TestWalkAccepts(t *testing.T) {
	tests := []struct {
		walkCase
		size    uint16
		memSize uint64
		want    chainShape
	}{
		{walkCase{"zero-length descriptors anywhere in the chain", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 0, fN, 1)
			e.desc(1, data, 4, fN, 2)
			e.desc(2, data, 0, fN, 3)
			e.desc(3, data, 0, fW|fN, 4)
			e.desc(4, data, 8, fW|fN, 5)
			e.desc(5, data, 0, fW, 0)
			return 0
		}}, 8, 0, chainShape{[]int{4}, []int{8}, 4, 8}},
		{walkCase{"buffer ending at the end of memory", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, walkMem-16, 16, fW, 0)
			return 0
		}}, 8, 0, chainShape{nil, []int{16}, 0, 16}},
		{walkCase{"buffers overlapping each other", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 64, fN, 1)
			e.desc(1, data+32, 64, fW, 0)
			return 0
		}}, 8, 0, chainShape{[]int{64}, []int{64}, 64, 64}},
		{walkCase{"WRITE on the indirect descriptor is ignored", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(2)
			e.drv.WriteDesc(tb, 0, data, 16, fN, 1)
			e.drv.WriteDesc(tb, 1, data, 8, fW, 0)
			e.desc(5, tb, 32, fI|fW, 0)
			return 5
		}}, 8, 0, chainShape{[]int{16}, []int{8}, 16, 8}},
		{walkCase{"indirect next links out of order", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(3)
			e.drv.WriteDesc(tb, 0, data, 1, fN, 2)
			e.drv.WriteDesc(tb, 2, data, 2, fN, 1)
			e.drv.WriteDesc(tb, 1, data, 3, fW, 0)
			e.desc(0, tb, 48, fI, 0)
			return 0
		}}, 8, 0, chainShape{[]int{1, 2}, []int{3}, 3, 3}},
		{walkCase{"direct descriptors then an indirect table", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(1)
			e.drv.WriteDesc(tb, 0, data, 8, fW, 0)
			e.desc(0, data, 4, fN, 1)
			e.desc(1, tb, 16, fI, 0)
			return 0
		}}, 8, 0, chainShape{[]int{4}, []int{8}, 4, 8}},
		{walkCase{"queue of one", false, func(e *qenv, data uint64) uint16 {
			e.desc(0, data, 1, fW, 0)
			return 0
		}}, 1, 0, chainShape{nil, []int{1}, 0, 1}},
		{walkCase{"full 32768-descriptor chain", false, func(e *qenv, data uint64) uint16 {
			for i := uint16(0); i < virtio.MaxQueueSize-1; i++ {
				e.desc(i, data, 1, fN, i+1)
			}
			e.desc(virtio.MaxQueueSize-1, data, 2, fW, 0)
			return 0
		}}, virtio.MaxQueueSize, 2 << 20, chainShape{ones(virtio.MaxQueueSize - 1), []int{2}, virtio.MaxQueueSize - 1, 2}},
		{walkCase{"32768-entry indirect table", true, func(e *qenv, data uint64) uint16 {
			tb := e.table(virtio.MaxQueueSize)
			for i := uint16(0); i < virtio.MaxQueueSize-1; i++ {
				e.drv.WriteDesc(tb, i, data, 1, fN, i+1)
			}
			e.drv.WriteDesc(tb, virtio.MaxQueueSize-1, data, 2, fW, 0)
			e.desc(0, tb, 16*virtio.MaxQueueSize, fI, 0)
			return 0
		}}, virtio.MaxQueueSize, 2 << 20, chainShape{ones(virtio.MaxQueueSize - 1), []int{2}, virtio.MaxQueueSize - 1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := tt.memSize
			if mem == 0 {
				mem = walkMem
			}
			e := newQEnv(t, qopts{size: tt.size, memSize: mem, indirect: tt.indirect})
			data := e.mem.Alloc(4096, 16)
			head := tt.build(e, data)
			e.drv.PublishHead(head)
			c := e.pop(t)
			if c.Head != head {
				t.Errorf("Head = %d; want %d", c.Head, head)
			}
			if diff := cmp.Diff(tt.want, shapeOf(c)); diff != "" {
				t.Errorf("chain shape (-want +got):\n%s", diff)
			}
		})
	}
}

func ones(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

// TestWalkTotalLength builds chains of 4 GiB and 4 GiB + 1 byte out of many
// descriptors that all point at one 32 MiB buffer.
func TestWalkTotalLength(t *testing.T) {
	const big = 32 << 20 // 128 of these make 4 GiB
	for _, tt := range []struct {
		name     string
		extra    uint32
		indirect bool
		ok       bool
	}{
		{"exactly 4 GiB", 0, false, true},
		{"4 GiB plus one byte", 1, false, false},
		{"exactly 4 GiB indirect", 0, true, true},
		{"4 GiB plus one byte indirect", 1, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newQEnv(t, qopts{size: 256, memSize: big + 1<<20, indirect: tt.indirect})
			buf := e.mem.Alloc(big, 4096)
			n := 128
			if tt.extra > 0 {
				n++
			}
			tb := e.drv.Cfg.Desc
			if tt.indirect {
				tb = e.table(n)
				e.desc(0, tb, uint32(16*n), fI, 0)
			}
			for i := 0; i < n; i++ {
				var flags uint16 = fN
				length := uint32(big)
				if i >= 64 {
					flags |= fW
				}
				if i == 128 {
					length = tt.extra
				}
				if i == n-1 {
					flags &^= fN
				}
				e.drv.WriteDesc(tb, uint16(i), buf, length, flags, uint16(i+1))
			}
			e.drv.PublishHead(0)
			ok, err := e.dev.Pop(&e.c)
			if ok != tt.ok {
				t.Fatalf("Pop = %v, %v; want %v", ok, err, tt.ok)
			}
			if !tt.ok {
				wantGuestErr(t, "Pop", err)
				return
			}
			if got, want := e.c.ReadableLen()+e.c.WritableLen(), uint64(1)<<32; got != want {
				t.Errorf("chain length = %d; want %d", got, want)
			}
		})
	}
}

// TestCopyHelpers checks CopyFrom, CopyTo and Slice against a flat copy of
// the buffers, for every offset and length, including ones past the end.
func TestCopyHelpers(t *testing.T) {
	shape := [][]int{{3, 0, 1, 4}, {1}, {0}, {5, 5}, {2, 0, 0, 7, 1}}
	for _, lensOf := range shape {
		total := 0
		for _, n := range lensOf {
			total += n
		}
		mk := func() ([][]byte, []byte) {
			var bufs [][]byte
			var flat []byte
			for _, n := range lensOf {
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(len(flat) + i + 1)
				}
				flat = append(flat, b...)
				bufs = append(bufs, b)
			}
			return bufs, flat
		}
		for off := 0; off <= total+2; off++ {
			for n := 0; n <= total+2; n++ {
				name := fmt.Sprintf("%v/off=%d/n=%d", lensOf, off, n)
				lo, hi := min(off, total), min(off+n, total)

				bufs, flat := mk()
				dst := make([]byte, n)
				got := virtio.CopyFrom(bufs, uint64(off), dst)
				if got != hi-lo || !bytes.Equal(dst[:got], flat[lo:hi]) {
					t.Errorf("%s: CopyFrom = %d, %v; want %d, %v", name, got, dst[:got], hi-lo, flat[lo:hi])
				}

				src := bytes.Repeat([]byte{0xee}, n)
				got = virtio.CopyTo(bufs, uint64(off), src)
				want := append([]byte(nil), flat...)
				copy(want[lo:hi], src)
				if got != hi-lo || !bytes.Equal(bytes.Join(bufs, nil), want) {
					t.Errorf("%s: CopyTo = %d leaving %v; want %d leaving %v", name, got, bytes.Join(bufs, nil), hi-lo, want)
				}

				bufs, flat = mk()
				prefix := []byte{0xaa}
				segs := virtio.Slice([][]byte{prefix}, bufs, uint64(off), uint64(n))
				if len(segs) == 0 || &segs[0][0] != &prefix[0] {
					t.Fatalf("%s: Slice dropped the views already in dst", name)
				}
				for _, s := range segs[1:] {
					if len(s) == 0 {
						t.Errorf("%s: Slice returned an empty view", name)
					}
				}
				if got := bytes.Join(segs[1:], nil); !bytes.Equal(got, flat[lo:hi]) {
					t.Errorf("%s: Slice covers %v; want %v", name, got, flat[lo:hi])
				}
				// The views alias the buffers: writing through them
				// changes exactly bytes [lo, hi).
				for _, s := range segs[1:] {
					for i := range s {
						s[i] = 0
					}
				}
				want = append([]byte(nil), flat...)
				clear(want[lo:hi])
				if got := bytes.Join(bufs, nil); !bytes.Equal(got, want) {
					t.Errorf("%s: writing through Slice's views left %v; want %v", name, got, want)
				}
			}
		}
	}
}

// TestRegressionIndirectTableBound: an indirect table may hold the queue
// size's worth of descriptors, and at least 1024, but no more. Before, any
// table up to 32768 entries was walked, so a guest could make every popped
// chain hold 32768 views of host memory whatever the queue size.
func TestRegressionIndirectTableBound(t *testing.T) {
	for _, tt := range []struct {
		size    uint16
		entries int
		ok      bool
	}{
		{8, 1024, true},
		{8, 1025, false},
		{2048, 2048, true},
		{2048, 2049, false},
	} {
		t.Run(fmt.Sprintf("size %d, %d entries", tt.size, tt.entries), func(t *testing.T) {
			e := newQEnv(t, qopts{size: tt.size, memSize: 4 << 20, indirect: true})
			data := e.mem.Alloc(4096, 16)
			tb := e.table(tt.entries)
			for i := 0; i < tt.entries-1; i++ {
				e.drv.WriteDesc(tb, uint16(i), data, 1, fN, uint16(i+1))
			}
			e.drv.WriteDesc(tb, uint16(tt.entries-1), data, 1, 0, 0)
			e.desc(0, tb, uint32(16*tt.entries), fI, 0)
			e.drv.PublishHead(0)
			var c virtio.Chain
			ok, err := e.dev.Pop(&c)
			if tt.ok && (!ok || err != nil) {
				t.Fatalf("Pop = %v, %v; want the chain", ok, err)
			}
			if !tt.ok {
				wantGuestErr(t, "oversized indirect table", err)
			}
		})
	}
}
