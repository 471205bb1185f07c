package vhufront

import (
	"encoding/binary"
	"fmt"

	"github.com/microvm/microvm/kvm/guestmem"
)

// Descriptor flags and ring flags (virtio 1.2, 2.7).
const (
	descNext  = 1
	descWrite = 2

	availNoInterrupt = 1 // VIRTQ_AVAIL_F_NO_INTERRUPT
	usedNoNotify     = 1 // VIRTQ_USED_F_NO_NOTIFY
)

// Ring is the driver side of one split virtqueue (virtio 1.2, 2.7) in
// shared guest memory. The caller decides which descriptors form which
// chain (the vsock guest keeps a fixed descriptor per buffer); Ring writes
// descriptors and the available ring, publishes, decides on kicks, and
// reaps the used ring. It is used by one goroutine.
//
// Memory ordering: entries are written with plain stores, then the index is
// published with guestmem's Store16Release, whose locked compare-and-swap is
// also a full barrier on amd64; that orders the index store before the
// following load of the device's avail_event (or used flags) in the kick
// decision, as the spec's "memory barrier" before that check requires
// (2.7.13.3.1). The used index is read with Load16Acquire before its
// entries, which the device wrote before releasing the index.
type Ring struct {
	mem *guestmem.Memory
	// Size is the number of entries; Desc, Avail and Used the guest-physical
	// addresses of the three parts.
	Size              uint16
	Desc, Avail, Used uint64
	// EventIdx: VIRTIO_F_EVENT_IDX was negotiated.
	EventIdx bool

	availIdx  uint16 // the next available slot (written, maybe not published)
	published uint16 // the available index the device has seen
	lastUsed  uint16 // the next used entry to reap
}

// newRing allocates the rings of a queue of size entries (a power of 2).
func newRing(mem *guestmem.Memory, a *allocator, size uint16, eventIdx bool) (*Ring, error) {
	if size == 0 || size&(size-1) != 0 || size > 32768 {
		return nil, fmt.Errorf("vhufront: ring size %d: want a power of 2 up to 32768", size)
	}
	n := uint64(size)
	r := &Ring{mem: mem, Size: size, EventIdx: eventIdx}
	var err error
	if r.Desc, err = a.alloc(16*n, 16); err != nil {
		return nil, err
	}
	if r.Avail, err = a.alloc(6+2*n, 2); err != nil {
		return nil, err
	}
	if r.Used, err = a.alloc(6+8*n, 4); err != nil {
		return nil, err
	}
	return r, nil
}

// SetDesc writes descriptor i.
func (r *Ring) SetDesc(i uint16, addr uint64, length uint32, flags, next uint16) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], length)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
	return r.mem.Write(r.Desc+16*uint64(i%r.Size), b[:])
}

// SetDescLen rewrites the length of descriptor i.
func (r *Ring) SetDescLen(i uint16, length uint32) error {
	return r.mem.Write32(r.Desc+16*uint64(i%r.Size)+8, length)
}

// Offer puts the chain at head in the next available slot; the device sees
// it after Publish.
func (r *Ring) Offer(head uint16) error {
	if err := r.mem.Write16(r.Avail+4+2*uint64(r.availIdx%r.Size), head); err != nil {
		return err
	}
	r.availIdx++
	return nil
}

// Pending reports whether offered chains wait for Publish.
func (r *Ring) Pending() bool { return r.availIdx != r.published }

// Publish makes the offered chains visible and reports whether the device
// asked to be notified of them (avail_event with EVENT_IDX, else the used
// ring's NO_NOTIFY flag).
func (r *Ring) Publish() (kick bool, err error) {
	if r.availIdx == r.published {
		return false, nil
	}
	old := r.published
	if err := r.mem.Store16Release(r.Avail+2, r.availIdx); err != nil {
		return false, err
	}
	r.published = r.availIdx
	if r.EventIdx {
		ev, err := r.mem.Load16Acquire(r.Used + 4 + 8*uint64(r.Size))
		if err != nil {
			return false, err
		}
		// vring_need_event: the device wants a kick once the index passes ev.
		return r.availIdx-ev-1 < r.availIdx-old, nil
	}
	flags, err := r.mem.Load16Acquire(r.Used)
	return flags&usedNoNotify == 0, err
}

// Unused is how many published chains the device has not returned yet
// (the published index less the device's used index): none means the
// device has finished with everything it was given.
func (r *Ring) Unused() (uint16, error) {
	idx, err := r.mem.Load16Acquire(r.Used + 2)
	return r.published - idx, err
}

// NextUsed returns the next used entry, if the device published one.
func (r *Ring) NextUsed() (id uint16, length uint32, ok bool, err error) {
	idx, err := r.mem.Load16Acquire(r.Used + 2)
	if err != nil || idx == r.lastUsed {
		return 0, 0, false, err
	}
	if idx-r.lastUsed > r.Size {
		return 0, 0, false, fmt.Errorf("vhufront: device used index %d is %d entries ahead of %d (ring of %d)", idx, idx-r.lastUsed, r.lastUsed, r.Size)
	}
	e := r.Used + 4 + 8*uint64(r.lastUsed%r.Size)
	var b [8]byte
	if err := r.mem.Read(e, b[:]); err != nil {
		return 0, 0, false, err
	}
	id32 := binary.LittleEndian.Uint32(b[0:])
	if id32 >= uint32(r.Size) {
		return 0, 0, false, fmt.Errorf("vhufront: device returned descriptor %d (ring of %d)", id32, r.Size)
	}
	r.lastUsed++
	return uint16(id32), binary.LittleEndian.Uint32(b[4:]), true, nil
}

// HasUsed reports whether the device published entries not yet reaped.
func (r *Ring) HasUsed() (bool, error) {
	idx, err := r.mem.Load16Acquire(r.Used + 2)
	return idx != r.lastUsed, err
}

// EnableInterrupts asks the device to interrupt for the next used entry
// (used_event = the next entry with EVENT_IDX, else clearing
// NO_INTERRUPT) and re-checks the used ring: true means entries arrived
// meanwhile and the caller must not sleep.
func (r *Ring) EnableInterrupts() (bool, error) {
	var err error
	if r.EventIdx {
		err = r.mem.Store16Release(r.Avail+4+2*uint64(r.Size), r.lastUsed)
	} else {
		err = r.mem.Store16Release(r.Avail, 0)
	}
	if err != nil {
		return false, err
	}
	return r.HasUsed()
}

// DisableInterrupts asks the device not to interrupt. With EVENT_IDX
// nothing is written: a used_event the device has passed stays behind it,
// so it interrupts again only after the index wraps (Linux writes 0 to the
// same effect).
func (r *Ring) DisableInterrupts() error {
	if r.EventIdx {
		return nil
	}
	return r.mem.Store16Release(r.Avail, availNoInterrupt)
}

// AvailIdx is the driver's available index (published or not).
func (r *Ring) AvailIdx() uint16 { return r.availIdx }
