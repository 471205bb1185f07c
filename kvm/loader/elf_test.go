package loader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func TestELFNoteDiscovery(t *testing.T) {
	seg := []elfSeg{{paddr: 0x1000000, data: pattern(4096, 1)}}
	desc8 := make([]byte, 8)
	binary.LittleEndian.PutUint64(desc8, 0x1000010)
	tests := []struct {
		name     string
		spec     elfSpec
		pvh      bool
		pvhEntry uint64
		kind     error // parse error, nil if none
	}{
		{"ELF64 PT_NOTE", elfSpec{segs: seg, notes: pvhNote(0x1000020), notePhdr: true}, true, 0x1000020, nil},
		{"ELF64 SHT_NOTE only", elfSpec{segs: seg, notes: pvhNote(0x1000020), noteShdr: true}, true, 0x1000020, nil},
		{"ELF64 no note", elfSpec{segs: seg}, false, 0, nil},
		{"ELF64 other notes only", elfSpec{segs: seg, notes: note("GNU", 18, []byte{1, 2, 3, 4}, 4), notePhdr: true}, false, 0, nil},
		{"Xen note of another type", elfSpec{segs: seg, notes: note("Xen", 17, []byte{1, 2, 3, 4}, 4), notePhdr: true}, false, 0, nil},
		{"after a GNU note", elfSpec{segs: seg, notes: append(note("GNU", 3, pattern(20, 0), 4), pvhNote(0x1000040)...), notePhdr: true}, true, 0x1000040, nil},
		{"8-byte descriptor", elfSpec{segs: seg, notes: note("Xen", 18, desc8, 4), notePhdr: true}, true, 0x1000010, nil},
		{"8-aligned note block", elfSpec{segs: seg, notes: append(note("GNU", 5, pattern(4, 0), 8), note("Xen", 18, desc8, 8)...), notePhdr: true, noteAlign: 8}, true, 0x1000010, nil},
		{"ELF32 PT_NOTE", elfSpec{class32: true, segs: seg, notes: pvhNote(0x1000020), notePhdr: true}, true, 0x1000020, nil},
		{"ELF32 SHT_NOTE", elfSpec{class32: true, segs: seg, notes: pvhNote(0x1000020), noteShdr: true}, true, 0x1000020, nil},
		{"ELF32 no note", elfSpec{class32: true, segs: seg}, false, 0, nil},
		{"2-byte descriptor", elfSpec{segs: seg, notes: note("Xen", 18, []byte{1, 2}, 4), notePhdr: true}, false, 0, ErrMalformed},
		{"note overruns block", elfSpec{segs: seg, notes: pvhNote(0x1000020)[:18], notePhdr: true}, false, 0, ErrMalformed},
		{"wrong machine", elfSpec{segs: seg, machine: 183}, false, 0, ErrUnsupported},
		{"no segments", elfSpec{notes: pvhNote(0x1000020), notePhdr: true}, false, 0, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := parseELF(BytesImage("k", makeELF(tc.spec)))
			if tc.kind != nil {
				if !errors.Is(err, tc.kind) {
					t.Fatalf("parseELF = %v, want %v", err, tc.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if k.pvh != tc.pvh || k.pvhEntry != tc.pvhEntry || k.is64 == tc.spec.class32 {
				t.Fatalf("pvh=%v entry=%#x is64=%v, want pvh=%v entry=%#x", k.pvh, k.pvhEntry, k.is64, tc.pvh, tc.pvhEntry)
			}
		})
	}
}

// TestELFGarbage damages a valid PVH ELF field by field; every result must be
// an error of a known kind, never a panic or a silent success with nonsense.
func TestELFGarbage(t *testing.T) {
	good := makeELF(defaultPVH())
	le := binary.LittleEndian
	tests := []struct {
		name string
		edit func([]byte) []byte
		kind error
	}{
		{"truncated ident", func(b []byte) []byte { return b[:10] }, ErrMalformed},
		{"truncated header", func(b []byte) []byte { return b[:40] }, ErrMalformed},
		{"truncated program headers", func(b []byte) []byte { return b[:64+30] }, ErrMalformed},
		{"class 3", func(b []byte) []byte { b[4] = 3; return b }, ErrMalformed},
		{"big endian", func(b []byte) []byte { b[5] = 2; return b }, ErrUnsupported},
		{"relocatable object", func(b []byte) []byte { le.PutUint16(b[16:], 1); return b }, ErrUnsupported},
		{"phnum 0", func(b []byte) []byte { le.PutUint16(b[56:], 0); return b }, ErrMalformed},
		{"phnum PN_XNUM", func(b []byte) []byte { le.PutUint16(b[56:], 0xffff); return b }, ErrMalformed},
		{"phentsize 32", func(b []byte) []byte { le.PutUint16(b[54:], 32); return b }, ErrMalformed},
		{"phoff past end", func(b []byte) []byte { le.PutUint64(b[32:], 1<<40); return b }, ErrMalformed},
		{"phoff wraps", func(b []byte) []byte { le.PutUint64(b[32:], ^uint64(0)-8); return b }, ErrMalformed},
		{"segment offset past end", func(b []byte) []byte { le.PutUint64(b[64+8:], 1<<20); return b }, ErrMalformed},
		{"segment filesz > memsz", func(b []byte) []byte { le.PutUint64(b[64+40:], 16); return b }, ErrMalformed},
		{"segment above 4 GiB", func(b []byte) []byte { le.PutUint64(b[64+24:], 0xffffffff); return b }, ErrUnsupported},
		{"segment paddr wraps", func(b []byte) []byte { le.PutUint64(b[64+24:], ^uint64(0)-100); return b }, ErrUnsupported},
		{"note size absurd", func(b []byte) []byte { le.PutUint64(b[64+56+32:], 1<<30); return b }, ErrMalformed},
		{"note namesz huge", func(b []byte) []byte {
			off := le.Uint64(b[64+56+8:])
			le.PutUint32(b[off:], 0xfffffff0)
			return b
		}, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img := tc.edit(bytes.Clone(good))
			mem := newMem(t, 64*mib)
			_, err := Load(mem, Config{Kernel: BytesImage("vmlinux", img), CPUs: 1})
			if !errors.Is(err, tc.kind) {
				t.Fatalf("Load = %v, want %v", err, tc.kind)
			}
			if !strings.HasPrefix(err.Error(), "kernel vmlinux: ") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not one line naming the file", err)
			}
		})
	}
}

func TestLoadELF(t *testing.T) {
	pvh := defaultPVH()
	elf64NoNote := defaultPVH()
	elf64NoNote.notes, elf64NoNote.notePhdr = nil, false
	elf64NoNote.entry = 0x1000000 // physical, as a vmlinux's e_entry is
	virtEntry := elf64NoNote
	virtEntry.entry = 0xffffffff81000080
	elf32NoNote := elf64NoNote
	elf32NoNote.class32 = true
	elf32NoNote.segs = []elfSeg{{paddr: 0x1000000, data: pattern(100, 2)}}
	pvh32 := elf32NoNote
	pvh32.notes, pvh32.notePhdr = pvhNote(0x1000010), true
	overlap := defaultPVH()
	overlap.segs = append(overlap.segs, elfSeg{paddr: 0x9f000, data: pattern(0x2000, 3)})
	lowOK := defaultPVH()
	lowOK.segs = append(lowOK.segs, elfSeg{paddr: 0x30000, data: pattern(0x1000, 3)})
	outside := defaultPVH()
	outside.segs[0].paddr = 0x3ffe000
	badEntry := defaultPVH()
	badEntry.notes = pvhNote(0x2000000)

	tests := []struct {
		name  string
		spec  elfSpec
		kind  Kind
		rip   uint64
		err   error
		msg   string
		check bool // check loaded bytes and bss of segment 0
	}{
		{"PVH ELF64", pvh, PVH, 0x1000100, nil, "", true},
		{"PVH ELF32", pvh32, PVH, 0x1000010, nil, "", false},
		{"ELF64 vmlinux", elf64NoNote, ELF64, 0x1000000, nil, "", true},
		{"ELF64 virtual entry", virtEntry, ELF64, 0x1000080, nil, "", false},
		{"ELF32 without note", elf32NoNote, 0, 0, ErrUnsupported, "ELF32 kernel without a PVH entry note", false},
		{"segment over the EBDA", overlap, 0, 0, ErrUnsupported, "overlaps the EBDA", false},
		{"segment below 1 MiB in free RAM", lowOK, PVH, 0x1000100, nil, "", false},
		{"segment outside RAM", outside, 0, 0, ErrTooBig, "outside guest RAM", false},
		{"entry outside segments", badEntry, 0, 0, ErrMalformed, "entry point 0x2000000 is in no loadable segment", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := newMem(t, 64*mib)
			if err := mem.Write(0x1000000, bytes.Repeat([]byte{0xff}, 16384)); err != nil {
				t.Fatal(err)
			}
			b, err := Load(mem, Config{Kernel: BytesImage("vmlinux", makeELF(tc.spec)), Cmdline: "x", CPUs: 2})
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("Load = %v, want %v with %q", err, tc.err, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Kind != tc.kind || b.RIP != tc.rip {
				t.Fatalf("kind %v rip %#x, want %v %#x", b.Kind, b.RIP, tc.kind, tc.rip)
			}
			if tc.check {
				s := tc.spec.segs[0]
				got := make([]byte, s.memsz)
				if err := mem.Read(s.paddr, got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got[:len(s.data)], s.data) {
					t.Fatal("segment data not loaded at p_paddr")
				}
				if !bytes.Equal(got[len(s.data):], make([]byte, int(s.memsz)-len(s.data))) {
					t.Fatal("bss (p_memsz - p_filesz) not zeroed")
				}
			}
			switch b.Kind {
			case PVH:
				if b.Mode != Protected32 || b.RBX != StartInfoAddr || b.RSI != 0 || b.CR0 != 0x11 || b.CR3 != 0 || b.EFER != 0 || b.CS.Selector != 0x08 {
					t.Fatalf("PVH entry state %+v", b)
				}
				if v, _ := mem.Read32(StartInfoAddr); v != hvmStartMagic {
					t.Fatalf("start info magic %#x", v)
				}
			case ELF64:
				if b.Mode != Long64 || b.RSI != BootParamsAddr || b.CR0 != 0x80000011 || b.CR4 != 0x20 || b.EFER != 0x500 || b.CS.Selector != 0x10 || b.DS.Selector != 0x18 {
					t.Fatalf("64-bit entry state %+v", b)
				}
				if v, _ := mem.Read16(BootParamsAddr + 0x1fe); v != 0xaa55 {
					t.Fatalf("boot_flag %#x", v)
				}
			}
		})
	}
}

func TestScanNotesBounds(t *testing.T) {
	for _, b := range [][]byte{nil, {1}, make([]byte, 11), make([]byte, 12), make([]byte, 13), bytes.Repeat([]byte{0xff}, 40)} {
		for _, align := range []uint64{0, 4, 8, 16} {
			_, _, _ = scanNotes(b, align) // must not panic
		}
	}
}
