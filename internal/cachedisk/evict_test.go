package cachedisk

import (
	"bytes"
	"slices"
	"testing"
)

// TestEvictByCount: a name keeps its newest Limits.Versions versions.
func TestEvictByCount(t *testing.T) {
	s, _ := testStore(t, Limits{})
	for i := range 4 {
		commitWith(t, s, "go", 100<<10, []byte{byte('0' + i)})
	}
	if v := versionsOf(t, s, "go"); !slices.Equal(v, []int{3, 4}) {
		t.Errorf("versions %v; want [3 4] (default limit %d)", v, DefaultVersions)
	}
	s.limits.Versions = 1
	commitWith(t, s, "go", 100<<10, []byte("5"))
	if v := versionsOf(t, s, "go"); !slices.Equal(v, []int{5}) {
		t.Errorf("versions %v; want [5]", v)
	}
}

// TestEvictBySize: over the store's byte limit the oldest versions of any
// name go first, never a name's newest, and never a clone.
func TestEvictBySize(t *testing.T) {
	data := bytes.Repeat([]byte{0xaa}, 256<<10)
	s, _ := testStore(t, Limits{Versions: 10})
	commitWith(t, s, "a", 128<<10, data) // a1
	commitWith(t, s, "b", 128<<10, data) // b1
	commitWith(t, s, "a", 128<<10, data) // a2
	_, clone := checkout(t, s, "b", 1<<20)
	var per int64
	for _, v := range s.peek("a") {
		per = max(per, v.m.Allocated)
	}
	if per < 256<<10 {
		t.Fatalf("a version allocates %d bytes; the test needs at least its data", per)
	}
	// Room for three versions: committing b2 (a fourth) evicts the
	// oldest, a1, though it is not b's.
	s.limits.TotalBytes = 3*per + per/2
	commitWith(t, s, "b", 128<<10, data)
	if v := versionsOf(t, s, "a"); !slices.Equal(v, []int{2}) {
		t.Errorf("a: versions %v; want [2]", v)
	}
	if v := versionsOf(t, s, "b"); !slices.Equal(v, []int{1, 2}) {
		t.Errorf("b: versions %v; want [1 2]", v)
	}
	// A limit below the newest versions alone keeps each name's newest.
	s.limits.TotalBytes = 1
	commitWith(t, s, "a", 128<<10, data)
	if v := versionsOf(t, s, "a"); !slices.Equal(v, []int{3}) {
		t.Errorf("a: versions %v; want [3]", v)
	}
	if v := versionsOf(t, s, "b"); !slices.Equal(v, []int{2}) {
		t.Errorf("b: versions %v; want [2]", v)
	}
	if got := readAt(t, clone, 128<<10, len(data)); !bytes.Equal(got, data) {
		t.Error("a clone changed when its version was evicted")
	}
}

// TestEvictSkipsBusyName: eviction across the store leaves a name whose
// lock another commit holds, and does not wait for it.
func TestEvictSkipsBusyName(t *testing.T) {
	data := bytes.Repeat([]byte{0x55}, 256<<10)
	s, _ := testStore(t, Limits{Versions: 10})
	commitWith(t, s, "a", 128<<10, data)
	commitWith(t, s, "a", 128<<10, data)
	l, err := s.lock("a", true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s.limits.TotalBytes = 1
	commitWith(t, s, "b", 128<<10, data)
	if v := versionsOf(t, s, "a"); !slices.Equal(v, []int{1, 2}) {
		t.Errorf("a (busy): versions %v; want [1 2] untouched", v)
	}
}
