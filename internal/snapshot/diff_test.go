package snapshot

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
)

// markDirty sets page i's bit.
func markDirty(dirty []uint64, i int) { dirty[i/64] |= 1 << (i % 64) }

// writeDiff commits at dir a snapshot holding the memory diff of mem
// against base for the pages listed.
func writeDiff(t testing.TB, dir, base string, mem []byte, pages []int) {
	t.Helper()
	dirty := make([]uint64, (len(mem)/PageSize+63)/64)
	for _, i := range pages {
		markDirty(dirty, i)
	}
	w, err := Create(dir)
	must(t, err)
	defer w.Abort()
	must(t, w.AddState("cpu0", testState()))
	must(t, w.AddMemoryDiff(memName, base, mem, dirty))
	must(t, w.Commit())
}

// TestDiffRoundTrip: base + diff1 + diff2 reproduces the latest memory
// exactly: pages changed, a page now zero, runs across bitmap words, the
// last page; the diff holds the dirty pages alone.
func TestDiffRoundTrip(t *testing.T) {
	parent := t.TempDir()
	mem := writeTest(t, filepath.Join(parent, "base"))
	base := mustOpen(t, filepath.Join(parent, "base"))

	// Diff 1: change pages 1 and 62..66 (across a word), zero page 100,
	// fill page 255 (the last) anew.
	dirty1 := []int{1, 62, 63, 64, 65, 66, 100, 255}
	for _, i := range dirty1 {
		fill(mem, i, byte(i))
	}
	clear(mem[100*PageSize : 101*PageSize])
	writeDiff(t, filepath.Join(parent, "d1"), base.Digest(), mem, dirty1)
	d1 := mustOpen(t, filepath.Join(parent, "d1"))
	if p, _ := d1.Part(memName); p.Pages != int64(len(dirty1)) || p.Size != 32+int64(len(dirty1))*PageSize {
		t.Errorf("diff part %+v: want %d pages after a 32-byte bitmap", p, len(dirty1))
	}
	want1 := bytes.Clone(mem)

	dirty2 := []int{0, 128}
	for _, i := range dirty2 {
		fill(mem, i, 0x33)
	}
	writeDiff(t, filepath.Join(parent, "d2"), d1.Digest(), mem, dirty2)
	d2 := mustOpen(t, filepath.Join(parent, "d2"))

	got, err := MapMemoryChain(memName, base, d1)
	must(t, err)
	if !bytes.Equal(got, want1) {
		t.Error("base + diff 1 differs from the memory diff 1 was taken of")
	}
	must(t, Unmap(got))
	got, err = MapMemoryChain(memName, base, d1, d2)
	must(t, err)
	defer Unmap(got)
	if !bytes.Equal(got, mem) {
		t.Error("base + diff 1 + diff 2 differs from the latest memory")
	}
	must(t, d1.Verify())
	must(t, d2.Verify())
}

// TestDiffWrongBase: a diff applied onto a snapshot other than its base,
// or skipping one of a chain, is refused before memory is touched.
func TestDiffWrongBase(t *testing.T) {
	parent := t.TempDir()
	mem := writeTest(t, filepath.Join(parent, "base"))
	base := mustOpen(t, filepath.Join(parent, "base"))
	writeTest(t, filepath.Join(parent, "other")) // same content, another snapshot
	other := mustOpen(t, filepath.Join(parent, "other"))
	fill(mem, 3, 9)
	writeDiff(t, filepath.Join(parent, "d1"), base.Digest(), mem, []int{3})
	d1 := mustOpen(t, filepath.Join(parent, "d1"))
	fill(mem, 4, 9)
	writeDiff(t, filepath.Join(parent, "d2"), d1.Digest(), mem, []int{4})
	d2 := mustOpen(t, filepath.Join(parent, "d2"))

	m, err := other.MapMemory(memName)
	must(t, err)
	defer Unmap(m)
	before := bytes.Clone(m)
	wantErr(t, d1.ApplyDiff(m, memName, other), ErrWrongBase)
	if !bytes.Equal(m, before) {
		t.Error("a refused diff touched memory")
	}
	if got, err := MapMemoryChain(memName, base, d2); !errors.Is(err, ErrWrongBase) || got != nil {
		t.Errorf("chain skipping a diff: %v, %d bytes; want ErrWrongBase, nil", err, len(got))
	}
	wantErr(t, d1.ApplyDiff(make([]byte, PageSize), memName, base))
	if _, err := d1.MapMemory(memName); !errors.Is(err, ErrNoPart) {
		t.Errorf("MapMemory of a diff part: %v, want ErrNoPart", err)
	}
}

// TestDiffCorrupt: a changed byte in a diff's pages or bitmap passes
// Open and fails ApplyDiff and Verify; MapMemoryChain hands out nothing.
func TestDiffCorrupt(t *testing.T) {
	for _, off := range []int64{32 + PageSize + 5, 0, 31} {
		parent := t.TempDir()
		mem := writeTest(t, filepath.Join(parent, "base"))
		base := mustOpen(t, filepath.Join(parent, "base"))
		fill(mem, 3, 9)
		fill(mem, 4, 9)
		writeDiff(t, filepath.Join(parent, "d1"), base.Digest(), mem, []int{3, 4})
		flipByte(t, filepath.Join(parent, "d1", "ram.diff"), off)
		d1 := mustOpen(t, filepath.Join(parent, "d1"))
		got, err := MapMemoryChain(memName, base, d1)
		if err == nil || got != nil || !errors.Is(err, ErrCorrupt) {
			t.Errorf("byte %d flipped: MapMemoryChain %v, %d bytes; want ErrCorrupt, nil", off, err, len(got))
		}
		wantErr(t, d1.Verify(), ErrCorrupt)
	}
}

// TestAddMemoryDiffRefuses: a bitmap of the wrong length or marking pages
// past the end, and a base that is not a digest, are refused.
func TestAddMemoryDiffRefuses(t *testing.T) {
	w, err := Create(filepath.Join(t.TempDir(), "snap"))
	must(t, err)
	defer w.Abort()
	mem := make([]byte, 65*PageSize) // two words, one bit used in the second
	digest := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tt := range []struct {
		name  string
		base  string
		dirty []uint64
	}{
		{"short bitmap", digest, []uint64{1}},
		{"long bitmap", digest, []uint64{1, 0, 0}},
		{"bit past the end", digest, []uint64{1, 2}},
		{"bad base", "HEAD", []uint64{1, 1}},
	} {
		if err := w.AddMemoryDiff("d", tt.base, mem, tt.dirty); err == nil {
			t.Errorf("%s accepted", tt.name)
		}
	}
	must(t, w.AddMemoryDiff("d", digest, mem, []uint64{1, 1}))
}

// TestForEachRun: the runs found match a page-by-page walk, for random
// bitmaps of sizes around word boundaries.
func TestForEachRun(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, npages := range []int64{1, 63, 64, 65, 127, 128, 129, 1000} {
		for range 50 {
			dirty := make([]uint64, (npages+63)/64)
			density := r.Float64()
			for i := range npages {
				if r.Float64() < density {
					markDirty(dirty, int(i))
				}
			}
			var want, got [][2]int64
			for i := int64(0); i < npages; i++ {
				if dirty[i/64]>>(i%64)&1 == 0 {
					continue
				}
				if n := len(want); n > 0 && want[n-1][0]+want[n-1][1] == i {
					want[n-1][1]++
				} else {
					want = append(want, [2]int64{i, 1})
				}
			}
			must(t, forEachRun(dirty, npages, func(first, n int64) error {
				got = append(got, [2]int64{first, n})
				return nil
			}))
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%d pages %x: runs %v, want %v", npages, dirty, got, want)
			}
		}
	}
}
