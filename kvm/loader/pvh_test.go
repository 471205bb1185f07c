package loader

import (
	"encoding/binary"
	"errors"
	"testing"
)

// TestStartInfoLayout checks the sizes against struct hvm_start_info (v1),
// hvm_modlist_entry and hvm_memmap_table_entry in start_info.h.
func TestStartInfoLayout(t *testing.T) {
	if startInfoSize != 4*4+4*8+4+4 || modlistEntrySize != 4*8 || memmapEntrySize != 8+8+4+4 {
		t.Fatalf("sizes %d/%d/%d", startInfoSize, modlistEntrySize, memmapEntrySize)
	}
	if StartInfoAddr+startInfoSize+modlistEntrySize+MaxE820*memmapEntrySize > BootParamsAddr {
		t.Fatal("start info, module list and a full memory map overrun the page")
	}
}

func TestStartInfoEncoding(t *testing.T) {
	e820 := E820(machineRanges(5 << 30))
	le := binary.LittleEndian
	tests := []struct {
		name string
		si   startInfo
	}{
		{"initrd and map", startInfo{cmdline: CmdlineAddr, initrd: 0x3f00000, initrdSize: 0x12345, memmap: e820}},
		{"no initrd", startInfo{cmdline: CmdlineAddr, memmap: e820}},
		{"no map", startInfo{cmdline: CmdlineAddr}},
		{"with ACPI", startInfo{cmdline: CmdlineAddr, rsdp: 0xe0000, memmap: e820}},
		{"full map", startInfo{cmdline: CmdlineAddr, initrd: 0x1000, initrdSize: 1, memmap: make([]E820Entry, MaxE820)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.si.encode()
			if err != nil {
				t.Fatal(err)
			}
			nmod := 0
			if tc.si.initrdSize > 0 {
				nmod = 1
			}
			if want := startInfoSize + nmod*modlistEntrySize + len(tc.si.memmap)*memmapEntrySize; len(b) != want {
				t.Fatalf("%d bytes, want %d", len(b), want)
			}
			u32 := func(off uint64) uint64 { return uint64(le.Uint32(b[off:])) }
			u64 := func(off uint64) uint64 { return le.Uint64(b[off:]) }
			check := func(what string, got, want uint64) {
				t.Helper()
				if got != want {
					t.Errorf("%s = %#x, want %#x", what, got, want)
				}
			}
			check("magic", u32(0), 0x336ec578)
			check("version", u32(4), 1)
			check("flags", u32(8), 0)
			check("nr_modules", u32(12), uint64(nmod))
			check("cmdline_paddr", u64(24), CmdlineAddr)
			check("rsdp_paddr", u64(32), tc.si.rsdp)
			check("memmap_entries", u32(48), uint64(len(tc.si.memmap)))
			check("reserved", u32(52), 0)
			if nmod == 1 {
				check("modlist_paddr", u64(16), StartInfoAddr+56)
				check("module paddr", u64(56), tc.si.initrd)
				check("module size", u64(64), tc.si.initrdSize)
				check("module cmdline_paddr", u64(72), 0)
				check("module reserved", u64(80), 0)
			} else {
				check("modlist_paddr", u64(16), 0)
			}
			mapAt := uint64(56 + nmod*32)
			if len(tc.si.memmap) > 0 {
				check("memmap_paddr", u64(40), StartInfoAddr+mapAt)
			} else {
				check("memmap_paddr", u64(40), 0)
			}
			for i, e := range tc.si.memmap {
				p := mapAt + uint64(i)*24
				check("map addr", u64(p), e.Addr)
				check("map size", u64(p+8), e.Size)
				check("map type", u32(p+16), uint64(e.Type))
				check("map reserved", u32(p+20), 0)
			}
		})
	}
	if _, err := (&startInfo{memmap: make([]E820Entry, MaxE820+1)}).encode(); !errors.Is(err, ErrTooBig) {
		t.Fatalf("oversized map: %v", err)
	}
}
