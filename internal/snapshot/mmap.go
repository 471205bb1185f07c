package snapshot

import (
	"errors"
	"runtime"

	"golang.org/x/sys/unix"
)

// MapMemory maps the memory part called name, private and writable
// (MAP_PRIVATE, PROT_READ|PROT_WRITE, MAP_NORESERVE): nothing is read
// until the guest touches a page, so restoring costs the same for any
// memory size; a page written is copied first, so writes never reach the
// file; and the mappings of one snapshot, in this process or another,
// share the unwritten pages through the page cache. Holes read as zero.
//
// The caller hands the slice to guest memory (guestmem.Region, a KVM
// memory slot) and unmaps it with Unmap once the VM is gone. The file
// must keep its size while mapped: a page beyond its end faults (SIGBUS
// in the VMM, EFAULT from KVM_RUN). Snapshots are never rewritten in place
// by this package; Overwrite and removal unlink files, which mappings
// outlive.
func (s *Snapshot) MapMemory(name string) ([]byte, error) {
	op, err := s.lookup(name, KindMemory)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(op.f.Fd()), &st); err != nil {
		return nil, partErrorf(s.dir, &op.Part, "stat: %w", err)
	}
	if st.Size != op.Size {
		return nil, partErrorf(s.dir, &op.Part, "%w: file has %d bytes now, the manifest says %d", ErrTruncated, st.Size, op.Size)
	}
	mem, err := unix.Mmap(int(op.f.Fd()), 0, int(op.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	runtime.KeepAlive(op.f)
	if err != nil {
		return nil, partErrorf(s.dir, &op.Part, "mmap %d MiB: %w", op.Size>>20, err)
	}
	return mem, nil
}

// Prefault reads the data of memory part name in now, into mem (its
// MapMemory mapping, or a chain's starting from it), rather than at the
// guest's first touch of each page: each run of data the file holds is
// populated (MADV_POPULATE_READ: read from disk into the page cache and
// mapped, still shared and copy-on-write); holes are left alone, they read
// as zero without a page. Linux before 5.14 lacks MADV_POPULATE_READ:
// there MADV_WILLNEED starts the reads and Prefault returns without
// waiting for them.
func (s *Snapshot) Prefault(mem []byte, name string) error {
	op, err := s.lookup(name, KindMemory)
	if err != nil {
		return err
	}
	if int64(len(mem)) != op.Size {
		return partErrorf(s.dir, &op.Part, "prefault of %d bytes of memory, the part has %d", len(mem), op.Size)
	}
	// No readahead while populating: it would read the holes beside
	// each run into the page cache too.
	if err := unix.Madvise(mem, unix.MADV_RANDOM); err != nil {
		return partErrorf(s.dir, &op.Part, "prefault: %w", err)
	}
	defer unix.Madvise(mem, unix.MADV_NORMAL)
	err = forEachDataRun(op.f, op.Size, func(start, end int64) error {
		b := mem[start:end]
		err := unix.Madvise(b, unix.MADV_POPULATE_READ)
		if errors.Is(err, unix.EINVAL) {
			err = unix.Madvise(b, unix.MADV_WILLNEED)
		}
		return err
	})
	if err != nil {
		return partErrorf(s.dir, &op.Part, "prefault: %w", err)
	}
	return nil
}

// Unmap releases memory from MapMemory or MapMemoryChain: the whole slice
// as returned, not a part of it.
func Unmap(mem []byte) error { return unix.Munmap(mem) }
