package guestmem

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// NewAnonymous maps private anonymous memory for each range and returns a
// Memory over them. Pages are reserved lazily (MAP_NORESERVE): a guest only
// costs the host what it touches.
func NewAnonymous(ranges ...Range) (*Memory, error) {
	regs := make([]Region, 0, len(ranges))
	fail := func(err error) (*Memory, error) {
		for _, r := range regs {
			_ = r.Unmap()
		}
		return nil, err
	}
	for _, rg := range ranges {
		if rg.Size == 0 || rg.Size%uint64(os.Getpagesize()) != 0 || rg.GPA%uint64(os.Getpagesize()) != 0 {
			return fail(fmt.Errorf("guestmem: range %#x+%#x is not page aligned", rg.GPA, rg.Size))
		}
		if rg.Size > 1<<46 {
			return fail(fmt.Errorf("guestmem: range of %d bytes is too large", rg.Size))
		}
		data, err := unix.Mmap(-1, 0, int(rg.Size), unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return fail(fmt.Errorf("guestmem: map %d MiB of guest memory: %w", rg.Size>>20, err))
		}
		regs = append(regs, Region{GPA: rg.GPA, Data: data, Unmap: func() error { return unix.Munmap(data) }})
	}
	m, err := New(regs...)
	if err != nil {
		return fail(err)
	}
	return m, nil
}

// FileRegion describes guest memory shared through a file descriptor, as the
// vhost-user SET_MEM_TABLE message gives it.
type FileRegion struct {
	GPA      uint64
	Size     uint64
	UserAddr uint64 // the frontend's virtual address of the region's first byte
	Offset   uint64 // offset of the region in the file (mmap_offset)
	FD       int
}

// MapFiles maps each file region shared and returns a Memory over them. The
// descriptors are not closed: the caller owns them (a mapping stays valid after
// its descriptor is closed).
func MapFiles(frs ...FileRegion) (*Memory, error) {
	regs := make([]Region, 0, len(frs))
	fail := func(err error) (*Memory, error) {
		for _, r := range regs {
			_ = r.Unmap()
		}
		return nil, err
	}
	page := uint64(os.Getpagesize())
	for _, fr := range frs {
		if fr.Size == 0 || fr.Size > 1<<46 {
			return fail(fmt.Errorf("guestmem: file region at %#x has bad size %d", fr.GPA, fr.Size))
		}
		// mmap needs a page-aligned offset; map from the page below and
		// keep the view at the requested offset.
		delta := fr.Offset % page
		if fr.Offset > 1<<62 {
			return fail(fmt.Errorf("guestmem: file region offset %#x is too large", fr.Offset))
		}
		full, err := unix.Mmap(fr.FD, int64(fr.Offset-delta), int(fr.Size+delta),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fail(fmt.Errorf("guestmem: map region at %#x (%d bytes, fd %d): %w", fr.GPA, fr.Size, fr.FD, err))
		}
		regs = append(regs, Region{GPA: fr.GPA, Data: full[delta:], UserAddr: fr.UserAddr,
			Unmap: func() error { return unix.Munmap(full) }})
	}
	m, err := New(regs...)
	if err != nil {
		return fail(err)
	}
	return m, nil
}
