package blk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"

	"github.com/microvm/microvm/virtio"
)

// A copy-on-write disk's overlay in a snapshot (Device.SaveDeviceData,
// RestoreDeviceData). The saved form is a stream, written once and read
// once from start to end:
//
//	overlayHeader (32 bytes, little-endian)
//	the bitmap: one little-endian uint64 per 64 blocks (overlay.present)
//	each block the bitmap has set, in ascending order, packed (the
//	disk's last block as short as it is)
//
// It is microvm's own format, not a kernel layout; the magic carries its
// version. Its size is the header, the bitmap and the written blocks: a
// snapshot holds what the guest wrote, never the base. A restore checks
// the header against the disk it opened (block size, size), the bitmap
// (no bits past the disk's end, as many set as the header says) and the
// length of the data (neither short nor long), and writes the blocks into
// a fresh overlay; blocks all zeros stay holes there.

// overlayMagic starts a saved overlay; its last two bytes are the format's
// version.
const overlayMagic = "MVMCOW01"

// overlayHeader is the start of a saved overlay.
type overlayHeader struct {
	Magic     [8]byte
	BlockSize uint32
	_         uint32
	Size      uint64 // the disk's size in bytes
	Written   uint64 // blocks the bitmap has set
}

// overlayHeaderSize is binary.Size(overlayHeader{}).
const overlayHeaderSize = 32

// errBadOverlay is wrapped by every refusal of a saved overlay; it wraps
// virtio.ErrBadState.
var errBadOverlay = fmt.Errorf("%w: saved copy-on-write overlay", virtio.ErrBadState)

// saved returns a reader of the overlay's saved form. The caller keeps the
// device quiesced until the reader is read to its end: the bitmap is
// copied now, the blocks are read from the overlay file as the reader
// reaches them.
func (o *overlay) saved() io.Reader {
	words := make([]uint64, len(o.present))
	var n uint64
	for i := range o.present {
		words[i] = o.present[i].Load()
		n += uint64(bits.OnesCount64(words[i]))
	}
	h := overlayHeader{BlockSize: CopyOnWriteBlockSize, Size: o.size, Written: n}
	copy(h.Magic[:], overlayMagic)
	var head bytes.Buffer
	_ = binary.Write(&head, binary.LittleEndian, &h)
	_ = binary.Write(&head, binary.LittleEndian, words)
	return io.MultiReader(&head, &overlayBlocks{o: o, words: words})
}

// overlayBlocks reads the blocks a bitmap has set from an overlay's file,
// run by run.
type overlayBlocks struct {
	o     *overlay
	words []uint64
	next  uint64            // the first block not yet considered
	run   *io.SectionReader // the current run of set blocks, nil between runs
}

func (r *overlayBlocks) Read(p []byte) (int, error) {
	for {
		if r.run != nil {
			n, err := r.run.Read(p)
			if err == io.EOF {
				r.run, err = nil, nil
				if n == 0 {
					continue
				}
			}
			return n, err
		}
		first, end, ok := nextRun(r.words, r.next, r.o.blocks())
		if !ok {
			return 0, io.EOF
		}
		r.next = end
		start, _ := r.o.blockRange(first)
		_, stop := r.o.blockRange(end - 1)
		r.run = io.NewSectionReader(r.o.file, int64(start), int64(stop-start))
	}
}

// nextRun returns the first run [first, end) of blocks set in words at or
// after block from, below limit.
func nextRun(words []uint64, from, limit uint64) (first, end uint64, ok bool) {
	isSet := func(b uint64) bool { return words[b/64]&(1<<(b%64)) != 0 }
	b := from
	for b < limit && !isSet(b) {
		if b%64 == 0 && words[b/64] == 0 {
			b += 64
			continue
		}
		b++
	}
	if b >= limit {
		return 0, 0, false
	}
	first = b
	for b < limit && isSet(b) {
		b++
	}
	return first, b, true
}

// restore fills a fresh overlay (no block written, the device never
// activated) from r, a saved overlay, read to its end. On an error the
// overlay may hold some of the data but its bitmap is unchanged: the
// device reads as its base, and the caller discards it.
func (o *overlay) restore(r io.Reader) error {
	if o.written.Load() != 0 {
		return errors.New("blk: restore into an overlay already written (a device bug)")
	}
	var h overlayHeader
	if err := binary.Read(r, binary.LittleEndian, &h); err != nil {
		return fmt.Errorf("%w: header: %w", errBadOverlay, err)
	}
	switch {
	case string(h.Magic[:]) != overlayMagic:
		return fmt.Errorf("%w: magic %q, want %q", errBadOverlay, h.Magic[:], overlayMagic)
	case h.BlockSize != CopyOnWriteBlockSize:
		return fmt.Errorf("%w: block size %d, want %d", errBadOverlay, h.BlockSize, CopyOnWriteBlockSize)
	case h.Size != o.size:
		return fmt.Errorf("%w: saved for a disk of %d bytes; this one has %d", errBadOverlay, h.Size, o.size)
	}
	words := make([]uint64, len(o.present))
	if err := binary.Read(r, binary.LittleEndian, words); err != nil {
		return fmt.Errorf("%w: bitmap: %w", errBadOverlay, err)
	}
	var n uint64
	for _, w := range words {
		n += uint64(bits.OnesCount64(w))
	}
	if tail := o.blocks() % 64; tail != 0 && words[len(words)-1]>>tail != 0 {
		return fmt.Errorf("%w: bitmap has blocks past the disk's %d", errBadOverlay, o.blocks())
	}
	if n != h.Written {
		return fmt.Errorf("%w: bitmap has %d blocks, header says %d", errBadOverlay, n, h.Written)
	}
	buf := make([]byte, CopyOnWriteBlockSize)
	for b := uint64(0); ; {
		first, end, ok := nextRun(words, b, o.blocks())
		if !ok {
			break
		}
		for blk := first; blk < end; blk++ {
			start, stop := o.blockRange(blk)
			data := buf[:stop-start]
			if _, err := io.ReadFull(r, data); err != nil {
				return fmt.Errorf("%w: block %d: %w", errBadOverlay, blk, noEOF(err))
			}
			if isZeroBlock(data) {
				continue // the fresh overlay's hole reads as zeros
			}
			if _, err := o.file.WriteAt(data, int64(start)); err != nil {
				return fmt.Errorf("copy-on-write overlay: restore block %d: %w", blk, unwrapPath(err))
			}
		}
		b = end
	}
	var extra [1]byte
	if k, err := io.ReadFull(r, extra[:]); k != 0 || err != io.EOF {
		if k != 0 {
			return fmt.Errorf("%w: data past the last block", errBadOverlay)
		}
		return fmt.Errorf("%w: %w", errBadOverlay, err) // a checksum's verdict at the end
	}
	for i, w := range words {
		o.present[i].Store(w)
	}
	o.written.Store(n)
	return nil
}

// noEOF turns a reader's end into io.ErrUnexpectedEOF: a saved overlay
// that ends inside its data is truncated.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func isZeroBlock(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
