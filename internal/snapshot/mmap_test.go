package snapshot

import (
	"bytes"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPrefault: with the memory file evicted from the page cache, Prefault
// reads its data pages in (mincore: resident) and leaves its holes alone
// (not resident: no page was made for them), and the mapping's content is
// the memory saved.
func TestPrefault(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	want := writeTest(t, dir)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	op, err := s.lookup(memName, KindMemory)
	if err != nil {
		t.Fatal(err)
	}
	must(t, unix.Fadvise(int(op.f.Fd()), 0, 0, unix.FADV_DONTNEED))
	mem, err := s.MapMemory(memName)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(mem)
	if err := s.Prefault(mem[:len(mem)-PageSize], memName); err == nil {
		t.Error("Prefault of a mapping of the wrong size: no error")
	}
	must(t, s.Prefault(mem, memName))
	vec := make([]byte, len(mem)/PageSize)
	must(t, mincore(mem, vec))
	data := map[int]bool{}
	for _, p := range testPages {
		data[p] = true
	}
	for p, v := range vec {
		if resident := v&1 != 0; resident != data[p] {
			t.Errorf("page %d resident %v after Prefault; it holds data: %v", p, resident, data[p])
		}
	}
	if !bytes.Equal(mem, want) {
		t.Error("the prefaulted mapping differs from the memory saved")
	}
}
