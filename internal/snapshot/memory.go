package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// chunk bounds the bytes hashed before they are written (or read before
// they are hashed), so that the second pass over them finds them in cache.
const chunk = 1 << 20

// zeroPage is compared against, never written.
var zeroPage [PageSize]byte

// isZero reports whether page (PageSize bytes) is all zero.
func isZero(page []byte) bool { return bytes.Equal(page, zeroPage[:]) }

// memDigest is the checksum of a memory part: SHA-256 over
//
//	"microvm-snapshot memory v1\n" || size (u64 LE)
//	|| for each page holding a non-zero byte, in ascending order:
//	   its offset (u64 LE) || its PageSize bytes
//
// It depends on the memory's content alone, not on where the file system
// keeps holes (a copy may fill them or punch more), and costs the writer
// nothing for zero pages beyond seeing that they are zero.
type memDigest struct {
	h   hash.Hash
	buf [8]byte
}

func newMemDigest(size int64) *memDigest {
	d := &memDigest{h: sha256.New()}
	d.h.Write([]byte("microvm-snapshot memory v1\n"))
	d.u64(uint64(size))
	return d
}

func (d *memDigest) u64(v uint64) {
	binary.LittleEndian.PutUint64(d.buf[:], v)
	d.h.Write(d.buf[:])
}

// page adds the non-zero page at off.
func (d *memDigest) page(off int64, page []byte) {
	d.u64(uint64(off))
	d.h.Write(page)
}

func (d *memDigest) sum() string { return hex.EncodeToString(d.h.Sum(nil)) }

// AddMemory adds a memory part: mem as a sparse file of len(mem) bytes in
// which all-zero pages are holes, never written, and each run of non-zero
// pages is written with pwrite. The part records how many bytes that was
// (Part.DataBytes) and the memory's digest (memDigest), which only Verify
// checks. len(mem) is a multiple of PageSize; mem must not change until
// AddMemory returns (pause the vCPUs and the devices).
func (w *Writer) AddMemory(name string, mem []byte) error {
	if err := w.usable(); err != nil {
		return err
	}
	if err := checkMemorySize(int64(len(mem))); err != nil {
		return fmt.Errorf("snapshot %s: part %q: %w", w.dir, name, err)
	}
	f, p, err := w.newPart(name, KindMemory, ".mem")
	if err != nil {
		return err
	}
	p.Size, p.MemorySize = int64(len(mem)), int64(len(mem))
	p.DataBytes, p.SHA256, err = writeSparse(f, mem)
	return w.finishPart(f, p, err)
}

// writeSparse writes mem's non-zero pages into f at their offsets, f
// having been sized to len(mem) first, and returns the bytes written and
// mem's digest.
func writeSparse(f *os.File, mem []byte) (int64, string, error) {
	if err := f.Truncate(int64(len(mem))); err != nil {
		return 0, "", err
	}
	d := newMemDigest(int64(len(mem)))
	var written int64
	run := -1 // offset of the run of non-zero pages being gathered
	flush := func(end int) error {
		n, err := f.WriteAt(mem[run:end], int64(run))
		written += int64(n)
		run = -1
		return err
	}
	for off := 0; off < len(mem); off += PageSize {
		page := mem[off : off+PageSize]
		if isZero(page) {
			if run >= 0 {
				if err := flush(off); err != nil {
					return written, "", err
				}
			}
			continue
		}
		d.page(int64(off), page)
		if run < 0 {
			run = off
		}
		if end := off + PageSize; end-run >= chunk {
			if err := flush(end); err != nil {
				return written, "", err
			}
		}
	}
	if run >= 0 {
		if err := flush(len(mem)); err != nil {
			return written, "", err
		}
	}
	return written, d.sum(), nil
}

// digestSparse computes the memDigest of the first size bytes of f,
// reading only its data (SEEK_DATA/SEEK_HOLE; all of it where the file
// system cannot tell). A file shorter than size is ErrTruncated.
func digestSparse(f *os.File, size int64) (string, error) {
	d := newMemDigest(size)
	buf := make([]byte, chunk)
	err := forEachDataRun(f, size, func(start, end int64) error {
		for off := start; off < end; {
			b := buf[:min(int64(len(buf)), end-off)]
			if _, err := f.ReadAt(b, off); err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("%w: file ends before byte %d", ErrTruncated, size)
				}
				return err
			}
			for i := 0; i < len(b); i += PageSize {
				if page := b[i : i+PageSize]; !isZero(page) {
					d.page(off+int64(i), page)
				}
			}
			off += int64(len(b))
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return d.sum(), nil
}

// forEachDataRun calls fn for each run of whole pages of the first size
// bytes of f that hold data, in order (SEEK_DATA/SEEK_HOLE; all of it
// where the file system cannot tell). It uses the offsets lseek returns,
// never the file's position, so it may run beside other readers of f.
func forEachDataRun(f *os.File, size int64, fn func(start, end int64) error) error {
	var next int64 // the first page not yet visited
	for next < size {
		data, err := f.Seek(next, unix.SEEK_DATA)
		hole := size
		switch {
		case errors.Is(err, syscall.ENXIO): // holes to the end
			data = size
		case err != nil: // SEEK_DATA unsupported: all of it
			data = next
		default:
			if h, err := f.Seek(data, unix.SEEK_HOLE); err == nil {
				hole = h
			}
		}
		if data >= size {
			return nil
		}
		// Whole pages: a file system may keep holes smaller than a page.
		start := max(next, data&^(PageSize-1))
		end := min(size, (hole+PageSize-1)&^(PageSize-1))
		if end <= start { // a file system reporting an empty data run
			end = min(size, start+PageSize)
		}
		if err := fn(start, end); err != nil {
			return err
		}
		next = max(end, start)
	}
	return nil
}
