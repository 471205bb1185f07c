package initramfs

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHeaderEncode(t *testing.T) {
	tests := []struct {
		name string
		h    Header
		want string
	}{
		{
			name: "zero",
			h:    Header{},
			want: "070701" + strings.Repeat("00000000", 13),
		},
		{
			// What GNU cpio -H newc writes for the kernel's default /dev/console,
			// apart from ino/mtime/dev, which we fix to deterministic values.
			name: "console",
			h:    Header{Ino: 1, Mode: TypeChar | 0o600, NLink: 1, RDevMajor: 5, RDevMinor: 1, NameSize: 12},
			want: "070701" + "00000001" + "00002180" + "00000000" + "00000000" + "00000001" + "00000000" +
				"00000000" + "00000000" + "00000000" + "00000005" + "00000001" + "0000000c" + "00000000",
		},
		{
			name: "every field distinct",
			h: Header{Ino: 0x1, Mode: 0x2, UID: 0x3, GID: 0x4, NLink: 0x5, MTime: 0x6, FileSize: 0x7,
				DevMajor: 0x8, DevMinor: 0x9, RDevMajor: 0xa, RDevMinor: 0xb, NameSize: 0xc, Check: 0xd},
			want: "070701" + "00000001" + "00000002" + "00000003" + "00000004" + "00000005" + "00000006" +
				"00000007" + "00000008" + "00000009" + "0000000a" + "0000000b" + "0000000c" + "0000000d",
		},
		{
			name: "all ones",
			h: Header{Ino: ^uint32(0), Mode: ^uint32(0), UID: ^uint32(0), GID: ^uint32(0), NLink: ^uint32(0),
				MTime: ^uint32(0), FileSize: ^uint32(0), DevMajor: ^uint32(0), DevMinor: ^uint32(0),
				RDevMajor: ^uint32(0), RDevMinor: ^uint32(0), NameSize: ^uint32(0), Check: ^uint32(0)},
			want: "070701" + strings.Repeat("ffffffff", 13),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(tt.h.Encode())
			if len(got) != HeaderSize {
				t.Fatalf("len = %d, want %d", len(got), HeaderSize)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Encode() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// record is one entry as parsed back by parseArchive, a reader written
// independently of the Writer to check the byte layout.
type record struct {
	Offset int
	Header Header
	Name   string
	Data   string
}

func parseHex(t *testing.T, b []byte) uint32 {
	t.Helper()
	v, err := strconv.ParseUint(string(b), 16, 32)
	if err != nil {
		t.Fatalf("bad hex field %q: %v", b, err)
	}
	return uint32(v)
}

// parseArchive parses a newc archive, checking magic, NUL terminators, zero
// padding and 4-byte alignment, and that nothing follows the trailer.
func parseArchive(t *testing.T, b []byte) []record {
	t.Helper()
	var out []record
	off := 0
	for {
		if off%4 != 0 {
			t.Fatalf("record at offset %d is not 4-byte aligned", off)
		}
		if len(b)-off < HeaderSize {
			t.Fatalf("truncated header at offset %d", off)
		}
		hb := b[off : off+HeaderSize]
		if string(hb[:6]) != Magic {
			t.Fatalf("bad magic %q at offset %d", hb[:6], off)
		}
		f := func(i int) uint32 { return parseHex(t, hb[6+8*i:14+8*i]) }
		h := Header{f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7), f(8), f(9), f(10), f(11), f(12)}
		p := off + HeaderSize
		end := p + int(h.NameSize)
		if h.NameSize == 0 || end > len(b) || b[end-1] != 0 {
			t.Fatalf("bad name at offset %d (namesize %d)", off, h.NameSize)
		}
		name := string(b[p : end-1])
		for end%4 != 0 {
			if b[end] != 0 {
				t.Fatalf("non-zero name padding after %q", name)
			}
			end++
		}
		dend := end + int(h.FileSize)
		if dend > len(b) {
			t.Fatalf("truncated data for %q", name)
		}
		data := string(b[end:dend])
		for dend%4 != 0 {
			if dend >= len(b) || b[dend] != 0 {
				t.Fatalf("missing or non-zero data padding after %q", name)
			}
			dend++
		}
		out = append(out, record{off, h, name, data})
		off = dend
		if name == Trailer {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
	}
}

func align4(n int) int { return (n + 3) &^ 3 }

// TestPaddingBoundaries covers every residue of header+name and of data length
// modulo 4, including empty files and one-byte names.
func TestPaddingBoundaries(t *testing.T) {
	for nameLen := 1; nameLen <= 9; nameLen++ { // namesize 2..10: all four residues, twice
		for dataLen := 0; dataLen <= 9; dataLen++ {
			name := strings.Repeat("n", nameLen)
			data := strings.Repeat("d", dataLen)
			var buf bytes.Buffer
			w := NewWriter(&buf)
			if err := w.File(name, 0o644, []byte(data)); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			want := align4(HeaderSize+nameLen+1) + align4(dataLen) + align4(HeaderSize+len(Trailer)+1)
			if buf.Len() != want {
				t.Errorf("name %d, data %d: archive is %d bytes, want %d", nameLen, dataLen, buf.Len(), want)
			}
			recs := parseArchive(t, buf.Bytes())
			if len(recs) != 2 || recs[0].Name != name || recs[0].Data != data || recs[1].Name != Trailer {
				t.Errorf("name %d, data %d: parsed %+v", nameLen, dataLen, recs)
			}
		}
	}
}

func TestEntries(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	steps := []error{
		w.Dir("/dev", 0o755),
		w.CharDev("/dev/console", 0o600, 5, 1),
		w.BlockDev("dev/vda", 0o660, 254, 0),
		w.Symlink("dev/fd", "/proc/self/fd"),
		w.Dir("tmp", 0o1777),
		w.File("init", 0o755, []byte("#!/bin/sh\n")),
		w.File("empty", 0o644, nil),
		w.WriteEntry(Entry{Path: "owned", Mode: TypeRegular | 0o600, UID: 1000, GID: 100, Data: []byte("x")}),
		w.Close(),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	got := parseArchive(t, buf.Bytes())
	for i := range got {
		got[i].Offset = 0
	}
	want := []record{
		{Header: Header{Ino: 1, Mode: TypeDir | 0o755, NLink: 2, NameSize: 4}, Name: "dev"},
		{Header: Header{Ino: 2, Mode: TypeChar | 0o600, NLink: 1, RDevMajor: 5, RDevMinor: 1, NameSize: 12}, Name: "dev/console"},
		{Header: Header{Ino: 3, Mode: TypeBlock | 0o660, NLink: 1, RDevMajor: 254, NameSize: 8}, Name: "dev/vda"},
		{Header: Header{Ino: 4, Mode: TypeSymlink | 0o777, NLink: 1, FileSize: 13, NameSize: 7}, Name: "dev/fd", Data: "/proc/self/fd"},
		{Header: Header{Ino: 5, Mode: TypeDir | 0o1777, NLink: 2, NameSize: 4}, Name: "tmp"},
		{Header: Header{Ino: 6, Mode: TypeRegular | 0o755, NLink: 1, FileSize: 10, NameSize: 5}, Name: "init", Data: "#!/bin/sh\n"},
		{Header: Header{Ino: 7, Mode: TypeRegular | 0o644, NLink: 1, NameSize: 6}, Name: "empty"},
		{Header: Header{Ino: 8, Mode: TypeRegular | 0o600, UID: 1000, GID: 100, NLink: 1, FileSize: 1, NameSize: 6}, Name: "owned", Data: "x"},
		{Header: Header{NLink: 1, NameSize: 11}, Name: Trailer},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("archive mismatch (-want +got):\n%s", diff)
	}
}

func TestWriterErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(w *Writer) error
		entry   Entry
		wantErr string
	}{
		{name: "empty path", entry: Entry{Path: "", Mode: TypeDir}, wantErr: "empty path"},
		{name: "root", entry: Entry{Path: "/", Mode: TypeDir}, wantErr: "names the root"},
		{name: "dot", entry: Entry{Path: ".", Mode: TypeDir}, wantErr: "names the root"},
		{name: "dotdot", entry: Entry{Path: "a/../b", Mode: TypeDir}, wantErr: "contains .."},
		{name: "nul", entry: Entry{Path: "a\x00b", Mode: TypeDir}, wantErr: "contains NUL"},
		{name: "trailer name", entry: Entry{Path: Trailer, Mode: TypeRegular}, wantErr: "reserved"},
		{name: "missing parent", entry: Entry{Path: "dev/console", Mode: TypeChar}, wantErr: `parent directory "dev" not in the archive`},
		{
			name:    "parent is a file",
			setup:   func(w *Writer) error { return w.File("f", 0o644, nil) },
			entry:   Entry{Path: "f/x", Mode: TypeRegular},
			wantErr: "is not a directory",
		},
		{
			name:    "duplicate after cleaning",
			setup:   func(w *Writer) error { return w.Dir("dev", 0o755) },
			entry:   Entry{Path: "//dev/", Mode: TypeDir},
			wantErr: "duplicate path",
		},
		{name: "no type", entry: Entry{Path: "x", Mode: 0o644}, wantErr: "unknown file type"},
		{name: "dir with data", entry: Entry{Path: "x", Mode: TypeDir, Data: []byte("a")}, wantErr: "carry data"},
		{name: "device with data", entry: Entry{Path: "x", Mode: TypeChar, Data: []byte("a")}, wantErr: "carry data"},
		{name: "empty symlink", entry: Entry{Path: "x", Mode: TypeSymlink}, wantErr: "empty target"},
		{name: "rdev on file", entry: Entry{Path: "x", Mode: TypeRegular, RDevMajor: 1}, wantErr: "device numbers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			if tt.setup != nil {
				if err := tt.setup(w); err != nil {
					t.Fatal(err)
				}
			}
			before := buf.Len()
			err := w.WriteEntry(tt.entry)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("WriteEntry(%+v) = %v, want error containing %q", tt.entry, err, tt.wantErr)
			}
			if buf.Len() != before {
				t.Errorf("a refused entry wrote %d bytes", buf.Len()-before)
			}
			// The Writer stays usable after a refused entry.
			if err := w.Dir("ok", 0o755); err != nil {
				t.Errorf("Dir after refused entry: %v", err)
			}
			if err := w.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

func TestCloseTwiceAndWriteAfterClose(t *testing.T) {
	w := NewWriter(new(bytes.Buffer))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Error("second Close succeeded")
	}
	if err := w.Dir("x", 0o755); err == nil {
		t.Error("Dir after Close succeeded")
	}
}

type failingWriter struct{ left int }

var errDiskFull = errors.New("disk full")

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) <= f.left {
		f.left -= len(p)
		return len(p), nil
	}
	n := f.left
	f.left = 0
	return n, errDiskFull
}

func TestWriteErrorIsSticky(t *testing.T) {
	w := NewWriter(&failingWriter{left: 150})
	if err := w.File("a", 0o644, make([]byte, 100)); !errors.Is(err, errDiskFull) {
		t.Fatalf("File = %v, want %v", err, errDiskFull)
	}
	if err := w.Dir("b", 0o755); !errors.Is(err, errDiskFull) {
		t.Errorf("Dir after failure = %v, want %v", err, errDiskFull)
	}
	if err := w.Close(); !errors.Is(err, errDiskFull) {
		t.Errorf("Close after failure = %v, want %v", err, errDiskFull)
	}
}

func TestDeterministic(t *testing.T) {
	build := func() []byte {
		var buf bytes.Buffer
		w := NewGzipWriter(&buf)
		_ = w.Dir("dev", 0o755)
		_ = w.CharDev("dev/console", 0o600, 5, 1)
		_ = w.File("init", 0o755, bytes.Repeat([]byte("go"), 1000))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	if a, b := build(), build(); !bytes.Equal(a, b) {
		t.Error("two builds of the same archive differ")
	}
}

// sampleArchive writes an archive exercising every entry kind and every
// padding residue, and returns the sorted list of paths GNU cpio should show.
func sampleArchive(t *testing.T, w *Writer) []string {
	t.Helper()
	paths := []string{"dev", "dev/console", "dev/null", "dev/loop0", "proc", "sys", "tmp", "init",
		"etc", "etc/empty", "etc/link", "etc/big"}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.Dir("dev", 0o755))
	must(w.CharDev("dev/console", 0o600, 5, 1))
	must(w.CharDev("dev/null", 0o666, 1, 3))
	must(w.BlockDev("dev/loop0", 0o660, 7, 0))
	must(w.Dir("proc", 0o555))
	must(w.Dir("sys", 0o555))
	must(w.Dir("tmp", 0o1777))
	must(w.File("/init", 0o755, []byte("#!/bin/sh\necho hi\n")))
	must(w.Dir("etc", 0o755))
	must(w.File("etc/empty", 0o644, nil))
	must(w.Symlink("etc/link", "../init"))
	big := make([]byte, 100003)
	for i := range big {
		big[i] = byte(i * 7)
	}
	must(w.File("etc/big", 0o600, big))
	for n := 1; n <= 8; n++ {
		p := "etc/" + strings.Repeat("p", n)
		must(w.File(p, 0o644, []byte(strings.Repeat("x", n))))
		paths = append(paths, p)
	}
	must(w.Close())
	return paths
}

func needCpio(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("GNU cpio not installed: skipping round trip")
	}
}

func cpioList(t *testing.T, archive []byte) []string {
	t.Helper()
	cmd := exec.Command("cpio", "-it", "--quiet")
	cmd.Stdin = bytes.NewReader(archive)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -it: %v\n%s", err, out)
	}
	return strings.Fields(string(out))
}

func TestGNUCpioList(t *testing.T) {
	needCpio(t)
	for _, compress := range []bool{false, true} {
		t.Run(fmt.Sprintf("gzip=%v", compress), func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			if compress {
				w = NewGzipWriter(&buf)
			}
			want := sampleArchive(t, w)
			archive := buf.Bytes()
			if compress {
				zr, err := gzip.NewReader(&buf)
				if err != nil {
					t.Fatal(err)
				}
				var raw bytes.Buffer
				if _, err := raw.ReadFrom(zr); err != nil {
					t.Fatal(err)
				}
				archive = raw.Bytes()
			}
			if diff := cmp.Diff(want, cpioList(t, archive)); diff != "" {
				t.Errorf("cpio -it listing (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGNUCpioExtract(t *testing.T) {
	needCpio(t)
	var buf bytes.Buffer
	sampleArchive(t, NewWriter(&buf))
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-idv", "--no-absolute-filenames", "-D", dir)
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -idv: %v\n%s", err, out)
	}
	root := os.Geteuid() == 0

	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read("init"); got != "#!/bin/sh\necho hi\n" {
		t.Errorf("init = %q", got)
	}
	if got := read("etc/empty"); got != "" {
		t.Errorf("etc/empty = %q", got)
	}
	big := read("etc/big")
	if len(big) != 100003 || big[100002] != byte(100002*7%256) {
		t.Errorf("etc/big: %d bytes, last %#x", len(big), big[len(big)-1])
	}
	for n := 1; n <= 8; n++ {
		if got := read("etc/" + strings.Repeat("p", n)); got != strings.Repeat("x", n) {
			t.Errorf("etc/%s = %q", strings.Repeat("p", n), got)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "etc/link")); err != nil || target != "../init" {
		t.Errorf("etc/link -> %q, %v", target, err)
	}
	perms := map[string]os.FileMode{"init": 0o755, "etc/big": 0o600, "dev": 0o755}
	if root { // cpio honours the archive's modes fully only for root (no umask games)
		perms["tmp"] = os.ModeSticky | 0o777
	}
	for p, want := range perms {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModePerm | os.ModeSticky); got != want {
			t.Errorf("%s mode = %v, want %v", p, got, want)
		}
	}
	if !root {
		t.Log("not root: device nodes not checked")
		return
	}
	devs := []struct {
		path         string
		char         bool
		major, minor uint32
	}{{"dev/console", true, 5, 1}, {"dev/null", true, 1, 3}, {"dev/loop0", false, 7, 0}}
	for _, d := range devs {
		fi, err := os.Lstat(filepath.Join(dir, d.path))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		isChar := fi.Mode()&os.ModeCharDevice != 0
		major, minor := uint32((st.Rdev>>8)&0xfff), uint32((st.Rdev&0xff)|((st.Rdev>>12)&0xfff00))
		if fi.Mode()&os.ModeDevice == 0 || isChar != d.char || major != d.major || minor != d.minor {
			t.Errorf("%s: mode %v rdev %d:%d, want char=%v %d:%d", d.path, fi.Mode(), major, minor, d.char, d.major, d.minor)
		}
	}
}
