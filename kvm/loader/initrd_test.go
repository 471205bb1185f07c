package loader

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInitrdAddr(t *testing.T) {
	tests := []struct {
		name      string
		n, lo, hi uint64
		want      uint64
		ok        bool
	}{
		{"top page aligned", 0x1000, 0x100000, 0x400000, 0x3ff000, true},
		{"rounds down", 0x1001, 0x100000, 0x400000, 0x3fe000, true},
		{"exactly fills", 0x300000, 0x100000, 0x400000, 0x100000, true},
		{"lo rounds up", 0x2000, 0x100001, 0x103000, 0x101000, true},
		{"one byte too many", 0x300001, 0x100000, 0x400000, 0, false},
		{"larger than hi", 0x500000, 0, 0x400000, 0, false},
		{"unaligned hi", 0x1000, 0x100000, 0x400fff, 0x3ff000, true},
		{"empty", 0, 0, 0x400000, 0, false},
	}
	for _, tc := range tests {
		got, ok := initrdAddr(tc.n, tc.lo, tc.hi)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: initrdAddr(%#x, %#x, %#x) = %#x, %v; want %#x, %v", tc.name, tc.n, tc.lo, tc.hi, got, ok, tc.want, tc.ok)
		}
	}
}

func TestInitrdPlacement(t *testing.T) {
	bz := defaultBz()
	limited := defaultBz()
	limited.initrdMax = 0x1ffffff // 32 MiB - 1
	tests := []struct {
		name    string
		kernel  []byte
		memSize uint64
		initrd  int
		want    uint64 // expected address; 0 with msg: error
		msg     string
	}{
		{"bzImage top of RAM", makeBzImage(bz), 64 * mib, 3*mib + 5, 61*mib - 0x1000, ""},
		{"bzImage initrd_addr_max", makeBzImage(limited), 64 * mib, mib, 31 * mib, ""},
		{"bzImage initrd_addr_max 2 GiB", makeBzImage(bz), 5 << 30, 8192, 0x7fffe000, ""},
		{"PVH below the MMIO gap", makeELF(defaultPVH()), 5 << 30, 8192, 0xbfffe000, ""},
		{"PVH top of RAM", makeELF(defaultPVH()), 64 * mib, 4096, 64*mib - 4096, ""},
		{"PVH fills to the kernel", makeELF(defaultPVH()), 64 * mib, 64*mib - 0x1003000, 0x1003000, ""},
		{"PVH one page too many", makeELF(defaultPVH()), 64 * mib, 64*mib - 0x1003000 + 1, 0,
			"initrd bar (47.98 MiB) does not fit between the end of the kernel at 0x1003000 and the top of low RAM at 0x4000000"},
		{"bzImage above init_size", makeBzImage(bz), 64 * mib, 44*mib + 1, 0,
			"initrd bar (44.00 MiB) does not fit between the end of the kernel at 0x1400000 and the top of low RAM at 0x4000000"},
		{"bzImage initrd_addr_max too low", makeBzImage(limited), 64 * mib, 12*mib + 1, 0,
			"initrd bar (12.00 MiB) does not fit between the end of the kernel at 0x1400000 and the kernel's initrd_addr_max at 0x2000000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := newMem(t, tc.memSize)
			data := pattern(tc.initrd, 0x77)
			rd := BytesImage("bar", data)
			b, err := Load(mem, Config{Kernel: BytesImage("foo", tc.kernel), Initrd: &rd, CPUs: 1})
			if tc.msg != "" {
				if !errors.Is(err, ErrTooBig) || err.Error() != tc.msg {
					t.Fatalf("Load = %v\nwant %q", err, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Initrd.GPA != tc.want || b.Initrd.Size != uint64(tc.initrd) {
				t.Fatalf("initrd at %#x+%#x, want %#x", b.Initrd.GPA, b.Initrd.Size, tc.want)
			}
			got := make([]byte, tc.initrd)
			if err := mem.Read(b.Initrd.GPA, got); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("initrd contents differ (%v)", err)
			}
			if b.Initrd.GPA < b.Kernel.End() {
				t.Fatalf("initrd at %#x overlaps the kernel up to %#x", b.Initrd.GPA, b.Kernel.End())
			}
			switch b.Kind {
			case BzImage:
				img, _ := mem.Read32(BootParamsAddr + 0x218)
				sz, _ := mem.Read32(BootParamsAddr + 0x21c)
				if uint64(img) != tc.want || int(sz) != tc.initrd {
					t.Fatalf("ramdisk_image/size = %#x/%#x", img, sz)
				}
			case PVH:
				n, _ := mem.Read32(StartInfoAddr + 12)
				list, _ := mem.Read64(StartInfoAddr + 16)
				addr, _ := mem.Read64(list)
				sz, _ := mem.Read64(list + 8)
				if n != 1 || addr != tc.want || sz != uint64(tc.initrd) {
					t.Fatalf("module list: %d modules, %#x+%#x", n, addr, sz)
				}
			}
		})
	}
}

// failingReader returns an error for any read past limit.
type failingReader struct {
	r     io.ReaderAt
	limit int64
}

func (f failingReader) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.limit {
		return 0, errors.New("disk on fire")
	}
	return f.r.ReadAt(p, off)
}

func TestReadErrors(t *testing.T) {
	bz := makeBzImage(defaultBz())
	mem := newMem(t, 64*mib)
	k := Image{Name: "foo", R: failingReader{bytes.NewReader(bz), 0x1000}, Size: int64(len(bz))}
	if _, err := Load(mem, Config{Kernel: k, CPUs: 1}); err == nil || !strings.Contains(err.Error(), "disk on fire") || !strings.HasPrefix(err.Error(), "kernel foo: ") {
		t.Fatalf("kernel read error: %v", err)
	}
	// A file shorter than its stated size.
	k = Image{Name: "foo", R: bytes.NewReader(bz[:len(bz)-10]), Size: int64(len(bz))}
	if _, err := Load(mem, Config{Kernel: k, CPUs: 1}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short kernel: %v", err)
	}
	data := pattern(8192, 1)
	rd := Image{Name: "bar", R: failingReader{bytes.NewReader(data), 100}, Size: 8192}
	if _, err := Load(mem, Config{Kernel: BytesImage("foo", bz), Initrd: &rd, CPUs: 1}); err == nil || !strings.HasPrefix(err.Error(), "initrd bar: ") {
		t.Fatalf("initrd read error: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	bz := BytesImage("foo", makeBzImage(defaultBz()))
	mem := newMem(t, 64*mib)
	empty := BytesImage("bar", nil)
	tests := []struct {
		name string
		cfg  Config
		kind error
	}{
		{"no kernel", Config{CPUs: 1}, ErrConfig},
		{"zero CPUs", Config{Kernel: bz}, ErrTooManyCPUs},
		{"too many CPUs", Config{Kernel: bz, CPUs: MaxCPUs + 1}, ErrTooManyCPUs},
		{"empty initrd", Config{Kernel: bz, CPUs: 1, Initrd: &empty}, ErrConfig},
		{"e820 too long", Config{Kernel: bz, CPUs: 1, E820: make([]E820Entry, 129)}, ErrTooBig},
		{"unknown format", Config{Kernel: BytesImage("foo", []byte("MZ\x90\x00 not a kernel")), CPUs: 1}, ErrUnknownFormat},
		{"tiny file", Config{Kernel: BytesImage("foo", []byte{1}), CPUs: 1}, ErrUnknownFormat},
	}
	for _, tc := range tests {
		if _, err := Load(mem, tc.cfg); !errors.Is(err, tc.kind) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.kind)
		}
	}
	if _, err := Load(newMem(t, 0x9f000), Config{Kernel: bz, CPUs: 1}); !errors.Is(err, ErrConfig) {
		t.Errorf("memory without 1 MiB: %v", err)
	}
	_, err := Load(mem, Config{Kernel: BytesImage("foo", []byte("MZ\x90\x00 not a kernel")), CPUs: 1})
	if want := "kernel foo: not a bzImage or ELF kernel (starts with 4d5a9000, no HdrS at 0x202)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

func TestFileImage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bzImage")
	if err := os.WriteFile(path, makeBzImage(defaultBz()), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := FileImage(f)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != path {
		t.Fatalf("name %q", img.Name)
	}
	b, err := Load(newMem(t, 64*mib), Config{Kernel: img, CPUs: 4, Cmdline: "console=ttyS0"})
	if err != nil || b.Kind != BzImage {
		t.Fatalf("Load = %+v, %v", b, err)
	}
	d, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := FileImage(d); !errors.Is(err, ErrConfig) {
		t.Fatalf("directory: %v", err)
	}
}
