package guestmem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"sync/atomic"
)

// ErrOutOfBounds is returned (wrapped) for any access that is not entirely
// inside guest memory.
var ErrOutOfBounds = errors.New("guest address out of bounds")

// ErrMisaligned is returned (wrapped) by the atomic helpers for an address that
// is not naturally aligned.
var ErrMisaligned = errors.New("misaligned guest address")

// Range is a span of guest-physical address space.
type Range struct {
	GPA  uint64
	Size uint64
}

// End returns the first address after r. It saturates instead of wrapping.
func (r Range) End() uint64 {
	e, carry := bits.Add64(r.GPA, r.Size, 0)
	if carry != 0 {
		return ^uint64(0)
	}
	return e
}

// region is one contiguous piece of guest memory backed by host memory.
type region struct {
	gpa   uint64
	data  []byte
	uaddr uint64 // frontend user address of data[0] (vhost-user); 0 when unknown
	unmap func() error
	// dirty marks the pages the VMM wrote (dirty.go); nil unless tracked.
	dirty []atomic.Uint64
}

func (r *region) end() uint64 { return r.gpa + uint64(len(r.data)) }

// Memory is guest RAM: a set of non-overlapping regions sorted by address.
type Memory struct {
	regions []region
}

// Region describes a region to build a Memory from over memory the caller
// already owns (tests, and callers that map memory themselves).
type Region struct {
	GPA  uint64
	Data []byte
	// UserAddr is the frontend's virtual address of Data[0] (vhost-user only).
	UserAddr uint64
	// Unmap, when set, is called by Close.
	Unmap func() error
}

// New builds a Memory over caller-provided regions. Regions must not overlap
// and must not wrap the address space.
func New(regs ...Region) (*Memory, error) {
	m := &Memory{}
	for _, r := range regs {
		if len(r.Data) == 0 {
			return nil, fmt.Errorf("guestmem: empty region at %#x", r.GPA)
		}
		if _, carry := bits.Add64(r.GPA, uint64(len(r.Data)), 0); carry != 0 {
			return nil, fmt.Errorf("guestmem: region at %#x of %d bytes wraps the address space", r.GPA, len(r.Data))
		}
		m.regions = append(m.regions, region{gpa: r.GPA, data: r.Data, uaddr: r.UserAddr, unmap: r.Unmap})
	}
	sort.Slice(m.regions, func(i, j int) bool { return m.regions[i].gpa < m.regions[j].gpa })
	for i := 1; i < len(m.regions); i++ {
		if m.regions[i].gpa < m.regions[i-1].end() {
			return nil, fmt.Errorf("guestmem: regions at %#x and %#x overlap", m.regions[i-1].gpa, m.regions[i].gpa)
		}
	}
	return m, nil
}

// Close unmaps every region that was mapped for this Memory. No view handed
// out by Slice may be used afterwards.
func (m *Memory) Close() error {
	var errs []error
	for i := range m.regions {
		if u := m.regions[i].unmap; u != nil {
			if err := u(); err != nil {
				errs = append(errs, err)
			}
			m.regions[i].unmap = nil
		}
	}
	return errors.Join(errs...)
}

// Ranges lists the guest-physical ranges backed by memory, in address order.
func (m *Memory) Ranges() []Range {
	out := make([]Range, len(m.regions))
	for i, r := range m.regions {
		out[i] = Range{GPA: r.gpa, Size: uint64(len(r.data))}
	}
	return out
}

// Size is the total number of bytes of guest memory.
func (m *Memory) Size() uint64 {
	var n uint64
	for _, r := range m.regions {
		n += uint64(len(r.data))
	}
	return n
}

// find returns the region holding gpa, or nil.
func (m *Memory) find(gpa uint64) *region {
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].end() > gpa })
	if i < len(m.regions) && m.regions[i].gpa <= gpa {
		return &m.regions[i]
	}
	return nil
}

// Slice returns a view of n bytes of guest memory at gpa. The range must lie in
// a single region. A zero-length slice is valid at any address inside memory.
func (m *Memory) Slice(gpa, n uint64) ([]byte, error) {
	v, err := m.ReadView(gpa, n)
	if err == nil {
		r := m.find(gpa)
		r.markDirty(gpa-r.gpa, n)
	}
	return v, err
}

// ReadView is Slice for a caller that only reads the view: the pages are
// not marked dirty (TrackDirty). Writing through it would hide the write
// from a diff snapshot.
func (m *Memory) ReadView(gpa, n uint64) ([]byte, error) {
	r := m.find(gpa)
	if r == nil {
		return nil, fmt.Errorf("%w: %#x", ErrOutOfBounds, gpa)
	}
	off := gpa - r.gpa
	if n > uint64(len(r.data))-off {
		return nil, fmt.Errorf("%w: %#x+%d", ErrOutOfBounds, gpa, n)
	}
	return r.data[off : off+n : off+n], nil
}

// Read copies len(p) bytes of guest memory at gpa into p. The range may span
// adjacent regions but not a hole.
func (m *Memory) Read(gpa uint64, p []byte) error {
	return m.span(gpa, uint64(len(p)), false, func(view []byte, done uint64) { copy(p[done:], view) })
}

// Write copies p into guest memory at gpa. The range may span adjacent
// regions but not a hole.
func (m *Memory) Write(gpa uint64, p []byte) error {
	return m.span(gpa, uint64(len(p)), true, func(view []byte, done uint64) { copy(view, p[done:]) })
}

// Check reports whether [gpa, gpa+n) lies entirely in guest memory, without
// touching it.
func (m *Memory) Check(gpa, n uint64) error {
	return m.span(gpa, n, false, func([]byte, uint64) {})
}

// Zero clears n bytes of guest memory at gpa.
func (m *Memory) Zero(gpa, n uint64) error {
	return m.span(gpa, n, true, func(view []byte, _ uint64) { clear(view) })
}

// span visits [gpa, gpa+n) region by region, marking the pages dirty when
// write. Nothing is visited unless the whole range is inside guest memory.
func (m *Memory) span(gpa, n uint64, write bool, visit func(view []byte, done uint64)) error {
	if _, carry := bits.Add64(gpa, n, 0); carry != 0 {
		return fmt.Errorf("%w: %#x+%d wraps", ErrOutOfBounds, gpa, n)
	}
	// Check first so that a failed access has no partial effect.
	for addr, left := gpa, n; left > 0; {
		r := m.find(addr)
		if r == nil {
			return fmt.Errorf("%w: %#x+%d", ErrOutOfBounds, gpa, n)
		}
		step := min(left, r.end()-addr)
		addr += step
		left -= step
	}
	if n == 0 && m.find(gpa) == nil {
		return fmt.Errorf("%w: %#x", ErrOutOfBounds, gpa)
	}
	var done uint64
	for done < n {
		r := m.find(gpa + done)
		off := gpa + done - r.gpa
		step := min(n-done, uint64(len(r.data))-off)
		if write {
			r.markDirty(off, step)
		}
		visit(r.data[off:off+step], done)
		done += step
	}
	return nil
}

// Read16 reads a little-endian uint16 at gpa.
func (m *Memory) Read16(gpa uint64) (uint16, error) {
	var b [2]byte
	err := m.Read(gpa, b[:])
	return binary.LittleEndian.Uint16(b[:]), err
}

// Read32 reads a little-endian uint32 at gpa.
func (m *Memory) Read32(gpa uint64) (uint32, error) {
	var b [4]byte
	err := m.Read(gpa, b[:])
	return binary.LittleEndian.Uint32(b[:]), err
}

// Read64 reads a little-endian uint64 at gpa.
func (m *Memory) Read64(gpa uint64) (uint64, error) {
	var b [8]byte
	err := m.Read(gpa, b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

// Write16 writes a little-endian uint16 at gpa.
func (m *Memory) Write16(gpa uint64, v uint16) error {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	return m.Write(gpa, b[:])
}

// Write32 writes a little-endian uint32 at gpa.
func (m *Memory) Write32(gpa uint64, v uint32) error {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return m.Write(gpa, b[:])
}

// Write64 writes a little-endian uint64 at gpa.
func (m *Memory) Write64(gpa uint64, v uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return m.Write(gpa, b[:])
}

// TranslateUser maps a frontend user-space address (vhost-user) to a
// guest-physical address. The n bytes from uaddr must lie in one region.
func (m *Memory) TranslateUser(uaddr, n uint64) (uint64, error) {
	for i := range m.regions {
		r := &m.regions[i]
		if r.uaddr == 0 {
			continue // not a frontend mapping
		}
		size := uint64(len(r.data))
		if uaddr >= r.uaddr && uaddr-r.uaddr < size && n <= size-(uaddr-r.uaddr) {
			return r.gpa + (uaddr - r.uaddr), nil
		}
	}
	return 0, fmt.Errorf("%w: user address %#x+%d is in no region", ErrOutOfBounds, uaddr, n)
}
