package loader

import (
	"encoding/binary"
	"sort"

	"github.com/microvm/microvm/kvm/guestmem"
)

// E820Type is the type of an e820 (and PVH memory map) entry.
type E820Type uint32

// The e820 types the loader emits. PVH's XEN_HVM_MEMMAP_TYPE_* use the same
// numbers.
const (
	E820RAM      E820Type = 1
	E820Reserved E820Type = 2
)

// E820Entry is one entry of the memory map given to the guest.
type E820Entry struct {
	Addr uint64
	Size uint64
	Type E820Type
}

// MaxE820 is how many entries the zero page's e820_table holds
// (E820_MAX_ENTRIES_ZEROPAGE); the PVH map is held to the same bound.
const MaxE820 = 128

// E820 returns the memory map docs/machine.md describes for guest memory made
// of ranges: RAM below the EBDA, the EBDA [0x9fc00, 0xa0000) and the legacy
// hole [0xa0000, 0x100000) reserved, RAM from 1 MiB, and every range above as
// RAM. Only address space that ranges cover is listed (the MMIO gap is not);
// RAM pieces that touch are merged. The boot structures below 1 MiB are
// deliberately left RAM: the kernel reads them early and reuses the memory.
func E820(ranges []guestmem.Range) []E820Entry {
	rs := append([]guestmem.Range(nil), ranges...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].GPA < rs[j].GPA })
	pieces := []struct {
		start, end uint64
		typ        E820Type
	}{
		{0, ebdaStart, E820RAM},
		{ebdaStart, ebdaEnd, E820Reserved},
		{ebdaEnd, highMem, E820Reserved},
		{highMem, ^uint64(0), E820RAM},
	}
	var out []E820Entry
	for _, rg := range rs {
		for _, p := range pieces {
			lo, hi := max(rg.GPA, p.start), min(rg.End(), p.end)
			if lo >= hi {
				continue
			}
			if n := len(out); n > 0 && p.typ == E820RAM && out[n-1].Type == E820RAM && out[n-1].Addr+out[n-1].Size == lo {
				out[n-1].Size += hi - lo
				continue
			}
			out = append(out, E820Entry{Addr: lo, Size: hi - lo, Type: p.typ})
		}
	}
	return out
}

// e820EntrySize is sizeof(struct boot_e820_entry), packed: addr, size, type.
// The PVH hvm_memmap_table_entry has the same fields plus a reserved u32.
const e820EntrySize = 20

func putE820(b []byte, e E820Entry) {
	binary.LittleEndian.PutUint64(b[0:], e.Addr)
	binary.LittleEndian.PutUint64(b[8:], e.Size)
	binary.LittleEndian.PutUint32(b[16:], uint32(e.Type))
}
