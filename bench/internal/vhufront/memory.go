package vhufront

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/guestmem"
)

// HighGPA is where the second region of a two-region Memory starts: 4 GiB,
// as QEMU places RAM above the PCI hole, so a back-end's translation has a
// hole and a non-zero file offset to deal with.
const HighGPA = 4 << 30

// Region is one SET_MEM_TABLE entry: guest-physical address, size, the
// front-end's (our) virtual address, and the offset in the shared file.
type Region struct {
	GPA, Size, UserAddr, Offset uint64
}

// Memory is guest RAM as a front-end shares it: one memfd, sealed against
// shrinking (a back-end that maps it can never be handed a SIGBUS), mapped
// shared here and split into one or two regions. Guest-physical addresses
// of the first region start at 0, of the second at HighGPA.
type Memory struct {
	*guestmem.Memory
	fd      int
	data    []byte
	regions []Region
}

// NewMemory creates size bytes of shared guest memory (rounded up to pages)
// in nregions regions (1 or 2; with 2 the split is at half the size).
func NewMemory(size uint64, nregions int) (*Memory, error) {
	page := uint64(os.Getpagesize())
	size = (size + 2*page - 1) &^ (2*page - 1) // two page-aligned halves
	if size == 0 || size > 1<<40 {
		return nil, fmt.Errorf("vhufront: guest memory of %d bytes", size)
	}
	if nregions != 1 && nregions != 2 {
		return nil, fmt.Errorf("vhufront: %d memory regions; 1 or 2", nregions)
	}
	fd, err := unix.MemfdCreate("vhufront-guest", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("vhufront: memfd_create: %w", err)
	}
	m := &Memory{fd: fd}
	fail := func(err error) (*Memory, error) {
		m.Close()
		return nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Errorf("vhufront: size the memfd: %w", err))
	}
	// The back-end maps the file shared: it must never shrink under it.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail(fmt.Errorf("vhufront: seal the memfd: %w", err))
	}
	m.data, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("vhufront: map the memfd: %w", err))
	}
	// Our virtual addresses go into SET_MEM_TABLE and SET_VRING_ADDR, as
	// QEMU's do; guestmem knows them only through a Memory.
	probe, err := guestmem.New(guestmem.Region{GPA: 0, Data: m.data})
	if err != nil {
		return fail(err)
	}
	base, err := probe.HostAddr(0)
	if err != nil {
		return fail(err)
	}
	split := size
	if nregions == 2 {
		split = size / 2
	}
	m.regions = append(m.regions, Region{GPA: 0, Size: split, UserAddr: uint64(base), Offset: 0})
	if nregions == 2 {
		m.regions = append(m.regions, Region{GPA: HighGPA, Size: size - split, UserAddr: uint64(base) + split, Offset: split})
	}
	gregs := make([]guestmem.Region, len(m.regions))
	for i, r := range m.regions {
		gregs[i] = guestmem.Region{GPA: r.GPA, Data: m.data[r.Offset : r.Offset+r.Size : r.Offset+r.Size], UserAddr: r.UserAddr}
	}
	if m.Memory, err = guestmem.New(gregs...); err != nil {
		return fail(err)
	}
	return m, nil
}

// FD is the memfd, to hand to a back-end (once per region).
func (m *Memory) FD() int { return m.fd }

// Regions are the SET_MEM_TABLE entries.
func (m *Memory) Regions() []Region { return append([]Region(nil), m.regions...) }

// UserAddr translates a guest-physical address to our virtual address, as
// SET_VRING_ADDR wants ring addresses.
func (m *Memory) UserAddr(gpa uint64) (uint64, error) {
	for _, r := range m.regions {
		if gpa >= r.GPA && gpa-r.GPA < r.Size {
			return r.UserAddr + (gpa - r.GPA), nil
		}
	}
	return 0, fmt.Errorf("vhufront: guest address %#x is in no region", gpa)
}

// Close unmaps the memory and closes the memfd. A back-end that mapped it
// keeps its own mapping.
func (m *Memory) Close() error {
	var errs []error
	if m.data != nil {
		errs = append(errs, unix.Munmap(m.data))
		m.data = nil
		m.Memory = nil
	}
	if m.fd >= 0 {
		errs = append(errs, unix.Close(m.fd))
		m.fd = -1
	}
	return errors.Join(errs...)
}

// allocator hands out guest-physical ranges from the regions, in order.
type allocator struct {
	regions []Region
	i       int
	next    uint64 // next free GPA in regions[i]
}

func newAllocator(m *Memory) *allocator {
	a := &allocator{regions: m.Regions()}
	a.next = a.regions[0].GPA + uint64(os.Getpagesize()) // GPA 0 stays unused
	return a
}

// alloc returns n bytes aligned to align, moving to the next region when the
// current one is full.
func (a *allocator) alloc(n, align uint64) (uint64, error) {
	for a.i < len(a.regions) {
		r := a.regions[a.i]
		p := (a.next + align - 1) &^ (align - 1)
		if p+n <= r.GPA+r.Size {
			a.next = p + n
			return p, nil
		}
		a.i++
		if a.i < len(a.regions) {
			a.next = a.regions[a.i].GPA
		}
	}
	return 0, fmt.Errorf("vhufront: out of guest memory allocating %d bytes", n)
}
