package blk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Copy-on-write disks (Config.CopyOnWrite). The base image is opened
// read-only and never written; the guest's writes go to an overlay, an
// unlinked sparse file of the base's size, and a bitmap says which blocks
// of the disk the overlay holds. The package comment traces the data path
// and the locks; this file is the mechanism.

// CopyOnWriteBlockSize is the unit in which a copy-on-write disk's overlay
// holds data: 4 KiB, the page size and the block size of the file systems
// guests put on disks (ext4, xfs), so that their writes cover whole blocks
// and go to the overlay without first copying anything from the base;
// also the discard alignment the device advertises. Smaller blocks would
// only grow the bitmap (1 bit per block: 128 KiB for a 4 GiB disk); larger
// ones would copy more of the base for each small write. The last block
// is shorter when the disk's size is not a multiple of it.
const CopyOnWriteBlockSize = 4096

// cowStripes is how many locks guard the bitmap's 0 -> 1 transitions
// (overlay.stripes): enough that requests in flight (at most MaxInFlight)
// copying up different blocks rarely wait for each other.
const cowStripes = 64

// overlay is a copy-on-write disk's private layer. Its methods are called
// by the session's workers, several at once; they take the data views of
// one request each, and slot-owned scratch space.
//
// A block's bit in present goes 0 -> 1 once and is never cleared: from
// then on the overlay holds the block's content and every read and write
// of it goes to the overlay only, without a lock. Before, the base holds
// it. The transition is made under the block's stripe lock, by one of:
//
//   - copyUp, for a write that covers part of the block: it reads the
//     block from the base and writes it whole into the overlay, then sets
//     the bit, holding the stripe lock across both syscalls. That is the
//     lock across a data transfer the package otherwise avoids, and it is
//     needed: two requests writing different sectors of the same block
//     must not both copy it up, or the later copy (the base's bytes) would
//     overwrite what the earlier request wrote after its own copy-up. The
//     lock is held for at most 2 x 4 KiB of I/O, only for a block's first
//     partial write, and is never held with any other lock.
//   - claim, for a write, write-zeroes or discard that covers the whole
//     block: it sets the bit under the stripe lock and returns, and the
//     request then writes the block into the overlay. Claiming first and
//     under the lock is what keeps a concurrent copyUp of the same block
//     (a partial write overlapping this one) from writing the base's bytes
//     over the claimed block: either the copy-up finished first (the
//     claim finds the bit set) or it finds the bit set and copies nothing.
//     A read that overlaps a whole-block write still in flight may see the
//     overlay's old content or zeros (a hole) for that block: the result
//     of a read overlapping a write in flight is undefined (virtio-blk
//     does not order requests in flight, 5.2.6), and a failed write
//     leaves its range undefined, as on any disk.
//
// A set bit is read with an atomic load; the overlay's content that the
// bit stands for was written (a completed pwrite, or a claim whose
// request is itself in flight) before the bit was set.
type overlay struct {
	base int      // the base image (read-only): Device.fd
	file *os.File // the overlay: unlinked, sparse, size bytes
	fd   int      // file's descriptor
	size uint64   // the disk's size in bytes (the base's)

	// present has bit b%64 of word b/64 set once the overlay holds block
	// b. Bits are set (atomic Or) only with stripes[b%cowStripes] held and
	// never cleared; they are read without a lock (atomic Load). Its
	// length is fixed at open: ceil(blocks/64) words.
	present []atomic.Uint64
	written atomic.Uint64 // the number of bits set in present

	// stripes[i] guards the 0 -> 1 transition of the bits of the blocks
	// b with b%cowStripes == i, and a copy-up of such a block, across its
	// pread from the base and pwrite into the overlay. A worker holds at
	// most one, and takes nothing else under it.
	stripes [cowStripes]sync.Mutex
}

// openTmpfile creates an unnamed file in dir with O_TMPFILE. A variable so
// that a test can make it fail as on a file system without O_TMPFILE.
var openTmpfile = func(dir string) (int, error) {
	for {
		fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// newOverlay creates the overlay of a base image of size bytes (a
// non-zero multiple of 512), open as fd, in dir ("": os.TempDir()).
func newOverlay(base int, size uint64, dir string) (*overlay, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := createUnlinked(dir)
	if err != nil {
		return nil, fmt.Errorf("copy-on-write overlay in %s: %w", dir, err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy-on-write overlay in %s: size it to %d bytes: %w", dir, size, unwrapPath(err))
	}
	blocks := (size + CopyOnWriteBlockSize - 1) / CopyOnWriteBlockSize
	return &overlay{base: base, file: f, fd: int(f.Fd()), size: size,
		present: make([]atomic.Uint64, (blocks+63)/64)}, nil
}

// createUnlinked returns a new empty file in dir that no name points to,
// so that it goes away with its last descriptor, however the process
// ends: O_TMPFILE, or, where the file system or the kernel lacks it
// (EOPNOTSUPP; EISDIR or EINVAL before Linux 3.11), a file created with a
// random name and unlinked at once.
func createUnlinked(dir string) (*os.File, error) {
	fd, err := openTmpfile(dir)
	if err == nil {
		return os.NewFile(uintptr(fd), filepath.Join(dir, "(copy-on-write overlay)")), nil
	}
	if err != unix.EOPNOTSUPP && err != unix.EISDIR && err != unix.EINVAL {
		return nil, err
	}
	f, err := os.CreateTemp(dir, ".microvm-cow-*")
	if err != nil {
		return nil, unwrapPath(err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("unlink %s: %w", f.Name(), unwrapPath(err))
	}
	return f, nil
}

func (o *overlay) close() error { return o.file.Close() }

// blocks is the number of blocks of the disk.
func (o *overlay) blocks() uint64 {
	return (o.size + CopyOnWriteBlockSize - 1) / CopyOnWriteBlockSize
}

// blockRange is block b's byte range [start, end).
func (o *overlay) blockRange(b uint64) (start, end uint64) {
	start = b * CopyOnWriteBlockSize
	return start, min(start+CopyOnWriteBlockSize, o.size)
}

// has reports whether the overlay holds block b.
func (o *overlay) has(b uint64) bool {
	return o.present[b/64].Load()&(1<<(b%64)) != 0
}

// set marks block b as held by the overlay. The caller holds b's stripe
// lock and has seen the bit clear under it.
func (o *overlay) set(b uint64) {
	o.present[b/64].Or(1 << (b % 64))
	o.written.Add(1)
}

// errRange is a range beyond the disk reaching the overlay: parseRequest
// and parseSegment bound every request by the capacity, so it means a
// host-side bug, answered IOERR rather than a panic on the bitmap.
var errRange = errors.New("range beyond the disk (a device bug)")

func (o *overlay) checkRange(off, n uint64) error {
	if off > o.size || n > o.size-off {
		return fmt.Errorf("copy-on-write: %d bytes at %d: %w", n, off, errRange)
	}
	return nil
}

// read fills views (n bytes in all) with the disk's bytes from off: runs
// of consecutive blocks the overlay holds from the overlay, the other
// runs from the base, one preadv each. sub is scratch space for the
// views of a run; read returns it for reuse.
func (o *overlay) read(views [][]byte, off, n uint64, sub [][]byte) ([][]byte, error) {
	if err := o.checkRange(off, n); err != nil {
		return sub, err
	}
	cur := viewCursor{views: views}
	end := off + n
	for pos := off; pos < end; {
		b := pos / CopyOnWriteBlockSize
		inOverlay := o.has(b)
		_, runEnd := o.blockRange(b)
		for runEnd < end && o.has(runEnd/CopyOnWriteBlockSize) == inOverlay {
			_, runEnd = o.blockRange(runEnd / CopyOnWriteBlockSize)
		}
		runEnd = min(runEnd, end)
		fd := o.base
		if inOverlay {
			fd = o.fd
		}
		sub = cur.take(sub[:0], runEnd-pos)
		err := fullIO(unix.Preadv, fd, sub, int64(pos))
		clear(sub) // drop references to guest memory
		if err != nil {
			return sub, fmt.Errorf("copy-on-write: read %d bytes at %d from the %s: %w", runEnd-pos, pos, layerName(inOverlay), err)
		}
		pos = runEnd
	}
	return sub, nil
}

func layerName(inOverlay bool) string {
	if inOverlay {
		return "overlay"
	}
	return "base"
}

// write writes views (n bytes in all) at off into the overlay, after
// making it hold every block the range touches (prepare). block is
// scratch space of CopyOnWriteBlockSize bytes.
func (o *overlay) write(views [][]byte, off, n uint64, block []byte) error {
	if err := o.prepare(off, n, block); err != nil || n == 0 {
		return err
	}
	if err := fullIO(unix.Pwritev, o.fd, views, int64(off)); err != nil {
		return fmt.Errorf("copy-on-write: write %d bytes at %d into the overlay: %w", n, off, err)
	}
	return nil
}

// prepare makes the overlay hold every block [off, off+n) touches: blocks
// the range covers whole are claimed, the one or two it covers in part
// are copied up from the base.
func (o *overlay) prepare(off, n uint64, block []byte) error {
	if err := o.checkRange(off, n); err != nil || n == 0 {
		return err
	}
	end := off + n
	for b := off / CopyOnWriteBlockSize; b <= (end-1)/CopyOnWriteBlockSize; b++ {
		if o.has(b) {
			continue
		}
		start, bend := o.blockRange(b)
		if off <= start && end >= bend {
			o.claim(b)
			continue
		}
		if err := o.copyUp(b, block); err != nil {
			return err
		}
	}
	return nil
}

// claim makes the overlay hold block b, whose content the caller's
// request is about to write whole (see the type's comment for why under
// the stripe lock).
func (o *overlay) claim(b uint64) {
	mu := &o.stripes[b%cowStripes]
	mu.Lock()
	if !o.has(b) {
		o.set(b)
	}
	mu.Unlock()
}

// copyUp copies block b from the base into the overlay unless the
// overlay holds it already, holding b's stripe lock across the copy (see
// the type's comment).
func (o *overlay) copyUp(b uint64, block []byte) error {
	mu := &o.stripes[b%cowStripes]
	mu.Lock()
	defer mu.Unlock()
	if o.has(b) {
		return nil
	}
	start, end := o.blockRange(b)
	buf := block[:end-start]
	if err := fullIO(unix.Preadv, o.base, [][]byte{buf}, int64(start)); err != nil {
		return fmt.Errorf("copy-on-write: copy block %d: read the base: %w", b, err)
	}
	if err := fullIO(unix.Pwritev, o.fd, [][]byte{buf}, int64(start)); err != nil {
		return fmt.Errorf("copy-on-write: copy block %d: write the overlay: %w", b, err)
	}
	o.set(b)
	return nil
}

// writeZeroes makes [off, off+n) read as zeros: the overlay takes the
// blocks (prepare), then the range is zeroed in the overlay as on a plain
// image (zeroRange). unmap lets it punch a hole.
func (o *overlay) writeZeroes(off, n uint64, unmap bool, block []byte) error {
	if err := o.prepare(off, n, block); err != nil || n == 0 {
		return err
	}
	if err := zeroRange(o.fd, int64(off), int64(n), unmap); err != nil {
		return fmt.Errorf("copy-on-write overlay: %w", err)
	}
	return nil
}

// discard drops the blocks [off, off+n) covers whole: the overlay claims
// them and punches a hole over them, so they read as zeros and take no
// space in the overlay. Blocks the range covers in part keep their
// content: discard is a hint (5.2.6.2), and the device advertises a 4 KiB
// discard alignment, so drivers rarely send them.
func (o *overlay) discard(off, n uint64) error {
	if err := o.checkRange(off, n); err != nil {
		return err
	}
	end := off + n
	first := (off + CopyOnWriteBlockSize - 1) / CopyOnWriteBlockSize
	last := end / CopyOnWriteBlockSize // one past the last whole block
	if end == o.size {
		last = o.blocks() // the disk's last block, however short, ends at end
	}
	if first >= last {
		return nil
	}
	for b := first; b < last; b++ {
		if !o.has(b) {
			o.claim(b)
		}
	}
	start, _ := o.blockRange(first)
	_, stop := o.blockRange(last - 1)
	if err := discardRange(o.fd, int64(start), int64(stop-start)); err != nil {
		return fmt.Errorf("copy-on-write overlay: %w", err)
	}
	return nil
}

// viewCursor hands out consecutive byte ranges of a list of views, as
// views of their own, without copying.
type viewCursor struct {
	views [][]byte
	i, at int // the next byte: views[i][at]
}

// take appends views of the next n bytes (or what is left) to dst.
func (c *viewCursor) take(dst [][]byte, n uint64) [][]byte {
	for n > 0 && c.i < len(c.views) {
		v := c.views[c.i][c.at:]
		k := int(min(uint64(len(v)), n))
		if k > 0 {
			dst = append(dst, v[:k])
		}
		n -= uint64(k)
		c.at += k
		if c.at == len(c.views[c.i]) {
			c.i++
			c.at = 0
		}
	}
	return dst
}
