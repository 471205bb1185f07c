package snapshot

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entries lists a directory's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestAbort: Abort removes everything written, leaving the parent as it
// was; a second Abort and one after Commit do nothing.
func TestAbort(t *testing.T) {
	parent := t.TempDir()
	w, err := Create(filepath.Join(parent, "snap"))
	must(t, err)
	must(t, w.AddState("cpu0", testState()))
	must(t, w.AddMemory(memName, testMem(testMemSize, 1)))
	must(t, w.Abort())
	must(t, w.Abort())
	if names := entries(t, parent); len(names) != 0 {
		t.Errorf("left after Abort: %q", names)
	}
	if err := w.Commit(); err == nil {
		t.Error("Commit after Abort succeeded")
	}
}

// failingReader returns n bytes, then an error.
type failingReader struct{ n int }

var errDisk = errors.New("disk on fire")

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, errDisk
	}
	n := min(len(p), r.n)
	r.n -= n
	return n, nil
}

// TestFailureMidway: a part that fails halfway breaks the Writer: Commit
// returns the failure and puts nothing at the target; Abort leaves
// nothing at all.
func TestFailureMidway(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "snap")
	w, err := Create(dir)
	must(t, err)
	must(t, w.AddState("cpu0", testState()))
	wantErr(t, w.AddFile("disk", &failingReader{n: 100000}), errDisk)
	wantErr(t, w.AddState("cpu1", testState()), errDisk)
	wantErr(t, w.Commit(), errDisk)
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target after a failed snapshot: %v", err)
	}
	must(t, w.Abort())
	if names := entries(t, parent); len(names) != 0 {
		t.Errorf("left after Abort: %q", names)
	}
}

// TestCommitOntoExisting: a snapshot at the target is refused by Create
// and, when it appears after Create, by Commit, and is left intact; an
// empty directory is taken.
func TestCommitOntoExisting(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "snap")
	writeTest(t, dir)
	digest := mustOpen(t, dir).Digest()
	if _, err := Create(dir); !errors.Is(err, ErrExists) {
		t.Errorf("Create onto a snapshot: %v, want ErrExists", err)
	}

	other := filepath.Join(parent, "other")
	w, err := Create(other)
	must(t, err)
	defer w.Abort()
	must(t, w.AddState("x", 1))
	writeTest(t, other) // appears meanwhile
	wantErr(t, w.Commit(), ErrExists)
	must(t, w.Abort())
	if got := mustOpen(t, dir).Digest(); got != digest {
		t.Error("the existing snapshot changed")
	}
	if names := entries(t, parent); strings.Join(names, " ") != "other snap" {
		t.Errorf("parent holds %q, want other and snap", names)
	}

	empty := filepath.Join(parent, "empty")
	must(t, os.Mkdir(empty, 0o700))
	writeTest(t, empty)
	mustOpen(t, empty)

	file := filepath.Join(parent, "file")
	must(t, os.WriteFile(file, nil, 0o600))
	if _, err := Create(file); !errors.Is(err, ErrExists) {
		t.Errorf("Create onto a file: %v, want ErrExists", err)
	}
}

// TestOverwrite: with Overwrite, Commit replaces a snapshot and leaves no
// trace of the old one; a directory that is not a snapshot is never
// replaced.
func TestOverwrite(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "snap")
	writeTest(t, dir)
	w, err := Create(dir, Overwrite())
	must(t, err)
	must(t, w.AddState("only", "new"))
	must(t, w.Commit())
	s := mustOpen(t, dir)
	if ps := s.Manifest().Parts; len(ps) != 1 || ps[0].Name != "only" || s.Digest() != w.Digest() {
		t.Errorf("after Overwrite: parts %+v, digest %s want %s", ps, s.Digest(), w.Digest())
	}
	if names := entries(t, parent); len(names) != 1 {
		t.Errorf("parent holds %q, want the snapshot alone", names)
	}
	if names := entries(t, dir); len(names) != 2 {
		t.Errorf("snapshot holds %q, want the manifest and one part", names)
	}

	home := filepath.Join(parent, "home")
	must(t, os.MkdirAll(filepath.Join(home, "precious"), 0o700))
	if _, err := Create(home, Overwrite()); !errors.Is(err, ErrExists) {
		t.Errorf("Create with Overwrite onto a non-snapshot: %v, want ErrExists", err)
	}
	if _, err := os.Stat(filepath.Join(home, "precious")); err != nil {
		t.Error(err)
	}
}

// TestWriterRefusesArguments: bad names, duplicates, odd memory sizes and
// oversized metadata are refused without breaking the Writer.
func TestWriterRefusesArguments(t *testing.T) {
	w, err := Create(filepath.Join(t.TempDir(), "snap"))
	must(t, err)
	defer w.Abort()
	for _, name := range []string{"", "../x", "a/b", ".hidden", "a..b", "x y", strings.Repeat("n", maxNameLen+1)} {
		if err := w.AddState(name, 1); err == nil {
			t.Errorf("AddState(%q) accepted", name)
		}
	}
	must(t, w.AddState("cpu0", 1))
	if err := w.AddState("cpu0", 2); err == nil {
		t.Error("a second part cpu0 accepted")
	}
	if err := w.AddMemory("m", make([]byte, PageSize+1)); err == nil {
		t.Error("memory of a page and a byte accepted")
	}
	if err := w.AddMemory("m", nil); err == nil {
		t.Error("empty memory accepted")
	}
	if err := w.AddState("ch", make(chan int)); err == nil {
		t.Error("a channel accepted as state")
	}
	if err := w.SetMetadata("k", strings.Repeat("v", maxMetaValue+1)); err == nil {
		t.Error("an oversized metadata value accepted")
	}
	must(t, w.AddFile("blob", io.LimitReader(zeros{}, 3*PageSize)))
	must(t, w.Commit())
	if err := w.AddState("late", 1); err == nil {
		t.Error("AddState after Commit accepted")
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
