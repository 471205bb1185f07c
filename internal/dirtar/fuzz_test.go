package dirtar

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// FuzzExtract unpacks arbitrary archives into a directory inside a
// sandbox and checks that nothing outside the target changed (the
// sandbox's other entries and a file beside the target), and that the
// work is bounded by the input: the bytes written, counted and found on
// disk are at most the archive's size, the entries at most one per
// 512-byte block.
func FuzzExtract(f *testing.F) {
	for _, entries := range [][]tar.Header{
		{{Name: "./", Typeflag: tar.TypeDir, Mode: 0o1777}, {Name: "a/b", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 3}},
		{{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}},
		{{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: ".."}, {Name: "evil/beside", Typeflag: tar.TypeReg, Size: 2}},
		{{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "up/", Typeflag: tar.TypeDir, Mode: 0o777}},
		{{Name: "f", Typeflag: tar.TypeReg, Size: 4}, {Name: "h", Typeflag: tar.TypeLink, Linkname: "f"},
			{Name: "h2", Typeflag: tar.TypeLink, Linkname: "../beside"}},
		{{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o500}, {Name: "d/x", Typeflag: tar.TypeReg, Size: 1},
			{Name: "n", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
	} {
		f.Add(tarOf(f, entries...).Bytes())
	}
	src := f.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "x/y"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "x/y/z"), []byte("zzz"), 0o600); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("x/y/z", filepath.Join(src, "l")); err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Write(&buf, src); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())

	f.Fuzz(func(t *testing.T, data []byte) {
		sandbox := t.TempDir()
		beside := filepath.Join(sandbox, "beside")
		if err := os.WriteFile(beside, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(sandbox, "dst")
		st, _ := Extract(bytes.NewReader(data), dst, Options{})
		if st.Bytes > int64(len(data)) || st.Entries+st.Skipped > int64(len(data)/512) {
			t.Fatalf("stats %+v from %d bytes of archive", st, len(data))
		}
		names, err := os.ReadDir(sandbox)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range names {
			if e.Name() != "beside" && e.Name() != "dst" {
				t.Errorf("%s was made beside the target", e.Name())
			}
		}
		if b, err := os.ReadFile(beside); err != nil || string(b) != "keep" {
			t.Errorf("the file beside the target: %q, %v", b, err)
		}
		if fi, err := os.Lstat(beside); err != nil || fi.Mode() != 0o600 {
			t.Errorf("the file beside the target: %v, %v", fi.Mode(), err)
		}
		// What is on disk is bounded by the input too (hard links once).
		var onDisk int64
		seen := map[uint64]bool{}
		_ = filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			if ino := fi.Sys().(*syscall.Stat_t).Ino; !seen[ino] {
				seen[ino] = true
				onDisk += fi.Size()
				if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
					t.Errorf("%s: %v kept its set-id bits", p, fi.Mode())
				}
			}
			return nil
		})
		if onDisk > int64(len(data)) {
			t.Fatalf("%d bytes on disk from %d bytes of archive", onDisk, len(data))
		}
	})
}
