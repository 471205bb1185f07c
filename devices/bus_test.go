package devices

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// access is one call a recorder device saw.
type access struct {
	Write  bool
	Offset uint64
	Data   []byte
}

// recorder is a Device that records every access and answers reads with a
// fixed byte.
type recorder struct {
	fill byte
	seen []access
}

func (r *recorder) Read(offset uint64, data []byte) {
	for i := range data {
		data[i] = r.fill
	}
	r.seen = append(r.seen, access{Offset: offset, Data: append([]byte(nil), data...)})
}

func (r *recorder) Write(offset uint64, data []byte) {
	r.seen = append(r.seen, access{Write: true, Offset: offset, Data: append([]byte(nil), data...)})
}

func TestBusRegister(t *testing.T) {
	type reg struct {
		base, size uint64
		name       string
	}
	tests := []struct {
		name    string
		regs    []reg
		wantErr string // substring of the last registration's error; "" = all succeed
	}{
		{"disjoint", []reg{{0x3f8, 8, "a"}, {0x60, 1, "b"}, {0x64, 1, "c"}}, ""},
		{"adjacent below", []reg{{0x10, 0x10, "a"}, {0x0, 0x10, "b"}}, ""},
		{"adjacent above", []reg{{0x10, 0x10, "a"}, {0x20, 0x10, "b"}}, ""},
		{"same range", []reg{{0x10, 0x10, "a"}, {0x10, 0x10, "b"}}, "b at 0x10 overlaps a"},
		{"overlaps end of lower", []reg{{0x10, 0x10, "a"}, {0x1f, 2, "b"}}, "b at 0x1f overlaps a"},
		{"overlaps start of upper", []reg{{0x10, 0x10, "a"}, {0x8, 9, "b"}}, "b at 0x8 overlaps a"},
		{"contains another", []reg{{0x10, 0x4, "a"}, {0x0, 0x100, "b"}}, "b at 0x0 overlaps a"},
		{"inside another", []reg{{0x0, 0x100, "a"}, {0x10, 0x4, "b"}}, "b at 0x10 overlaps a"},
		{"between two, touching neither", []reg{{0x0, 0x10, "a"}, {0x20, 0x10, "b"}, {0x10, 0x10, "c"}}, ""},
		{"between two, hitting the upper", []reg{{0x0, 0x10, "a"}, {0x20, 0x10, "b"}, {0x10, 0x11, "c"}}, "c at 0x10 overlaps b"},
		{"zero size", []reg{{0x10, 0, "a"}}, "bad range"},
		{"wraps around", []reg{{^uint64(0) - 1, 4, "a"}}, "bad range"},
		{"ends at the top", []reg{{^uint64(0) - 3, 3, "a"}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBus("pio")
			var err error
			for i, r := range tc.regs {
				err = b.Register(r.base, r.size, r.name, &recorder{})
				if err != nil && i != len(tc.regs)-1 {
					t.Fatalf("registration %d (%s): %v", i, r.name, err)
				}
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Register: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Register error = %v, want one containing %q", err, tc.wantErr)
			case tc.wantErr != "" && !strings.HasPrefix(err.Error(), "pio bus: "):
				t.Errorf("error %q does not name the bus", err)
			}
		})
	}
}

func TestBusDispatch(t *testing.T) {
	b := NewBus("mmio")
	lo, hi := &recorder{fill: 0x11}, &recorder{fill: 0x22}
	if err := b.Register(0x1000, 0x100, "hi", hi); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(0x10, 8, "lo", lo); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name        string
		write       bool
		addr        uint64
		data        []byte
		wantClaimed bool
		wantRead    []byte // what a read leaves in data
	}{
		{"read first byte of lo", false, 0x10, make([]byte, 1), true, []byte{0x11}},
		{"write last byte of lo", true, 0x17, []byte{0xaa}, true, nil},
		{"read 4 bytes in hi", false, 0x1004, make([]byte, 4), true, []byte{0x22, 0x22, 0x22, 0x22}},
		{"write 8 bytes ending at hi's end", true, 0x10f8, []byte{1, 2, 3, 4, 5, 6, 7, 8}, true, nil},
		{"read below everything", false, 0x0, make([]byte, 2), false, []byte{0xff, 0xff}},
		{"read in the gap", false, 0x18, make([]byte, 4), false, []byte{0xff, 0xff, 0xff, 0xff}},
		{"read straddling lo's end", false, 0x16, make([]byte, 4), false, []byte{0xff, 0xff, 0xff, 0xff}},
		{"write past everything", true, 0x2000, []byte{9}, false, nil},
		{"write straddling hi's end", true, 0x10ff, []byte{1, 2}, false, nil},
	}
	var wantUnclaimed uint64
	for _, tc := range tests {
		var claimed bool
		if tc.write {
			claimed = b.Write(tc.addr, tc.data)
		} else {
			claimed = b.Read(tc.addr, tc.data)
			if !bytes.Equal(tc.data, tc.wantRead) {
				t.Errorf("%s: read %x, want %x", tc.name, tc.data, tc.wantRead)
			}
		}
		if claimed != tc.wantClaimed {
			t.Errorf("%s: claimed = %v, want %v", tc.name, claimed, tc.wantClaimed)
		}
		if !tc.wantClaimed {
			wantUnclaimed++
		}
	}
	if got := b.Unclaimed(); got != wantUnclaimed {
		t.Errorf("Unclaimed() = %d, want %d", got, wantUnclaimed)
	}
	// Devices see offsets relative to their base, never absolute addresses.
	wantLo := []access{{Offset: 0, Data: []byte{0x11}}, {Write: true, Offset: 7, Data: []byte{0xaa}}}
	wantHi := []access{{Offset: 4, Data: []byte{0x22, 0x22, 0x22, 0x22}}, {Write: true, Offset: 0xf8, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}}
	if diff := cmp.Diff(wantLo, lo.seen); diff != "" {
		t.Errorf("lo device accesses (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantHi, hi.seen); diff != "" {
		t.Errorf("hi device accesses (-want +got):\n%s", diff)
	}
}

// TestBusManyDevices registers devices in a shuffled order and checks that
// each address reaches its own device (the sorted insert keeps the search
// valid).
func TestBusManyDevices(t *testing.T) {
	b := NewBus("pio")
	devs := map[uint64]*recorder{}
	for _, base := range []uint64{0x70, 0x3f8, 0x20, 0x600, 0x60, 0xf4, 0x40, 0x2f8, 0x64} {
		r := &recorder{fill: byte(base)}
		devs[base] = r
		if err := b.Register(base, 2, "d", r); err != nil {
			t.Fatal(err)
		}
	}
	for base, r := range devs {
		got := make([]byte, 1)
		if !b.Read(base+1, got) || got[0] != byte(base) {
			t.Errorf("read at %#x = %x (claimed?), want %x from its device", base+1, got, byte(base))
		}
		if len(r.seen) != 1 || r.seen[0].Offset != 1 {
			t.Errorf("device at %#x saw %+v, want one read at offset 1", base, r.seen)
		}
	}
	if b.Unclaimed() != 0 {
		t.Errorf("Unclaimed() = %d, want 0", b.Unclaimed())
	}
}
