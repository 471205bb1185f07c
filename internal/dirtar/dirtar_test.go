package dirtar

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
	st, err := Extract(&buf, dst, Options{Chown: os.Geteuid() == 0, KeepSpecial: true})
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
	if _, err := Extract(&buf, one, Options{}); err != nil {
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
			_, err := Extract(&buf, filepath.Join(t.TempDir(), "in"), Options{})
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
	st, err := Extract(&buf, dir, Options{})
	if err != nil || st.Skipped != 2 || st.Entries != 1 {
		t.Fatalf("Extract = %+v, %v; want 1 entry, 2 skipped", st, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "null")); err == nil {
		t.Error("the device node was made")
	}
}

// tarOf writes entries (with contents for regular files) as an archive.
func tarOf(t testing.TB, entries ...tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			if _, err := tw.Write(bytes.Repeat([]byte{'x'}, int(h.Size))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// TestExtractStripsSpecialBits: without KeepSpecial, a setuid file, a
// setgid directory and a sticky one arrive with their permission bits
// only; with it, the bits are kept.
func TestExtractStripsSpecialBits(t *testing.T) {
	entries := []tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 1},
		{Name: "sgid", Typeflag: tar.TypeReg, Mode: 0o2755, Size: 1},
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o2775},
	}
	for _, keep := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "new")
		if _, err := Extract(tarOf(t, entries...), dir, Options{KeepSpecial: keep}); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]os.FileMode{".": 0o777 | os.ModeSticky, "suid": 0o755 | os.ModeSetuid,
			"sgid": 0o755 | os.ModeSetgid, "d": 0o775 | os.ModeSetgid} {
			if !keep {
				want &= os.ModePerm
			}
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); got != want {
				t.Errorf("KeepSpecial %v: %s mode %v, want %v", keep, name, got, want)
			}
		}
	}
}

// TestExtractKeepsDestinationMode: the archive's "." entry, or a
// directory entry named by a symlink to ".", does not change the mode or
// time of a destination that already exists; a destination Extract makes
// gets the "." entry's mode.
func TestExtractKeepsDestinationMode(t *testing.T) {
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		entries []tar.Header
	}{
		{"dot", []tar.Header{{Name: "./", Typeflag: tar.TypeDir, Mode: 0o777, ModTime: old}}},
		{"symlink to dot", []tar.Header{
			{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "."},
			{Name: "up/", Typeflag: tar.TypeDir, Mode: 0o777, ModTime: old},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if _, err := Extract(tarOf(t, tc.entries...), dir, Options{}); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o700 || fi.ModTime().Equal(old) {
				t.Errorf("destination now %v, %v; want 0700 and its own time", fi.Mode(), fi.ModTime())
			}
		})
	}
	dir := filepath.Join(t.TempDir(), "made")
	if _, err := Extract(tarOf(t, tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o750}), dir, Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("a destination Extract made: %v, %v; want 0750", fi.Mode(), err)
	}
}

// rawHeader is one ustar header block, written by hand for what
// tar.Writer will not write (PAX sparse records).
func rawHeader(name string, typ byte, size int) []byte {
	b := make([]byte, 512)
	copy(b, name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// paxRecord is one "LEN key=value\n" record.
func paxRecord(k, v string) string {
	r := " " + k + "=" + v + "\n"
	n := len(r) + 1
	for len(strconv.Itoa(n))+len(r) != n {
		n++
	}
	return strconv.Itoa(n) + r
}

// block pads b to a whole number of 512-byte blocks.
func block(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }

// TestExtractRefusesSparse: a PAX sparse entry, whose holes would read as
// zeros far beyond the archive's size, is refused and not written.
func TestExtractRefusesSparse(t *testing.T) {
	// A PAX 1.0 sparse file: 1 TiB of holes around no data at all.
	pax := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", "big") + paxRecord("GNU.sparse.realsize", "1099511627776")
	var buf bytes.Buffer
	buf.Write(rawHeader("PaxHeaders/big", tar.TypeXHeader, len(pax)))
	buf.Write(block([]byte(pax)))
	buf.Write(rawHeader("GNUSparseFile.0/big", tar.TypeReg, 512))
	buf.Write(block([]byte("0\n"))) // the sparse map: no data blocks
	buf.Write(make([]byte, 1024))
	dir := t.TempDir()
	_, err := Extract(&buf, dir, Options{})
	if !errors.Is(err, ErrSparse) {
		t.Fatalf("Extract: %v, want ErrSparse", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "big")); err == nil {
		t.Error("the sparse file was made")
	}
}
