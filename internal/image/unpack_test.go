package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// unpack itself (without mutate.Extract in front) keeps everything inside
// the staging directory.
func TestUnpackStaysInside(t *testing.T) {
	cases := map[string][]entry{
		"dotdot": {file("../escape", "x")},
		"symlink then write through it": {
			symlink("evil", "../.."),
			file("evil/escape", "x"),
		},
		"absolute symlink then write through it": {
			symlink("abs", "/"),
			file("abs/escape", "x"),
		},
		"hard link to outside": {
			hardlink("hl", "../escape-target"),
		},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			top := t.TempDir()
			sentinel := filepath.Join(top, "escape-target")
			os.WriteFile(sentinel, []byte("keep"), 0o644)
			staging := filepath.Join(top, "a", "b", "staging")
			os.MkdirAll(staging, 0o755)
			_, err := unpack(context.Background(), bytes.NewReader(tarBytes(t, entries)), staging, &Options{})
			if err == nil {
				t.Error("unpack succeeded")
			}
			filepath.Walk(top, func(p string, fi os.FileInfo, err error) error {
				if fi != nil && fi.Name() == "escape" {
					t.Errorf("written outside staging: %s", p)
				}
				return nil
			})
			if b, _ := os.ReadFile(sentinel); string(b) != "keep" {
				t.Errorf("sentinel changed: %q", b)
			}
		})
	}
}

func TestUnpackTopLayerFirstOrder(t *testing.T) {
	// As mutate.Extract emits them: a file before its directory's entry,
	// a hard link before its target, a read-only directory before what it
	// holds.
	ro := dir("ro", 0o500)
	ro.mtime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	entries := []entry{
		file("deep/er/file", "f"),
		hardlink("links/l", "target"),
		ro,
		file("ro/sub/x", "x"),
		dir("deep/er", 0o700),
		dir("deep", 0o711),
		file("target", "t"),
		{name: "fifo", typ: tar.TypeFifo, mode: 0o644},
		{name: "blk", typ: tar.TypeBlock, mode: 0o644},
		hardlink("dangling", "nowhere"),
	}
	staging := t.TempDir()
	st, err := unpack(context.Background(), bytes.NewReader(tarBytes(t, entries)), staging, &Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.skipped != 3 {
		t.Errorf("skipped = %d, want 3 (fifo, block device, dangling link)", st.skipped)
	}
	a, _ := os.Stat(filepath.Join(staging, "target"))
	b, _ := os.Stat(filepath.Join(staging, "links/l"))
	if !os.SameFile(a, b) {
		t.Error("hard link not made")
	}
	fi, err := os.Stat(filepath.Join(staging, "ro"))
	if err != nil {
		t.Fatal(err)
	}
	want := os.FileMode(0o500 | userDirBits)
	if fi.Mode().Perm() != want || !fi.ModTime().Equal(ro.mtime) {
		t.Errorf("ro: %v %v, want %v %v", fi.Mode().Perm(), fi.ModTime(), want, ro.mtime)
	}
	if fi, _ := os.Stat(filepath.Join(staging, "deep")); fi.Mode().Perm() != 0o711|userDirBits {
		t.Errorf("deep: %v", fi.Mode())
	}
	if _, err := os.Lstat(filepath.Join(staging, "fifo")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("fifo made")
	}
	os.Chmod(filepath.Join(staging, "ro"), 0o700) // let TempDir's cleanup in
}

func TestDebugfsQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/a b":    `"/a b"`,
		`/q"q`:    `"/q""q"`,
		"/#x;y'z": `"/#x;y'z"`,
	} {
		got, ok := debugfsQuote(in)
		if !ok || got != want {
			t.Errorf("debugfsQuote(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"/a\nb", "/a\rb"} {
		if _, ok := debugfsQuote(in); ok {
			t.Errorf("debugfsQuote(%q) accepted", in)
		}
	}
}

func TestSweepTmp(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmp := s.path(tmpDir)
	old := time.Now().Add(-2 * time.Hour)

	stale := filepath.Join(tmp, "work-stale")
	os.MkdirAll(filepath.Join(stale, "rootfs", "ro"), 0o755)
	os.Chmod(filepath.Join(stale, "rootfs", "ro"), 0o555)
	os.Chtimes(stale, old, old)

	busy, err := newWorkDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.remove()
	os.Chtimes(busy.path, old, old)

	fresh := filepath.Join(tmp, "work-fresh")
	os.Mkdir(fresh, 0o755)

	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale work directory kept: %v", err)
	}
	if _, err := os.Stat(busy.path); err != nil {
		t.Errorf("work directory in use removed: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh work directory removed: %v", err)
	}
}

func TestOpenCollectsUnnamedImages(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	orphan := s.path(imagesDir, strings.Repeat("ab", 32))
	os.MkdirAll(orphan, 0o755)
	os.WriteFile(filepath.Join(orphan, metaName), []byte("{}"), 0o644)
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("unnamed image kept: %v", err)
	}
	tmpEmpty(t, s)
}
