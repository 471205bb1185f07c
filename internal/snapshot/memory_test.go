package snapshot

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAddMemorySparse: 64 MiB with a few non-zero pages is a file of 64
// MiB whose allocated blocks are about the pages written, and whose holes
// SEEK_DATA/SEEK_HOLE report where the zero pages are.
func TestAddMemorySparse(t *testing.T) {
	tmp := t.TempDir()
	if !holesSupported(t, tmp) {
		t.Skip("the temporary directory's file system does not keep holes at 4 KiB")
	}
	const size = 64 << 20
	// Runs: [0,2) [1000,1001) [8191,8192) and a run across a 1 MiB chunk.
	pages := []int{0, 1, 1000, 255, 256, 257, size/PageSize - 1}
	mem := testMem(size, pages...)
	dir := filepath.Join(tmp, "snap")
	w, err := Create(dir)
	must(t, err)
	must(t, w.AddMemory(memName, mem))
	must(t, w.Commit())

	s := mustOpen(t, dir)
	p, _ := s.Part(memName)
	if want := int64(len(pages) * PageSize); p.DataBytes != want {
		t.Errorf("DataBytes %d, want %d", p.DataBytes, want)
	}
	f, err := os.Open(filepath.Join(dir, "ram.mem"))
	must(t, err)
	defer f.Close()
	var st syscall.Stat_t
	must(t, syscall.Fstat(int(f.Fd()), &st))
	if st.Size != size {
		t.Errorf("file of %d bytes, want %d", st.Size, size)
	}
	// Extent metadata may cost a block or a few; a filled hole 16 MiB.
	if alloc := st.Blocks * 512; alloc < p.DataBytes || alloc > p.DataBytes+64<<10 {
		t.Errorf("%d bytes allocated for %d bytes of data", alloc, p.DataBytes)
	}
	runs := [][2]int64{{0, 2}, {255, 258}, {1000, 1001}, {size/PageSize - 1, size / PageSize}}
	var prevEnd int64
	for _, r := range runs {
		start, end := r[0]*PageSize, r[1]*PageSize
		if data, err := unix.Seek(int(f.Fd()), prevEnd, unix.SEEK_DATA); err != nil || data != start {
			t.Errorf("SEEK_DATA from %#x: %#x, %v; want %#x", prevEnd, data, err, start)
		}
		if hole, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE); err != nil || hole != end {
			t.Errorf("SEEK_HOLE from %#x: %#x, %v; want %#x", start, hole, err, end)
		}
		prevEnd = end
	}
	got, err := s.MapMemory(memName)
	must(t, err)
	defer Unmap(got)
	if !bytes.Equal(got, mem) {
		t.Error("mapped memory differs from what was saved")
	}
	must(t, s.Verify())
}

// TestMemoryDigestIgnoresHoles: the memory checksum is of the content, so
// a copy that fills every hole with zeros still verifies (the digest
// design in doc.go).
func TestMemoryDigestIgnoresHoles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	writeTest(t, dir)
	p := filepath.Join(dir, "ram.mem")
	data, err := os.ReadFile(p)
	must(t, err)
	must(t, os.Remove(p))
	must(t, os.WriteFile(p, data, 0o600)) // every byte written: no holes
	s := mustOpen(t, dir)
	must(t, s.Verify())
}

// TestMapMemoryCopyOnWrite: writes to a mapping reach neither the file
// nor another mapping of the same snapshot, in a data page or a hole.
func TestMapMemoryCopyOnWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	mem := writeTest(t, dir)
	file, err := os.ReadFile(filepath.Join(dir, "ram.mem"))
	must(t, err)
	s := mustOpen(t, dir)
	a, err := s.MapMemory(memName)
	must(t, err)
	defer Unmap(a)
	b, err := s.MapMemory(memName)
	must(t, err)
	defer Unmap(b)

	for _, off := range []int{100*PageSize + 1, 50 * PageSize} { // data, hole
		a[off] ^= 0xff
		if b[off] != mem[off] {
			t.Errorf("write to one mapping at %#x seen in the other", off)
		}
	}
	after, err := os.ReadFile(filepath.Join(dir, "ram.mem"))
	must(t, err)
	if !bytes.Equal(after, file) {
		t.Error("a write to the mapping reached the file")
	}
	if !bytes.Equal(b, mem) {
		t.Error("the second mapping changed")
	}
	must(t, s.Verify())
}
