package loader

import (
	"encoding/binary"
	"errors"
	"testing"
)

func sum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return s
}

func TestMPTable(t *testing.T) {
	if MaxCPUs < 32 {
		t.Fatalf("MaxCPUs = %d, need at least 32", MaxCPUs)
	}
	le := binary.LittleEndian
	for n := 1; n <= MaxCPUs; n++ {
		mem := newMem(t, 2*mib)
		if err := WriteMPTable(mem, n); err != nil {
			t.Fatalf("%d CPUs: %v", n, err)
		}
		// Find the floating pointer the way Linux does: "_MP_" on a 16-byte
		// boundary in the last KiB of base memory.
		ebda := make([]byte, 1024)
		if err := mem.Read(ebdaStart, ebda); err != nil {
			t.Fatal(err)
		}
		var mpf []byte
		for off := 0; off < len(ebda); off += 16 {
			if string(ebda[off:off+4]) == "_MP_" {
				mpf = ebda[off : off+16]
				break
			}
		}
		if mpf == nil {
			t.Fatalf("%d CPUs: no floating pointer", n)
		}
		if sum(mpf) != 0 || mpf[8] != 1 || mpf[9] != 4 || mpf[11] != 0 {
			t.Fatalf("%d CPUs: floating pointer % x", n, mpf)
		}
		phys := uint64(le.Uint32(mpf[4:]))
		if phys < ebdaStart || phys >= ebdaEnd {
			t.Fatalf("configuration table at %#x, outside the EBDA", phys)
		}
		tbl := ebda[phys-ebdaStart:]
		length := int(le.Uint16(tbl[4:]))
		if string(tbl[:4]) != "PCMP" || tbl[6] != 4 || int(phys-ebdaStart)+length > 1024 {
			t.Fatalf("%d CPUs: header % x (length %d)", n, tbl[:44], length)
		}
		if sum(tbl[:length]) != 0 {
			t.Fatalf("%d CPUs: configuration table checksum", n)
		}
		if a := le.Uint32(tbl[36:]); a != 0xfee00000 {
			t.Fatalf("LAPIC address %#x", a)
		}
		count := int(le.Uint16(tbl[34:]))
		if count != n+28 {
			t.Fatalf("%d CPUs: %d entries, want %d", n, count, n+28)
		}
		// Walk the entries.
		var procs, bsps, buses, ioapics, ioints, locints int
		pins := map[int]bool{}
		lastType := byte(0)
		off := 44
		for i := 0; i < count; i++ {
			e := tbl[off:]
			if e[0] < lastType {
				t.Fatalf("entry %d of type %d after type %d", i, e[0], lastType)
			}
			lastType = e[0]
			switch e[0] {
			case mpTypeProc:
				if int(e[1]) != procs || e[3]&mpCPUEnabled == 0 {
					t.Fatalf("processor entry %d: % x", procs, e[:20])
				}
				if e[3]&mpCPUBSP != 0 {
					bsps++
					if procs != 0 {
						t.Fatalf("BSP is CPU %d", procs)
					}
				}
				procs++
				off += 20
				continue
			case mpTypeBus:
				if string(e[2:8]) != "ISA   " {
					t.Fatalf("bus %q", e[2:8])
				}
				buses++
			case mpTypeIOAPIC:
				if int(e[1]) != n || e[2] != 0x11 || e[3] != 1 || le.Uint32(e[4:]) != 0xfec00000 {
					t.Fatalf("IOAPIC entry % x", e[:8])
				}
				ioapics++
			case mpTypeIOInt:
				if e[1] != mpIntINT || le.Uint16(e[2:]) != 0 || e[5] != e[7] || int(e[6]) != n {
					t.Fatalf("I/O interrupt entry % x", e[:8])
				}
				pins[int(e[7])] = true
				ioints++
			case mpTypeLocInt:
				locints++
			default:
				t.Fatalf("unknown entry type %d", e[0])
			}
			off += 8
		}
		if off != length {
			t.Fatalf("entries end at %d, table length %d", off, length)
		}
		if procs != n || bsps != 1 || buses != 1 || ioapics != 1 || ioints != 24 || len(pins) != 24 || locints != 2 {
			t.Fatalf("%d CPUs: %d procs %d BSPs %d buses %d IOAPICs %d I/O ints %d local ints", n, procs, bsps, buses, ioapics, ioints, locints)
		}
	}
	mem := newMem(t, 2*mib)
	for _, n := range []int{0, -1, MaxCPUs + 1, 255} {
		if err := WriteMPTable(mem, n); !errors.Is(err, ErrTooManyCPUs) {
			t.Errorf("%d CPUs: %v, want ErrTooManyCPUs", n, err)
		}
	}
	small := newMem(t, 0x9f000)
	if err := WriteMPTable(small, 1); err == nil {
		t.Error("MP table written to memory without an EBDA")
	}
}
