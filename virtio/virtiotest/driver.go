// Package virtiotest plays the guest driver over plain memory, so device
// models and the virtio transport are tested, fuzzed and benchmarked
// in-process without KVM. It writes descriptor tables and available rings the
// way a driver does, kicks, and reaps used entries; it can also write
// arbitrary (malicious) descriptors.
package virtiotest

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/virtio"
)

// Memory is guest memory backed by a Go slice, with a bump allocator.
type Memory struct {
	*guestmem.Memory
	mu   sync.Mutex
	next uint64
	end  uint64
}

// NewMemory returns size bytes of guest memory at guest-physical 0. The first
// page is never allocated, so address 0 stays invalid for drivers.
func NewMemory(tb testing.TB, size uint64) *Memory {
	tb.Helper()
	m, err := guestmem.New(guestmem.Region{GPA: 0, Data: make([]byte, size)})
	if err != nil {
		tb.Fatal(err)
	}
	return &Memory{Memory: m, next: 4096, end: size}
}

// MemoryFrom puts the bump allocator on guest memory the caller mapped
// (one region at guest-physical 0, such as a memfd a test also hands a
// vhost-user back-end). As with NewMemory the first page is never
// allocated.
func MemoryFrom(m *guestmem.Memory) *Memory {
	return &Memory{Memory: m, next: 4096, end: m.Size()}
}

// Alloc returns n bytes of guest memory aligned to align.
func (m *Memory) Alloc(n, align uint64) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := (m.next + align - 1) &^ (align - 1)
	if a+n > m.end {
		panic(fmt.Sprintf("virtiotest: out of guest memory allocating %d bytes", n))
	}
	m.next = a + n
	return a
}

// Buf is one buffer of a chain.
type Buf struct {
	Addr     uint64
	Len      uint32
	Writable bool
}

// Used is a reaped used-ring entry.
type Used struct {
	ID  uint16
	Len uint32
}

// Queue is the driver side of one split virtqueue.
type Queue struct {
	Mem      *Memory
	Cfg      virtio.QueueConfig
	EventIdx bool

	free      []uint16 // free descriptor indices
	availIdx  uint16
	usedIdx   uint16 // next used entry to reap
	chainLen  map[uint16]int
	indirects map[uint16]bool
}

// NewQueue allocates the rings of a queue of size entries.
func NewQueue(m *Memory, size uint16, eventIdx bool) *Queue {
	n := uint64(size)
	q := &Queue{
		Mem: m,
		Cfg: virtio.QueueConfig{
			Size:  size,
			Desc:  m.Alloc(16*n, 16),
			Avail: m.Alloc(6+2*n, 2),
			Used:  m.Alloc(6+8*n, 4),
		},
		EventIdx:  eventIdx,
		chainLen:  map[uint16]int{},
		indirects: map[uint16]bool{},
	}
	for i := int(size) - 1; i >= 0; i-- {
		q.free = append(q.free, uint16(i))
	}
	return q
}

// WriteDesc writes descriptor i verbatim (for crafting bad chains).
func (q *Queue) WriteDesc(table uint64, i uint16, addr uint64, length uint32, flags, next uint16) {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], length)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
	must(q.Mem.Write(table+16*uint64(i), b[:]))
}

// Descriptor flags.
const (
	FlagNext     = 1
	FlagWrite    = 2
	FlagIndirect = 4
)

// Free reports how many descriptors are free.
func (q *Queue) Free() int { return len(q.free) }

// Add makes a chain of bufs available (without publishing the index) and
// returns its head, or false when there are not enough free descriptors.
func (q *Queue) Add(bufs ...Buf) (uint16, bool) {
	if len(bufs) == 0 || len(bufs) > len(q.free) {
		return 0, false
	}
	idx := q.free[len(q.free)-len(bufs):]
	q.free = q.free[:len(q.free)-len(bufs)]
	for i, b := range bufs {
		var flags, next uint16
		if b.Writable {
			flags |= FlagWrite
		}
		if i+1 < len(bufs) {
			flags |= FlagNext
			next = idx[i+1]
		}
		q.WriteDesc(q.Cfg.Desc, idx[i], b.Addr, b.Len, flags, next)
	}
	head := idx[0]
	q.chainLen[head] = len(bufs)
	q.PublishHead(head)
	return head, true
}

// AddIndirect makes bufs available through one indirect descriptor.
func (q *Queue) AddIndirect(bufs ...Buf) (uint16, bool) {
	if len(q.free) == 0 {
		return 0, false
	}
	table := q.Mem.Alloc(16*uint64(len(bufs)), 16)
	for i, b := range bufs {
		var flags uint16
		if b.Writable {
			flags |= FlagWrite
		}
		if i+1 < len(bufs) {
			flags |= FlagNext
		}
		q.WriteDesc(table, uint16(i), b.Addr, b.Len, flags, uint16(i+1))
	}
	head := q.free[len(q.free)-1]
	q.free = q.free[:len(q.free)-1]
	q.WriteDesc(q.Cfg.Desc, head, table, uint32(16*len(bufs)), FlagIndirect, 0)
	q.chainLen[head] = 1
	q.PublishHead(head)
	return head, true
}

// PublishHead puts head in the next available slot and publishes the index.
func (q *Queue) PublishHead(head uint16) {
	slot := uint64(q.availIdx % q.Cfg.Size)
	must(q.Mem.Write16(q.Cfg.Avail+4+2*slot, head))
	q.availIdx++
	must(q.Mem.Store16Release(q.Cfg.Avail+2, q.availIdx))
}

// SetAvailIdx overwrites the available index (for crafting bad rings).
func (q *Queue) SetAvailIdx(v uint16) {
	q.availIdx = v
	must(q.Mem.Store16Release(q.Cfg.Avail+2, v))
}

// SetNoInterrupt sets or clears VIRTQ_AVAIL_F_NO_INTERRUPT.
func (q *Queue) SetNoInterrupt(on bool) {
	var v uint16
	if on {
		v = 1
	}
	must(q.Mem.Store16Release(q.Cfg.Avail, v))
}

// SetUsedEvent writes used_event (EVENT_IDX): interrupt me when the used
// index passes v.
func (q *Queue) SetUsedEvent(v uint16) {
	must(q.Mem.Store16Release(q.Cfg.Avail+4+2*uint64(q.Cfg.Size), v))
}

// NeedsKick reports whether the device asked to be notified about the
// buffers published since old (VIRTQ_USED_F_NO_NOTIFY, or avail_event with
// EVENT_IDX).
func (q *Queue) NeedsKick(old uint16) bool {
	if q.EventIdx {
		ev, err := q.Mem.Load16Acquire(q.Cfg.Used + 4 + 8*uint64(q.Cfg.Size))
		must(err)
		return q.availIdx-ev-1 < q.availIdx-old
	}
	flags, err := q.Mem.Load16Acquire(q.Cfg.Used)
	must(err)
	return flags&1 == 0
}

// AvailIdx is the driver's available index.
func (q *Queue) AvailIdx() uint16 { return q.availIdx }

// Reap returns the used entries the device has published since the last
// call, freeing their descriptors.
func (q *Queue) Reap() []Used {
	idx, err := q.Mem.Load16Acquire(q.Cfg.Used + 2)
	must(err)
	var out []Used
	for q.usedIdx != idx {
		slot := uint64(q.usedIdx % q.Cfg.Size)
		id, err := q.Mem.Read32(q.Cfg.Used + 4 + 8*slot)
		must(err)
		l, err := q.Mem.Read32(q.Cfg.Used + 4 + 8*slot + 4)
		must(err)
		out = append(out, Used{ID: uint16(id), Len: l})
		q.usedIdx++
		if n, ok := q.chainLen[uint16(id)]; ok {
			q.releaseChain(uint16(id), n)
			delete(q.chainLen, uint16(id))
		}
	}
	if q.EventIdx {
		q.SetUsedEvent(q.usedIdx)
	}
	return out
}

// releaseChain frees the descriptors of the chain at head by following its
// next links in the table.
func (q *Queue) releaseChain(head uint16, n int) {
	i := head
	for k := 0; k < n; k++ {
		q.free = append(q.free, i)
		var b [16]byte
		must(q.Mem.Read(q.Cfg.Desc+16*uint64(i), b[:]))
		i = binary.LittleEndian.Uint16(b[14:])
	}
}

func must(err error) {
	if err != nil {
		panic("virtiotest: " + err.Error())
	}
}
