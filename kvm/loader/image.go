package loader

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"

	"github.com/microvm/microvm/kvm/guestmem"
)

// Image is a kernel or initrd file: where to read it, how long it is, and the
// name error messages use for it (usually its path).
type Image struct {
	Name string
	R    io.ReaderAt
	Size int64
}

// FileImage describes an open file as an Image. The caller keeps the file
// open until Load returns and closes it afterwards.
func FileImage(f *os.File) (Image, error) {
	st, err := f.Stat()
	if err != nil {
		return Image{}, fmt.Errorf("loader: %w", err)
	}
	if !st.Mode().IsRegular() {
		return Image{}, bad(ErrConfig, "not a regular file")
	}
	return Image{Name: f.Name(), R: f, Size: st.Size()}, nil
}

// BytesImage describes an in-memory image.
func BytesImage(name string, b []byte) Image {
	return Image{Name: name, R: bytes.NewReader(b), Size: int64(len(b))}
}

// maxImage bounds kernel and initrd sizes: nothing larger fits below 4 GiB,
// where every image must go.
const maxImage = fourGiB

// readAt reads exactly n bytes at off, after checking the range is inside the
// file, so that a lying header yields ErrMalformed rather than a short read.
func readAt(img Image, off, n uint64, what string) ([]byte, error) {
	end, carry := bits.Add64(off, n, 0)
	if carry != 0 || end > uint64(img.Size) {
		return nil, bad(ErrMalformed, "%s at %#x+%#x runs past the end of the file (%d bytes)", what, off, n, img.Size)
	}
	if n > maxImage {
		return nil, bad(ErrMalformed, "%s of %d bytes is absurd", what, n)
	}
	p := make([]byte, n)
	if err := readFull(img.R, p, off); err != nil {
		return nil, fmt.Errorf("read %s at %#x: %w", what, off, err)
	}
	return p, nil
}

// readFull is ReadAt that treats a short read as an error, whatever the
// reader returned with it.
func readFull(r io.ReaderAt, p []byte, off uint64) error {
	if off > 1<<62 {
		return io.ErrUnexpectedEOF
	}
	n, err := r.ReadAt(p, int64(off))
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// copyChunk bounds how much guest memory one ReadAt targets.
const copyChunk = 1 << 20

// copyIn reads n bytes of the file at off straight into guest memory at gpa,
// through bounded views of at most copyChunk bytes that never cross a region.
func copyIn(mem *guestmem.Memory, gpa uint64, r io.ReaderAt, off, n uint64) error {
	if !inRAM(mem, gpa, n) {
		return fmt.Errorf("%w: %#x+%#x", guestmem.ErrOutOfBounds, gpa, n)
	}
	ranges := mem.Ranges()
	for done := uint64(0); done < n; {
		at := gpa + done
		step := min(n-done, copyChunk)
		for _, rg := range ranges {
			if at >= rg.GPA && at < rg.End() {
				step = min(step, rg.End()-at)
			}
		}
		view, err := mem.Slice(at, step)
		if err != nil {
			return err
		}
		if err := readFull(r, view, off+done); err != nil {
			return fmt.Errorf("read at %#x: %w", off+done, err)
		}
		done += step
	}
	return nil
}

// inRAM reports whether [gpa, gpa+n) is entirely backed by guest memory
// (adjacent regions count as one).
func inRAM(mem *guestmem.Memory, gpa, n uint64) bool {
	end, carry := bits.Add64(gpa, n, 0)
	if carry != 0 {
		return false
	}
	at := gpa
	for _, rg := range mem.Ranges() { // sorted by address
		if at >= rg.GPA && at < rg.End() {
			if end <= rg.End() {
				return true
			}
			at = rg.End() // continue into an adjacent region
		}
	}
	return false
}

// lowRAMEnd returns the end of the RAM that is contiguous from 1 MiB, capped
// at the MMIO gap: the space kernels, initrds and 32-bit pointers can use.
func lowRAMEnd(mem *guestmem.Memory) (uint64, error) {
	end := uint64(0)
	for _, rg := range mem.Ranges() {
		if rg.GPA <= highMem && rg.End() > highMem {
			end = rg.End()
		} else if end != 0 && rg.GPA == end {
			end = rg.End()
		}
	}
	if end == 0 {
		return 0, bad(ErrConfig, "guest memory has no RAM at 1 MiB")
	}
	return min(end, mmioGap), nil
}
