package guestmem

import (
	"testing"
)

// TestTrackDirty: once tracked, Write, Zero, Store16Release and Slice mark
// the pages they cover (a write across two regions marks both), Read and
// Check mark nothing, and TakeDirty returns the marks once and clears
// them. Untracked memory marks nothing and TakeDirty refuses it.
func TestTrackDirty(t *testing.T) {
	const pg = dirtyPageSize
	mk := func() *Memory {
		m, err := New(Region{GPA: 0, Data: make([]byte, 130*pg)}, Region{GPA: 130 * pg, Data: make([]byte, 4*pg)})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := mk()
	if _, err := m.TakeDirty(0); err == nil {
		t.Error("TakeDirty of untracked memory: no error")
	}
	m.TrackDirty()
	take := func(gpa uint64) []uint64 {
		t.Helper()
		d, err := m.TakeDirty(gpa)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	buf := make([]byte, 2*pg)
	if err := m.Read(5*pg, buf); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(0, 130*pg); err != nil {
		t.Fatal(err)
	}
	if d := take(0); d[0]|d[1]|d[2] != 0 {
		t.Errorf("reads marked pages: %x", d)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(m.Write(3*pg+pg/2, buf))                   // pages 3, 4, 5 (half of 3, 4, half of 5)
	must(m.Zero(64*pg, 1))                          // page 64
	must(m.Store16Release(100*pg+6, 1))             // page 100
	if _, err := m.Slice(127*pg-1, 2); err != nil { // pages 126, 127
		t.Fatal(err)
	}
	must(m.Write(129*pg, buf)) // page 129 of the first region, page 0 of the second
	d := take(0)
	// Word 0: pages 3-5; word 1 (pages 64-127): 64, 100, 126, 127; word
	// 2: page 129.
	want := []uint64{1<<3 | 1<<4 | 1<<5, 1<<0 | 1<<36 | 1<<62 | 1<<63, 1 << 1}
	for i := range want {
		if d[i] != want[i] {
			t.Errorf("word %d: %#x, want %#x", i, d[i], want[i])
		}
	}
	if d := take(130 * pg); len(d) != 1 || d[0] != 1 {
		t.Errorf("second region: %x; want page 0", d)
	}
	if d := take(0); d[0]|d[1]|d[2] != 0 {
		t.Errorf("TakeDirty did not clear: %x", d)
	}
	if _, err := m.TakeDirty(pg); err == nil {
		t.Error("TakeDirty at an address no region starts at: no error")
	}
	u := mk()
	must(u.Write(0, buf)) // untracked: nothing to mark, nothing breaks
}

// BenchmarkWriteTracked is the cost of a tracked 1 KiB write beside an
// untracked one.
func BenchmarkWriteTracked(b *testing.B) {
	for _, track := range []bool{false, true} {
		name := "untracked"
		if track {
			name = "tracked"
		}
		b.Run(name, func(b *testing.B) {
			m, _ := New(Region{GPA: 0, Data: make([]byte, 1<<20)})
			if track {
				m.TrackDirty()
			}
			p := make([]byte, 1024)
			b.SetBytes(1024)
			for i := 0; b.Loop(); i++ {
				_ = m.Write(uint64(i%1000)*1024, p)
			}
		})
	}
}
