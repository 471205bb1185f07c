package cachedisk

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCorruptVersion: a version whose image does not match its manifest
// is skipped with one log line and removed; the job gets the older good
// version, and the next commit numbers after it.
func TestCorruptVersion(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, s *Store)
		why   string
	}{
		{"truncated", func(t *testing.T, s *Store) {
			if err := os.Truncate(s.imagePath("go", 2), 512<<10); err != nil {
				t.Fatal(err)
			}
		}, "bytes, its manifest says"},
		{"truncated below the head", func(t *testing.T, s *Store) {
			if err := os.Truncate(s.imagePath("go", 2), 1000); err != nil {
				t.Fatal(err)
			}
		}, "too short for ext4"},
		{"bad magic", func(t *testing.T, s *Store) {
			writeAt(t, s.imagePath("go", 2), ext4MagicOff, []byte{0, 0})
		}, "no ext4 superblock"},
		{"head changed", func(t *testing.T, s *Store) {
			writeAt(t, s.imagePath("go", 2), 4096, []byte("scribble"))
		}, "does not match its manifest"},
		{"image missing", func(t *testing.T, s *Store) {
			if err := os.Remove(s.imagePath("go", 2)); err != nil {
				t.Fatal(err)
			}
		}, "image is missing"},
		{"manifest garbage", func(t *testing.T, s *Store) {
			if err := os.WriteFile(filepath.Join(s.nameDir("go"), manifestName(2)), []byte("{not json"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "manifest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, log := testStore(t, Limits{})
			commitWith(t, s, "go", 100<<10, []byte("one"))
			commitWith(t, s, "go", 100<<10, []byte("two"))
			tc.spoil(t, s)
			c, p := checkout(t, s, "go", 1<<20)
			if c.Base != 1 {
				t.Errorf("checkout's base %d; want 1, the good version", c.Base)
			}
			if got := readAt(t, p, 100<<10, 3); string(got) != "one" {
				t.Errorf("the clone holds %q; want version 1's %q", got, "one")
			}
			lines := logLines(log)
			if len(lines) != 1 || !strings.Contains(lines[0], "cache go: version 2 is corrupt") || !strings.Contains(lines[0], tc.why) {
				t.Errorf("log %q; want one line on version 2 saying %q", lines, tc.why)
			}
			for _, f := range []string{imageName(2), manifestName(2)} {
				if _, err := os.Stat(filepath.Join(s.nameDir("go"), f)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s kept: %v", f, err)
				}
			}
			if n, err := s.Commit(c); err != nil || n != 2 {
				t.Errorf("commit after the removal: version %d, %v; want 2", n, err)
			}
		})
	}
}

// TestHalfWrittenCleaned: what a commit killed half-way leaves (its
// manifest's temporary file, an image renamed into place without a
// manifest) is never a version and is removed on the next operation.
func TestHalfWrittenCleaned(t *testing.T) {
	s, log := testStore(t, Limits{})
	commitWith(t, s, "go", 100<<10, []byte("one"))
	dir := s.nameDir("go")
	// A commit killed after renaming its image, before its manifest.
	_, p := checkout(t, s, "go", 1<<20)
	if err := os.Rename(p, filepath.Join(dir, imageName(2))); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "."+manifestName(2)+".tmp-123")
	if err := os.WriteFile(tmp, []byte(`{"version":2,"si`), 0o600); err != nil {
		t.Fatal(err)
	}
	infos, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Versions != 1 || infos[0].Newest != 1 {
		t.Errorf("List %+v; want go with version 1 alone", infos)
	}
	for _, f := range []string{tmp, filepath.Join(dir, imageName(2))} {
		if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s kept: %v", filepath.Base(f), err)
		}
	}
	if l := logLines(log); len(l) != 0 {
		t.Errorf("log %q: a half commit is not a version, nothing to say", l)
	}
	c, _ := checkout(t, s, "go", 1<<20)
	if c.Base != 1 {
		t.Errorf("checkout's base %d, want 1", c.Base)
	}
}

// TestListAndRemove: List describes each name; Remove takes a name's
// versions and clones away, and a clone's commit then fails.
func TestListAndRemove(t *testing.T) {
	s, _ := testStore(t, Limits{})
	commitWith(t, s, "a", 100<<10, []byte("x"))
	commitWith(t, s, "a", 100<<10, []byte("y"))
	commitWith(t, s, "b", 100<<10, []byte("z"))
	running, _ := checkout(t, s, "b", 1<<20)
	infos, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 {
		t.Fatalf("List %+v; want a and b", infos)
	}
	a, b := infos[0], infos[1]
	if a.Name != "a" || a.Versions != 2 || a.Newest != 2 || a.Size != 1<<20 || a.Allocated <= 0 || a.Committed.IsZero() || a.Clones != 0 {
		t.Errorf("a: %+v", a)
	}
	if b.Name != "b" || b.Versions != 1 || b.Newest != 1 || b.Clones != 1 {
		t.Errorf("b: %+v", b)
	}
	if err := s.Remove("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(running); err == nil || !strings.Contains(err.Error(), "clone is gone") {
		t.Errorf("commit after Remove: %v; want the clone is gone", err)
	}
	if err := s.Remove("b"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("second Remove: %v; want not exist", err)
	}
	infos, err = s.List()
	if err != nil || len(infos) != 1 || infos[0].Name != "a" {
		t.Errorf("List after Remove: %+v, %v", infos, err)
	}
	if left, _ := filepath.Glob(filepath.Join(s.Dir(), ".*")); len(left) != 0 {
		t.Errorf("left in the store: %v", left)
	}
	c, _ := checkout(t, s, "b", 1<<20)
	if c.Base != 0 {
		t.Errorf("a removed name's checkout has base %d, want a new disk", c.Base)
	}
}

// TestOpenCleansRemoved: a Remove killed after moving the name away
// leaves a directory that the next Open deletes.
func TestOpenCleansRemoved(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, ".removed-1", "go")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Limits{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(left)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("left by a killed Remove: %v", err)
	}
}

// TestBadNames: names that are paths or not one safe file name are
// refused by every entry point, and nothing is made for them.
func TestBadNames(t *testing.T) {
	s, _ := testStore(t, Limits{})
	for _, name := range []string{"", "a/b", "..", "../x", "a..b", ".hidden", "-x", "x y", "/abs", "a\x00", strings.Repeat("n", 65)} {
		if _, err := s.Checkout(context.Background(), name, 1<<20); err == nil {
			t.Errorf("Checkout(%q) succeeded", name)
		}
		if err := s.Remove(name); err == nil {
			t.Errorf("Remove(%q) succeeded", name)
		}
		if _, err := s.Commit(Clone{Name: name, ID: strings.Repeat("a", 32)}); err == nil {
			t.Errorf("Commit of %q succeeded", name)
		}
	}
	for _, id := range []string{"", "../../x", strings.Repeat("A", 32), strings.Repeat("a", 31)} {
		if _, err := s.Path(Clone{Name: "go", ID: id}); err == nil {
			t.Errorf("Path of clone id %q succeeded", id)
		}
	}
	if err := CheckName("project-12_go.v1"); err != nil {
		t.Errorf("a good name refused: %v", err)
	}
	if entries, _ := os.ReadDir(s.Dir()); len(entries) != 0 {
		t.Errorf("made for bad names: %v", entries)
	}
	if _, err := s.Checkout(context.Background(), "go", 0); err == nil {
		t.Error("Checkout of size 0 succeeded")
	}
	if _, err := Open(t.TempDir(), Limits{Versions: -1}, nil); err == nil {
		t.Error("Open with negative limits succeeded")
	}
}

// TestParseVersion: only the store's own version file names count.
func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		file string
		n    int
		ext  string
		ok   bool
	}{
		{"v00000001.ext4", 1, imageSuffix, true},
		{"v00000042.json", 42, manifestExt, true},
		{"v1.ext4", 0, "", false},
		{"v00000000.ext4", 0, "", false},
		{"v-0000001.ext4", 0, "", false},
		{"v+0000001.json", 0, "", false},
		{"x00000001.ext4", 0, "", false},
		{"v00000001.ext4.tmp", 0, "", false},
		{"lock", 0, "", false},
	} {
		n, ext, ok := parseVersion(tc.file)
		if n != tc.n || ext != tc.ext || ok != tc.ok {
			t.Errorf("parseVersion(%q) = %d %q %v; want %d %q %v", tc.file, n, ext, ok, tc.n, tc.ext, tc.ok)
		}
	}
	if got := imageName(7); got != "v00000007.ext4" {
		t.Errorf("imageName(7) = %q", got)
	}
}
