package blk

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// testOverlay is an overlay over a base image of size pattern bytes, with
// the image's descriptor read-only; it returns the image's bytes too.
func testOverlay(tb testing.TB, size int) (*overlay, []byte) {
	tb.Helper()
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	p := filepath.Join(tb.TempDir(), "base.img")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	o, err := newOverlay(int(f.Fd()), uint64(size), tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { o.close() })
	return o, b
}

// split cuts p into views at up to 3 points derived from seed. Like the
// virtio cursors' Views, it makes no empty views (fullIO would take a
// trailing one for the end of the file).
func split(p []byte, seed byte) [][]byte {
	var views [][]byte
	for i := 0; i < 3 && len(p) > 0; i++ {
		k := int(seed) * (i + 3) % (len(p) + 1)
		if k > 0 {
			views = append(views, p[:k])
		}
		p = p[k:]
	}
	if len(p) > 0 {
		views = append(views, p)
	}
	return views
}

// FuzzOverlay runs a sequence of reads, writes, write-zeroes and discards
// on an overlay (9 blocks and a 3-sector one) and checks each read, and
// the whole disk after each operation, against a byte slice model. Each
// operation is 4 bytes: kind, first sector, sectors, a seed for the data
// and for where the data's views are cut.
func FuzzOverlay(f *testing.F) {
	f.Add([]byte{1, 1, 1, 7, 0, 0, 10, 3})                // partial write, read over it
	f.Add([]byte{1, 0, 8, 1, 1, 8, 16, 2, 0, 0, 75, 9})   // whole blocks, then a full read
	f.Add([]byte{2, 5, 10, 0, 3, 8, 24, 0, 0, 0, 75, 1})  // zeroes, discard
	f.Add([]byte{1, 72, 3, 4, 3, 70, 5, 0, 0, 60, 15, 2}) // the short last block
	f.Add([]byte{4, 74, 1, 4, 2, 0, 0, 1, 1, 3, 0, 9})    // unmap zeroes, empty ranges
	f.Fuzz(func(t *testing.T, ops []byte) {
		const size = 9*CopyOnWriteBlockSize + 3*SectorSize
		const sectors = size / SectorSize
		o, model := testOverlay(t, size)
		block := make([]byte, CopyOnWriteBlockSize)
		var sub [][]byte
		disk := make([]byte, size)
		for ; len(ops) >= 4; ops = ops[4:] {
			kind, seed := ops[0]%5, ops[3]
			s := int(ops[1]) % sectors
			n := int(ops[2]) % (sectors - s + 1)
			lo, hi := s*SectorSize, (s+n)*SectorSize
			var err error
			switch kind {
			case 0:
				got := make([]byte, hi-lo)
				sub, err = o.read(split(got, seed), uint64(lo), uint64(hi-lo), sub)
				if err == nil && !bytes.Equal(got, model[lo:hi]) {
					t.Fatalf("read %d+%d differs from the model", s, n)
				}
			case 1:
				data := make([]byte, hi-lo)
				for i := range data {
					data[i] = seed + byte(i/SectorSize)
				}
				err = o.write(split(data, seed), uint64(lo), uint64(hi-lo), block)
				copy(model[lo:], data)
			case 2, 4:
				err = o.writeZeroes(uint64(lo), uint64(hi-lo), kind == 4, block)
				clear(model[lo:hi])
			case 3:
				err = o.discard(uint64(lo), uint64(hi-lo))
				first, end := (lo+CopyOnWriteBlockSize-1)/CopyOnWriteBlockSize*CopyOnWriteBlockSize, hi/CopyOnWriteBlockSize*CopyOnWriteBlockSize
				if hi == size {
					end = size
				}
				if first < end {
					clear(model[first:end])
				}
			}
			if err != nil {
				t.Fatalf("op %d at %d+%d: %v", kind, s, n, err)
			}
			if sub, err = o.read([][]byte{disk}, 0, size, sub); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(disk, model) {
				t.Fatalf("after op %d at %d+%d the disk differs from the model", kind, s, n)
			}
		}
	})
}

// TestOverlayConcurrentPartialWrites: requests in flight together that
// write different sectors of the same blocks all keep their bytes: one
// copy-up per block (the stripe lock), never a second one over a write.
func TestOverlayConcurrentPartialWrites(t *testing.T) {
	const blocks, writers = 64, CopyOnWriteBlockSize / SectorSize
	for round := range 20 {
		o, base := testOverlay(t, blocks*CopyOnWriteBlockSize)
		var wg sync.WaitGroup
		for k := range writers {
			wg.Go(func() {
				block := make([]byte, CopyOnWriteBlockSize)
				data := bytes.Repeat([]byte{byte(k + 1)}, SectorSize)
				for _, b := range rand.Perm(blocks) {
					off := uint64(b*CopyOnWriteBlockSize + k*SectorSize)
					if err := o.write([][]byte{data}, off, SectorSize, block); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		got := make([]byte, len(base))
		if _, err := o.read([][]byte{got}, 0, uint64(len(got)), nil); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if want := byte(i%CopyOnWriteBlockSize/SectorSize + 1); v != want {
				t.Fatalf("round %d: byte %d (block %d, sector %d) is %#x; want %#x: a write was lost",
					round, i, i/CopyOnWriteBlockSize, i%CopyOnWriteBlockSize/SectorSize, v, want)
			}
		}
		if n := o.written.Load(); n != blocks {
			t.Fatalf("round %d: %d blocks counted written; want %d", round, n, blocks)
		}
	}
}

// TestOverlayClaimRacesCopyUp: a write of whole blocks and a write of one
// sector of each of them, in flight together, leave each block as one of
// the two orders would (the whole write, with or without the sector's
// bytes over it), never the image's bytes around the sector: the claim
// takes the stripe lock, so a copy-up cannot write the base over a block
// claimed meanwhile.
func TestOverlayClaimRacesCopyUp(t *testing.T) {
	const blocks = 64
	for round := range 30 {
		o, _ := testOverlay(t, blocks*CopyOnWriteBlockSize)
		var wg sync.WaitGroup
		wg.Go(func() {
			data := bytes.Repeat([]byte{0xaa}, CopyOnWriteBlockSize)
			for _, b := range rand.Perm(blocks) {
				if err := o.write([][]byte{data}, uint64(b*CopyOnWriteBlockSize), CopyOnWriteBlockSize, nil); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Go(func() {
			block := make([]byte, CopyOnWriteBlockSize)
			data := bytes.Repeat([]byte{0xbb}, SectorSize)
			for _, b := range rand.Perm(blocks) {
				if err := o.write([][]byte{data}, uint64(b*CopyOnWriteBlockSize+3*SectorSize), SectorSize, block); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Wait()
		got := make([]byte, blocks*CopyOnWriteBlockSize)
		if _, err := o.read([][]byte{got}, 0, uint64(len(got)), nil); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			inSector := i%CopyOnWriteBlockSize/SectorSize == 3
			if v != 0xaa && (!inSector || v != 0xbb) {
				t.Fatalf("round %d: byte %d (block %d) is %#x: the whole-block write was lost", round, i, i/CopyOnWriteBlockSize, v)
			}
		}
	}
}

// TestOverlayRange: a range beyond the disk (which parseRequest never lets
// through) is an error, not a panic on the bitmap.
func TestOverlayRange(t *testing.T) {
	o, _ := testOverlay(t, 2*CopyOnWriteBlockSize)
	buf := make([]byte, SectorSize)
	block := make([]byte, CopyOnWriteBlockSize)
	for _, r := range []struct{ off, n uint64 }{{2 * CopyOnWriteBlockSize, 1}, {^uint64(0), 2}, {CopyOnWriteBlockSize, ^uint64(0)}} {
		if _, err := o.read([][]byte{buf}, r.off, r.n, nil); !errors.Is(err, errRange) {
			t.Errorf("read %d at %d: %v", r.n, r.off, err)
		}
		if err := o.write([][]byte{buf}, r.off, r.n, block); !errors.Is(err, errRange) {
			t.Errorf("write %d at %d: %v", r.n, r.off, err)
		}
		if err := o.writeZeroes(r.off, r.n, true, block); !errors.Is(err, errRange) {
			t.Errorf("write zeroes %d at %d: %v", r.n, r.off, err)
		}
		if err := o.discard(r.off, r.n); !errors.Is(err, errRange) {
			t.Errorf("discard %d at %d: %v", r.n, r.off, err)
		}
	}
}

// TestOverlayNoTmpfile: where O_TMPFILE fails as on a file system without
// it, the overlay is created with a name and unlinked at once; other
// errors are reported, not worked around.
func TestOverlayNoTmpfile(t *testing.T) {
	orig := openTmpfile
	t.Cleanup(func() { openTmpfile = orig })
	for _, errno := range []unix.Errno{unix.EOPNOTSUPP, unix.EISDIR, unix.EINVAL} {
		openTmpfile = func(string) (int, error) { return -1, errno }
		dir := t.TempDir()
		f, err := createUnlinked(dir)
		if err != nil {
			t.Fatalf("%v: %v", errno, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Nlink != 0 {
			t.Errorf("%v: the fallback overlay has %d links (%v); want 0", errno, st.Nlink, err)
		}
		f.Close()
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%v: the fallback left %d entries in the directory", errno, len(ents))
		}
	}
	openTmpfile = func(string) (int, error) { return -1, unix.EACCES }
	if f, err := createUnlinked(t.TempDir()); !errors.Is(err, unix.EACCES) {
		if f != nil {
			f.Close()
		}
		t.Errorf("O_TMPFILE refused with EACCES: %v; want the error", err)
	}
}

// TestOverlayNoGrowth: once blocks are in the overlay, reads over mixed
// runs and writes allocate nothing: the bitmap is all the memory the
// overlay keeps, whatever the guest does.
func TestOverlayNoGrowth(t *testing.T) {
	o, _ := testOverlay(t, 64*CopyOnWriteBlockSize)
	block := make([]byte, CopyOnWriteBlockSize)
	data := make([]byte, 8*CopyOnWriteBlockSize)
	for b := 0; b < 64; b += 2 {
		if err := o.write([][]byte{data[:SectorSize]}, uint64(b*CopyOnWriteBlockSize+SectorSize), SectorSize, block); err != nil {
			t.Fatal(err)
		}
	}
	views := [][]byte{data[:5000], data[5000:]}
	sub := make([][]byte, 0, 8)
	var err error
	allocs := testing.AllocsPerRun(50, func() {
		if sub, err = o.read(views, 3*SectorSize, uint64(len(data)), sub); err != nil {
			t.Fatal(err)
		}
		if err = o.write(views, 2*CopyOnWriteBlockSize+SectorSize, 4*CopyOnWriteBlockSize, block); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per read and write; want 0", allocs)
	}
}
