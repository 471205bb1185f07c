package snapshot

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"slices"
)

// AddMemoryDiff adds a memory diff part: the pages of mem that dirty marks
// (bit i%64 of dirty[i/64] set: page i was written since the base, as
// KVM_GET_DIRTY_LOG reports), against the snapshot whose Digest is base
// (Writer.Digest or Snapshot.Digest of the previous snapshot). dirty has
// exactly one bit per page of mem, in whole words; bits past the last page
// are zero. Pages the VMM itself wrote (device models, which KVM's dirty
// log does not see) must be marked too.
//
// The file holds the bitmap (little-endian words) followed by the dirty
// pages, in ascending order, packed; its SHA-256 is over all of it.
func (w *Writer) AddMemoryDiff(name, base string, mem []byte, dirty []uint64) error {
	if err := w.usable(); err != nil {
		return err
	}
	size := int64(len(mem))
	if err := checkMemorySize(size); err != nil {
		return fmt.Errorf("snapshot %s: part %q: %w", w.dir, name, err)
	}
	if !isDigest(base) {
		return fmt.Errorf("snapshot %s: part %q: base %.80q is not a snapshot digest", w.dir, name, base)
	}
	npages := size / PageSize
	if want := bitmapBytes(size) / 8; int64(len(dirty)) != want {
		return fmt.Errorf("snapshot %s: part %q: dirty bitmap of %d words, want %d for %d pages", w.dir, name, len(dirty), want, npages)
	}
	pages, err := countDirty(dirty, npages)
	if err != nil {
		return fmt.Errorf("snapshot %s: part %q: %w", w.dir, name, err)
	}
	f, p, err := w.newPart(name, KindMemoryDiff, ".diff")
	if err != nil {
		return err
	}
	p.MemorySize, p.Pages, p.Base = size, pages, base
	p.Size = bitmapBytes(size) + pages*PageSize
	h := sha256.New()
	out := io.MultiWriter(f, h)
	_, err = out.Write(encodeBitmap(dirty))
	if err == nil {
		err = forEachRun(dirty, npages, func(first, n int64) error {
			for off, end := first*PageSize, (first+n)*PageSize; off < end; off += chunk {
				if _, err := out.Write(mem[off:min(end, off+chunk)]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	p.SHA256 = hex.EncodeToString(h.Sum(nil))
	return w.finishPart(f, p, err)
}

// ApplyDiff copies the memory diff part called name into mem, which holds
// base's memory of that name (base.MapMemory, or a chain up to base). The
// diff must have been taken against base (its digest) and be of mem's
// size, or it is refused before mem is touched (ErrWrongBase). Its SHA-256
// is checked as it is read; when it fails (ErrCorrupt, ErrTruncated) mem
// holds part of the diff and must be discarded: MapMemoryChain does.
func (s *Snapshot) ApplyDiff(mem []byte, name string, base *Snapshot) error {
	op, err := s.lookup(name, KindMemoryDiff)
	if err != nil {
		return err
	}
	if base == nil {
		return partErrorf(s.dir, &op.Part, "%w: no base given", ErrWrongBase)
	}
	if op.Base != base.Digest() {
		return partErrorf(s.dir, &op.Part, "%w: taken against snapshot %.12s, not %s (%.12s)", ErrWrongBase, op.Base, base.Dir(), base.Digest())
	}
	bp, ok := base.parts[name]
	if !ok || bp.Kind != KindMemory && bp.Kind != KindMemoryDiff || bp.MemorySize != op.MemorySize {
		return partErrorf(s.dir, &op.Part, "%w: %s has no memory part %q of %d bytes", ErrWrongBase, base.Dir(), name, op.MemorySize)
	}
	if int64(len(mem)) != op.MemorySize {
		return partErrorf(s.dir, &op.Part, "applied to %d bytes of memory, the diff is of %d", len(mem), op.MemorySize)
	}
	raw, err := readBitmap(op.f, &op.Part)
	if err != nil {
		return partErrorf(s.dir, &op.Part, "%w", err)
	}
	dirty := decodeBitmap(raw)
	h := sha256.New()
	h.Write(raw)
	pos := int64(len(raw))
	err = forEachRun(dirty, op.MemorySize/PageSize, func(first, n int64) error {
		for off, end := first*PageSize, (first+n)*PageSize; off < end; off += chunk {
			b := mem[off:min(end, off+chunk)]
			if _, err := op.f.ReadAt(b, pos); err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("%w: %w", ErrTruncated, err)
				}
				return err
			}
			h.Write(b)
			pos += int64(len(b))
		}
		return nil
	})
	if err != nil {
		return partErrorf(s.dir, &op.Part, "read (memory now partly written): %w", err)
	}
	if hex.EncodeToString(h.Sum(nil)) != op.SHA256 {
		return partErrorf(s.dir, &op.Part, "%w: content does not match its SHA-256 (memory now partly written)", ErrCorrupt)
	}
	return nil
}

// MapMemoryChain maps the memory part called name of chain[0] (MapMemory)
// and applies onto it the memory diff of that name of each later
// snapshot, each taken against the one before it. On any failure it
// unmaps what it mapped and returns nil: no partly restored memory is ever
// handed out. The result is released with Unmap.
func MapMemoryChain(name string, chain ...*Snapshot) ([]byte, error) {
	if len(chain) == 0 || slices.Contains(chain, nil) {
		return nil, errors.New("snapshot: MapMemoryChain: a nil or empty chain")
	}
	mem, err := chain[0].MapMemory(name)
	if err != nil {
		return nil, err
	}
	for i := 1; i < len(chain); i++ {
		if err := chain[i].ApplyDiff(mem, name, chain[i-1]); err != nil {
			Unmap(mem)
			return nil, err
		}
	}
	return mem, nil
}

// readBitmap reads a memory diff's bitmap and checks it against p: as
// many bits set as p.Pages, none past the last page.
func readBitmap(f *os.File, p *Part) ([]byte, error) {
	raw := make([]byte, bitmapBytes(p.MemorySize))
	if _, err := f.ReadAt(raw, 0); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: %w", ErrTruncated, err)
		}
		return nil, fmt.Errorf("read bitmap: %w", err)
	}
	n, err := countDirty(decodeBitmap(raw), p.MemorySize/PageSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if n != p.Pages {
		return nil, fmt.Errorf("%w: bitmap marks %d pages, the manifest says %d", ErrCorrupt, n, p.Pages)
	}
	return raw, nil
}

// countDirty counts the pages marked in a bitmap of npages pages and
// refuses bits set past the last.
func countDirty(dirty []uint64, npages int64) (int64, error) {
	var n int64
	for i, w := range dirty {
		rest := npages - int64(i)*64 // pages this word covers, if under 64
		if rest <= 0 && w != 0 || rest > 0 && rest < 64 && w>>uint(rest) != 0 {
			return 0, fmt.Errorf("dirty bitmap marks pages past the last (%d)", npages-1)
		}
		n += int64(bits.OnesCount64(w))
	}
	return n, nil
}

// forEachRun calls fn for each run of consecutive pages marked in dirty,
// in ascending order: its first page and its length.
func forEachRun(dirty []uint64, npages int64, fn func(first, n int64) error) error {
	for i := int64(0); i < npages; {
		// The next marked page at or after i.
		if w := dirty[i/64] >> (i % 64); w == 0 {
			i = (i/64 + 1) * 64
			continue
		} else {
			i += int64(bits.TrailingZeros64(w))
		}
		if i >= npages {
			break
		}
		// The next unmarked page after i.
		j := i + 1
		for j < npages {
			w := ^dirty[j/64] >> (j % 64)
			if w == 0 {
				j = (j/64 + 1) * 64
				continue
			}
			j += int64(bits.TrailingZeros64(w))
			break
		}
		j = min(j, npages)
		if err := fn(i, j-i); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// encodeBitmap lays out words little-endian, as the file holds them.
func encodeBitmap(words []uint64) []byte {
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	return b
}

func decodeBitmap(b []byte) []uint64 {
	words := make([]uint64, len(b)/8)
	for i := range words {
		words[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return words
}
