package guestmem

import (
	"fmt"
	"sync/atomic"
)

// Dirty tracking: the pages the VMM itself writes (device models: used
// rings, received data, block reads), which KVM's dirty log does not see
// because they are written through the host mapping, not by the guest. A
// diff snapshot (internal/vmm) takes the union of both logs.
//
// Once TrackDirty has been called, Write, Zero, Store16Release and every
// Slice mark the pages they cover. A view from Slice may be read or
// written; it is marked either way, which over-counts (a device's reads of
// TX buffers) but never misses a write. Load16Acquire goes through the
// same word lookup and marks its page too: the avail ring's page, which
// the guest writes anyway.
//
// The bits are atomic words, set with an atomic OR by any goroutine and
// swapped out whole by TakeDirty; a write racing with TakeDirty lands in
// the bitmap it returns or in the next one, never in neither. (Callers
// take the log with the devices quiesced, when nothing writes.)

// dirtyPageSize is the tracking granularity, KVM's dirty log's.
const dirtyPageSize = 4096

// TrackDirty starts marking the pages the VMM writes. Call it once,
// before the Memory is shared with other goroutines.
func (m *Memory) TrackDirty() {
	for i := range m.regions {
		r := &m.regions[i]
		pages := (uint64(len(r.data)) + dirtyPageSize - 1) / dirtyPageSize
		r.dirty = make([]atomic.Uint64, (pages+63)/64)
	}
}

// markDirty marks the pages of r that [off, off+n) covers.
func (r *region) markDirty(off, n uint64) {
	if r.dirty == nil || n == 0 {
		return
	}
	for p, last := off/dirtyPageSize, (off+n-1)/dirtyPageSize; p <= last; p++ {
		w := &r.dirty[p/64]
		if bit := uint64(1) << (p % 64); w.Load()&bit == 0 {
			w.Or(bit)
		}
	}
}

// TakeDirty returns the pages the VMM wrote in the region that starts at
// gpa since tracking began or the previous TakeDirty (bit i%64 of word
// i/64: page i of the region, KVM_GET_DIRTY_LOG's layout), and clears
// them.
func (m *Memory) TakeDirty(gpa uint64) ([]uint64, error) {
	r := m.find(gpa)
	if r == nil || r.gpa != gpa {
		return nil, fmt.Errorf("%w: no region starts at %#x", ErrOutOfBounds, gpa)
	}
	if r.dirty == nil {
		return nil, fmt.Errorf("guestmem: dirty pages of the region at %#x: not tracked", gpa)
	}
	out := make([]uint64, len(r.dirty))
	for i := range r.dirty {
		out[i] = r.dirty[i].Swap(0)
	}
	return out, nil
}
