package loader

import (
	"encoding/binary"
	"testing"
)

func TestDescriptors(t *testing.T) {
	// Well-known encodings of flat segments (Intel SDM vol. 3, 3.4.5).
	for _, c := range []struct {
		name string
		s    Segment
		want uint64
	}{
		{"code64", code64, 0x00af9b000000ffff},
		{"code32", code32, 0x00cf9b000000ffff},
		{"data", data, 0x00cf93000000ffff},
		{"tss", tss, 0x00008b0000000067},
		{"base and limit", Segment{Base: 0x12345678, Limit: 0xabcde, Type: 2, S: true, Present: true, DPL: 3}, 0x120af2345678bcde},
	} {
		if got := c.s.Descriptor(); got != c.want {
			t.Errorf("%s: %#016x, want %#016x", c.name, got, c.want)
		}
	}
	g := gdtBytes()
	if len(g) != int(bootGDT.Limit)+1 {
		t.Fatalf("GDT is %d bytes, limit %d", len(g), bootGDT.Limit)
	}
	le := binary.LittleEndian
	for sel, want := range map[int]uint64{0: 0, SelCode32: code32.Descriptor(), SelCode64: code64.Descriptor(), SelData: data.Descriptor(), SelTSS: tss.Descriptor(), SelTSS + 8: 0} {
		if got := le.Uint64(g[sel:]); got != want {
			t.Errorf("GDT[%#x] = %#x, want %#x", sel, got, want)
		}
	}
	if SelCode64 != 0x10 || SelData != 0x18 {
		t.Fatal("boot.rst requires __BOOT_CS = 0x10 and __BOOT_DS = 0x18")
	}
}

// TestPageTables walks the identity map the way the MMU does.
func TestPageTables(t *testing.T) {
	mem := newMem(t, 2*mib)
	if err := mem.Write(PageTableAddr, pageTables()); err != nil {
		t.Fatal(err)
	}
	entry := func(table, index uint64) uint64 {
		v, err := mem.Read64(table + 8*index)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const addrMask = 0x000ffffffffff000
	for _, va := range []uint64{0, 0x1fffff, 0x200000, 0x1000000 + 0x1234, 1 << 30, 0xbfe00000, 0xfee00000, 0xffffffff} {
		pml4e := entry(PageTableAddr, va>>39&511)
		pdpte := entry(pml4e&addrMask, va>>30&511)
		pde := entry(pdpte&addrMask, va>>21&511)
		if pml4e&3 != 3 || pdpte&3 != 3 || pde&0x83 != 0x83 {
			t.Fatalf("%#x: flags %#x %#x %#x", va, pml4e, pdpte, pde)
		}
		if pa := pde&0xfffffffe00000 | va&0x1fffff; pa != va {
			t.Fatalf("%#x maps to %#x", va, pa)
		}
	}
	for i := uint64(1); i < 512; i++ {
		if entry(PageTableAddr, i) != 0 {
			t.Fatalf("PML4[%d] set", i)
		}
		if i >= 4 && entry(PageTableAddr+pageSize, i) != 0 {
			t.Fatalf("PDPT[%d] set: more than 4 GiB mapped", i)
		}
	}
	// Every 2 MiB page of the first 4 GiB, in order.
	for i := uint64(0); i < 2048; i++ {
		if got := entry(PageTableAddr+2*pageSize, i); got != i<<21|0x83 {
			t.Fatalf("PD entry %d = %#x", i, got)
		}
	}
}
