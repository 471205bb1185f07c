package dirtar

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRoundTrip: a tree written and extracted elsewhere has the same
// files, modes (setuid and a read-only directory among them), times,
// symlinks and hard links.
func TestRoundTrip(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a/b"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a/b/f"), []byte("hello"), 0o640))
	must(os.WriteFile(filepath.Join(src, "run"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(filepath.Join(src, "run"), 0o4755|os.ModeSetuid))
	must(os.Symlink("a/b/f", filepath.Join(src, "link")))
	must(os.Link(filepath.Join(src, "a/b/f"), filepath.Join(src, "hard")))
	must(os.Mkdir(filepath.Join(src, "ro"), 0o755))
	must(os.WriteFile(filepath.Join(src, "ro/x"), []byte("x"), 0o644))
	must(os.Chmod(filepath.Join(src, "ro"), 0o555))
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(os.Chtimes(filepath.Join(src, "a/b/f"), old, old))

	var buf bytes.Buffer
	n, err := Write(&buf, src)
	if err != nil || n != 9 {
		t.Fatalf("Write = %d, %v; want 9 entries", n, err)
	}
	dst := filepath.Join(t.TempDir(), "new", "dir")
	st, err := Extract(&buf, dst, os.Geteuid() == 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 9 || st.Bytes != int64(len("hello")+len("#!/bin/sh\n")+1) || st.Skipped != 0 {
		t.Errorf("stats %+v", st)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a/b/f")); err != nil || string(b) != "hello" {
		t.Errorf("a/b/f = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "a/b/f")); err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(old) {
		t.Errorf("a/b/f: %v, %v; want mode 0640, time %v", fi.Mode(), err, old)
	}
	if fi, err := os.Stat(filepath.Join(dst, "run")); err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("run: %v, %v; want setuid 0755", fi.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "a/b/f" {
		t.Errorf("link -> %q, %v", l, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "a/b/f"))
	h, _ := os.Stat(filepath.Join(dst, "hard"))
	if a == nil || h == nil || a.Sys().(*syscall.Stat_t).Ino != h.Sys().(*syscall.Stat_t).Ino {
		t.Error("hard is not a hard link of a/b/f")
	}
	if fi, err := os.Stat(filepath.Join(dst, "ro")); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("ro: %v, %v; want 0555", fi.Mode(), err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "ro/x")); err != nil || string(b) != "x" {
		t.Errorf("ro/x = %q, %v", b, err)
	}

	// A single file is one entry named by its base name.
	buf.Reset()
	if n, err := Write(&buf, filepath.Join(src, "a/b/f")); err != nil || n != 1 {
		t.Fatalf("Write(file) = %d, %v", n, err)
	}
	one := t.TempDir()
	if _, err := Extract(&buf, one, false); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(one, "f")); err != nil || string(b) != "hello" {
		t.Errorf("single file: %q, %v", b, err)
	}
}

// TestExtractRefusesEscapes: a "../" name, an absolute name, a hard link
// to outside, and a file under a symlink that points outside are refused,
// and nothing is written outside the target.
func TestExtractRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []tar.Header
		unsafe  bool
	}{
		{"dotdot", []tar.Header{{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}}, true},
		{"absolute", []tar.Header{{Name: filepath.Join(outside, "escape"), Typeflag: tar.TypeReg, Mode: 0o644}}, true},
		{"hard link out", []tar.Header{{Name: "l", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}, true},
		{"through a symlink", []tar.Header{
			{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "evil/escape", Typeflag: tar.TypeReg, Mode: 0o644},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.entries {
				if err := tw.WriteHeader(&h); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			_, err := Extract(&buf, filepath.Join(t.TempDir(), "in"), false)
			if err == nil {
				t.Fatal("extracted")
			}
			if tc.unsafe && !errors.Is(err, ErrUnsafe) {
				t.Errorf("error %v, want ErrUnsafe", err)
			}
			if _, err := os.Stat(filepath.Join(outside, "escape")); err == nil {
				t.Error("a file was written outside the target")
			}
		})
	}
}

// TestExtractSkipsDevices: a device node and a FIFO are counted, not made.
func TestExtractSkipsDevices(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []tar.Header{
		{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644},
		{Name: "ok", Typeflag: tar.TypeReg, Mode: 0o644},
	} {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	dir := t.TempDir()
	st, err := Extract(&buf, dir, false)
	if err != nil || st.Skipped != 2 || st.Entries != 1 {
		t.Fatalf("Extract = %+v, %v; want 1 entry, 2 skipped", st, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "null")); err == nil {
		t.Error("the device node was made")
	}
}
