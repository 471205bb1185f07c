package blk

import (
	"testing"
)

// FuzzParseRequest feeds parseRequest and parseSegment arbitrary headers,
// chain lengths, disk sizes and features, and checks the invariants the
// workers rely on: no panic; an accepted read or write lies on the disk, in
// whole sectors, and is never a write to a read-only disk; an accepted
// segment request has 1..maxSegments whole segments.
func FuzzParseRequest(f *testing.F) {
	hdr := func(typ uint32, sector uint64) []byte {
		b := make([]byte, headerSize)
		b[0], b[1], b[2], b[3] = byte(typ), byte(typ>>8), byte(typ>>16), byte(typ>>24)
		for i := range 8 {
			b[8+i] = byte(sector >> (8 * i))
		}
		return b
	}
	all := uint64(FeatureFlush | FeatureDiscard | FeatureWriteZeroes)
	f.Add(hdr(typeIn, 0), uint64(16), uint64(513), uint64(2048), false, all, make([]byte, 16))
	f.Add(hdr(typeOut, 2047), uint64(16+512), uint64(1), uint64(2048), false, all, make([]byte, 16))
	f.Add(hdr(typeOut, 0), uint64(16+512), uint64(1), uint64(2048), true, all, make([]byte, 16))
	f.Add(hdr(typeIn, ^uint64(0)), uint64(16), uint64(1025), uint64(2048), false, all, make([]byte, 16))
	f.Add(hdr(typeFlush, 0), uint64(16), uint64(1), uint64(8), false, all, make([]byte, 16))
	f.Add(hdr(typeGetID, 0), uint64(16), uint64(21), uint64(8), false, all, make([]byte, 16))
	f.Add(hdr(typeDiscard, 0), uint64(32), uint64(1), uint64(8), false, all, []byte{0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0})
	f.Add(hdr(typeWriteZeroes, 0), uint64(32), uint64(1), uint64(8), false, all, []byte{1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0})
	f.Add(hdr(typeWriteZeroes, 0), uint64(32), uint64(1), uint64(8), false, uint64(0), []byte{})
	f.Add(hdr(99, 0), uint64(8), uint64(0), uint64(8), false, all, []byte{})
	f.Fuzz(func(t *testing.T, h []byte, rlen, wlen, sectors uint64, ro bool, features uint64, seg []byte) {
		var hb [headerSize]byte
		copy(hb[:], h)
		d := disk{sectors: sectors, readOnly: ro, features: features}
		r, err := parseRequest(hb, rlen, wlen, d)
		if err != nil {
			if rlen >= headerSize && wlen >= 1 && r.typ != typeIn && r.typ != typeGetID && r.typ != typeOut &&
				r.typ != typeDiscard && r.typ != typeWriteZeroes {
				t.Fatalf("type %d refused as malformed", r.typ)
			}
			return
		}
		if rlen < headerSize || wlen < 1 {
			t.Fatalf("accepted a chain of %d readable and %d writable bytes", rlen, wlen)
		}
		if r.status != statusOK {
			if r.reason == "" {
				t.Fatal("refused without a reason")
			}
			return
		}
		switch r.typ {
		case typeIn, typeOut:
			if r.typ == typeOut && ro {
				t.Fatal("accepted a write to a read-only disk")
			}
			if r.dataLen%SectorSize != 0 || r.sector > sectors || r.dataLen/SectorSize > sectors-r.sector {
				t.Fatalf("accepted %d bytes at sector %d of a %d-sector disk", r.dataLen, r.sector, sectors)
			}
			if r.sector*SectorSize+r.dataLen < r.sector*SectorSize && sectors < 1<<55 {
				t.Fatal("byte offset overflows")
			}
		case typeDiscard, typeWriteZeroes:
			if ro || r.dataLen == 0 || r.dataLen%segmentSize != 0 || r.dataLen/segmentSize > maxSegments {
				t.Fatalf("accepted %d bytes of segments (read-only %v)", r.dataLen, ro)
			}
			var sb [segmentSize]byte
			copy(sb[:], seg)
			s, st, why := parseSegment(sb, r.typ, sectors)
			if st == statusOK && (s.sector > sectors || s.sectors > sectors-s.sector || s.sectors > maxSegSectors) {
				t.Fatalf("accepted segment %+v on a %d-sector disk", s, sectors)
			}
			if st != statusOK && why == "" {
				t.Fatal("segment refused without a reason")
			}
		case typeFlush, typeGetID:
		default:
			t.Fatalf("accepted type %d", r.typ)
		}
	})
}
