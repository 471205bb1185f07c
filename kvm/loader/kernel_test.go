package loader

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// realKernel opens build/kernel/<name> (built by guest/kernel/build.sh), or
// skips when it has not been built.
func realKernel(t *testing.T, name string) (Image, *os.File) {
	t.Helper()
	path := filepath.Join("..", "..", "build", "kernel", name)
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("no real kernel to load (%v); build it with guest/kernel/build.sh", err)
	}
	t.Cleanup(func() { f.Close() })
	img, err := FileImage(f)
	if err != nil {
		t.Fatal(err)
	}
	return img, f
}

func TestRealBzImage(t *testing.T) {
	img, f := realKernel(t, "bzImage")
	mem := newMem(t, 256*mib)
	rd := BytesImage("initrd", pattern(1<<20, 9))
	b, err := Load(mem, Config{Kernel: img, Initrd: &rd, Cmdline: "console=ttyS0 reboot=k panic=-1", CPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %v, entry %#x, kernel %#x+%#x, initrd %#x", img.Name, b.Kind, b.RIP, b.Kernel.GPA, b.Kernel.Size, b.Initrd.GPA)
	if b.Kind != BzImage || b.Mode != Long64 || b.RIP != 0x100200 {
		t.Fatalf("boot %+v", b)
	}
	// The setup header is copied from the file into boot_params.
	hdr := make([]byte, 0x26c-0x1f1)
	if _, err := f.ReadAt(hdr, 0x1f1); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(hdr))
	if err := mem.Read(BootParamsAddr+0x1f1, got); err != nil {
		t.Fatal(err)
	}
	for off := range hdr { // except the fields the loader fills in
		a := 0x1f1 + off
		if a == 0x1fa || a == 0x1fb || a == 0x210 || a == 0x224 || a == 0x225 || (a >= 0x218 && a < 0x220) || (a >= 0x228 && a < 0x22c) {
			continue
		}
		if hdr[off] != got[off] {
			t.Fatalf("boot_params byte %#x = %#x, file has %#x", a, got[off], hdr[off])
		}
	}
	setup := (int(hdr[0]) + 1) * 512
	if hdr[0] == 0 {
		setup = 5 * 512
	}
	want := make([]byte, 4096)
	if _, err := f.ReadAt(want, int64(setup)); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 4096)
	if err := mem.Read(KernelAddr, first); err != nil || !bytes.Equal(first, want) {
		t.Fatalf("protected-mode kernel not at 1 MiB (%v)", err)
	}
}

func TestRealVmlinux(t *testing.T) {
	img, f := realKernel(t, "vmlinux")
	// Cross-check against debug/elf: the PVH note and the PT_LOAD contents.
	ef, err := elf.NewFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var pvhEntry uint64
	for _, p := range ef.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes := make([]byte, p.Filesz)
		if _, err := p.ReadAt(notes, 0); err != nil {
			t.Fatal(err)
		}
		for len(notes) >= 12 {
			namesz, descsz, typ := binary.LittleEndian.Uint32(notes), binary.LittleEndian.Uint32(notes[4:]), binary.LittleEndian.Uint32(notes[8:])
			name := notes[12 : 12+namesz]
			desc := notes[12+(namesz+3)&^3:]
			if typ == 18 && string(name) == "Xen\x00" {
				pvhEntry = binary.LittleEndian.Uint64(append(desc[:descsz:descsz], make([]byte, 8)...)) & 0xffffffff
			}
			notes = notes[min(uint32(len(notes)), 12+(namesz+3)&^3+(descsz+3)&^3):]
		}
	}
	mem := newMem(t, 256*mib)
	b, err := Load(mem, Config{Kernel: img, Cmdline: "console=ttyS0", CPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %v, entry %#x (debug/elf: PVH entry %#x, e_entry %#x), kernel %#x+%#x", img.Name, b.Kind, b.RIP, pvhEntry, ef.Entry, b.Kernel.GPA, b.Kernel.Size)
	wantKind := ELF64
	wantRIP := ef.Entry
	if pvhEntry != 0 {
		wantKind, wantRIP = PVH, pvhEntry
	}
	if b.Kind != wantKind || b.RIP != wantRIP {
		t.Fatalf("kind %v entry %#x, want %v %#x", b.Kind, b.RIP, wantKind, wantRIP)
	}
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || p.Filesz == 0 {
			continue
		}
		n := min(p.Filesz, 64<<10)
		want := make([]byte, n)
		if _, err := p.ReadAt(want, 0); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := mem.Read(p.Paddr, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("segment at %#x not loaded (%v)", p.Paddr, err)
		}
		if p.Memsz > p.Filesz {
			tail := make([]byte, min(p.Memsz-p.Filesz, 64<<10))
			if err := mem.Read(p.Paddr+p.Filesz, tail); err != nil || !bytes.Equal(tail, make([]byte, len(tail))) {
				t.Fatalf("bss after %#x not zero (%v)", p.Paddr, err)
			}
		}
	}
}

// TestRealVmlinuxWithoutPVHNote boots the real vmlinux through the ELF64 path
// by renaming its PVH note's type.
func TestRealVmlinuxWithoutPVHNote(t *testing.T) {
	_, f := realKernel(t, "vmlinux")
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	hdr := []byte("\x04\x00\x00\x00")
	patched := 0
	for i := 0; i+16 <= len(data); i += 4 {
		if bytes.Equal(data[i:i+4], hdr) && binary.LittleEndian.Uint32(data[i+8:]) == 18 && string(data[i+12:i+16]) == "Xen\x00" {
			binary.LittleEndian.PutUint32(data[i+8:], 0x7f)
			patched++
		}
	}
	if patched == 0 {
		t.Skip("no PVH note to remove")
	}
	b, err := Load(newMem(t, 256*mib), Config{Kernel: BytesImage("vmlinux", data), CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if entry := binary.LittleEndian.Uint64(data[24:]); b.Kind != ELF64 || b.Mode != Long64 || b.RIP != entry {
		t.Fatalf("kind %v mode %v entry %#x", b.Kind, b.Mode, b.RIP)
	}
}
