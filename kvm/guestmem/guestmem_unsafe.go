package guestmem

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// HostAddr returns the host virtual address backing gpa, for registering
// memory with KVM (KVM_SET_USER_MEMORY_REGION). It is the only place the
// address of guest memory leaves this package.
func (m *Memory) HostAddr(gpa uint64) (uintptr, error) {
	r := m.find(gpa)
	if r == nil {
		return 0, fmt.Errorf("%w: %#x", ErrOutOfBounds, gpa)
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(r.data))) + uintptr(gpa-r.gpa), nil
}

// word returns the naturally aligned 32-bit word containing the 16-bit value at
// gpa, and the bit shift of the value inside it.
//
// Ring indices are 16 bits wide and Go has no 16-bit atomics, so the helpers
// below operate on the containing aligned 32-bit word. The rings are at least
// 2-byte aligned (virtio 1.2, 2.7: descriptor table 16, available ring 2, used
// ring 4) so a 2-aligned u16 never straddles its word, and regions are page
// aligned so the word is inside the region.
func (m *Memory) word(gpa uint64) (*uint32, uint, error) {
	if gpa%2 != 0 {
		return nil, 0, fmt.Errorf("%w: %#x", ErrMisaligned, gpa)
	}
	base := gpa &^ 3
	b, err := m.Slice(base, 4)
	if err != nil {
		return nil, 0, err
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%4 != 0 {
		return nil, 0, fmt.Errorf("%w: host address of %#x", ErrMisaligned, gpa)
	}
	return (*uint32)(p), uint(gpa-base) * 8, nil
}

// Load16Acquire reads the little-endian u16 at gpa with acquire ordering:
// reads of guest memory made after it observe everything the guest wrote
// before it published this value (the driver's avail->idx after its ring
// entries, virtio 1.2 2.7.13).
func (m *Memory) Load16Acquire(gpa uint64) (uint16, error) {
	w, shift, err := m.word(gpa)
	if err != nil {
		return 0, err
	}
	return uint16(atomic.LoadUint32(w) >> shift), nil
}

// Store16Release writes the little-endian u16 at gpa with release ordering:
// the guest sees every write made before it (our used ring entries before
// used->idx). The neighbouring 16 bits of the word are preserved with a
// compare-and-swap loop, so a concurrent guest write to them is never lost.
// On amd64 the locked instruction is also a full barrier, which the
// EVENT_IDX check (store used->idx, then load used_event) relies on.
func (m *Memory) Store16Release(gpa uint64, v uint16) error {
	w, shift, err := m.word(gpa)
	if err != nil {
		return err
	}
	mask := uint32(0xffff) << shift
	for {
		old := atomic.LoadUint32(w)
		if atomic.CompareAndSwapUint32(w, old, old&^mask|uint32(v)<<shift) {
			return nil
		}
	}
}
