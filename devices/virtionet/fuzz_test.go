package virtionet

import (
	"bytes"
	"testing"
)

// FuzzNetHeader: any 12 bytes decode, encode back to themselves, and
// CheckTX never panics; a header it accepts keeps every offset it names
// inside the frame and uses only negotiated offloads.
func FuzzNetHeader(f *testing.F) {
	f.Add(make([]byte, HeaderSize), uint64(Offered), 60)
	f.Add(hdrBytes(Header{Flags: FlagNeedsCsum, GSOType: GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}), uint64(Offered), MaxFrame)
	f.Add(hdrBytes(Header{Flags: FlagNeedsCsum, GSOType: GSOUDP, GSOSize: 1472, CsumStart: 34, CsumOffset: 6}), uint64(FeatureCsum), 3000)
	f.Add(hdrBytes(Header{Flags: 0xff, GSOType: 0xff, HdrLen: 0xffff, GSOSize: 0xffff, CsumStart: 0xffff, CsumOffset: 0xffff}), uint64(Offered), 14)
	f.Fuzz(func(t *testing.T, b []byte, features uint64, frameLen int) {
		if len(b) < HeaderSize {
			return
		}
		var h Header
		h.Decode(b)
		out := make([]byte, HeaderSize)
		h.Encode(out)
		if !bytes.Equal(out, b[:HeaderSize]) {
			t.Fatalf("decode/encode % x -> %+v -> % x", b[:HeaderSize], h, out)
		}
		if err := h.CheckTX(features, frameLen); err != nil {
			return
		}
		switch {
		case frameLen < MinFrame || frameLen > MaxFrame:
			t.Fatalf("accepted a %d-byte frame", frameLen)
		case h.Flags&FlagNeedsCsum != 0 && (features&FeatureCsum == 0 || int(h.CsumStart)+int(h.CsumOffset)+2 > frameLen):
			t.Fatalf("accepted checksum request %+v for %d bytes, features %#x", h, frameLen, features)
		case h.GSOType != GSONone && (h.GSOSize == 0 || h.Flags&FlagNeedsCsum == 0):
			t.Fatalf("accepted GSO header %+v", h)
		case int(h.HdrLen) > frameLen:
			t.Fatalf("accepted hdr_len %d for %d bytes", h.HdrLen, frameLen)
		}
	})
}

// FuzzTXChain sends arbitrary header and frame bytes through the device's
// TX path: it never fails the device and never panics; each chain comes
// back, counted as a frame sent or a TX error.
func FuzzTXChain(f *testing.F) {
	f.Add(hdrBytes(Header{}), frame(60, 0), uint64(Offered))
	f.Add(hdrBytes(Header{Flags: FlagNeedsCsum, GSOType: GSOTCPv6, HdrLen: 74, GSOSize: 1428, CsumStart: 54, CsumOffset: 16}), frame(4000, 1), uint64(Offered))
	f.Add([]byte{1, 2, 3}, []byte{}, uint64(0))
	f.Fuzz(func(t *testing.T, hdr, fr []byte, features uint64) {
		if len(hdr)+len(fr) == 0 || len(fr) > MaxFrame+16 {
			return
		}
		e := newEnv(t, envOpts{features: features & Offered})
		e.sendTX(hdr, fr)
		e.reap(e.tx, 1)
		s := e.dev.Stats()
		if s.TxFrames+s.TxErrors+s.TxDropped != 1 {
			t.Fatalf("stats %+v: the chain was not accounted for once", s)
		}
		if s.TxFrames == 1 {
			// The header is the chain's first 12 bytes, whichever
			// descriptors they are in.
			got := e.hostRead()
			if !bytes.Equal(got[HeaderSize:], append(append([]byte(nil), hdr...), fr...)[HeaderSize:]) {
				t.Fatal("frame changed on its way")
			}
		}
		if f := e.failures(); len(f) != 0 {
			t.Fatalf("device failed: %v", f)
		}
	})
}
