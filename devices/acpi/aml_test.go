package acpi

import (
	"bytes"
	"testing"
)

func TestPkgLength(t *testing.T) {
	for _, tc := range []struct {
		body int
		head []byte
	}{
		{0, []byte{1}},
		{62, []byte{63}},
		{63, []byte{0x40 | 1, 4}},  // 65 = 0x41
		{4093, []byte{0x4f, 0xff}}, // 4095
		{4094, []byte{0x81, 0x00, 0x01}},
		{1<<20 - 4, []byte{0x8f, 0xff, 0xff}},
		{1<<20 - 3, []byte{0xc1, 0x00, 0x00, 0x01}},
	} {
		got := pkgLength(make([]byte, tc.body))
		if !bytes.Equal(got[:len(tc.head)], tc.head) || len(got) != tc.body+len(tc.head) {
			t.Errorf("pkgLength(%d bytes) head % x, want % x", tc.body, got[:len(tc.head)], tc.head)
		}
	}
}

func TestIntegerAndEISAID(t *testing.T) {
	for _, tc := range []struct {
		got, want []byte
	}{
		{Integer(0), []byte{0}},
		{Integer(1), []byte{1}},
		{Integer(5), []byte{0x0a, 5}},
		{Integer(0x3f8), []byte{0x0b, 0xf8, 0x03}},
		{Integer(0xd000_0000), []byte{0x0c, 0, 0, 0, 0xd0}},
		{Integer(1 << 32), []byte{0x0e, 0, 0, 0, 0, 1, 0, 0, 0}},
		{EISAID("PNP0501"), []byte{0x0c, 0x41, 0xd0, 0x05, 0x01}},
		{EISAID("PNP0A03"), []byte{0x0c, 0x41, 0xd0, 0x0a, 0x03}},
		{String("AB"), []byte{0x0d, 'A', 'B', 0}},
		{Name("_UID", Integer(0)), []byte{0x08, '_', 'U', 'I', 'D', 0}},
		{Name("\\_S5", Integer(0)), []byte{0x08, '\\', '_', 'S', '5', '_', 0}},
		{Package(Integer(5), Integer(0)), []byte{0x12, 5, 2, 0x0a, 5, 0}},
		{Device("VR00"), []byte{0x5b, 0x82, 5, 'V', 'R', '0', '0'}},
		{Scope("\\_SB"), []byte{0x10, 6, '\\', '_', 'S', 'B', '_'}},
		{ResourceTemplate(), []byte{0x11, 5, 0x0a, 2, 0x79, 0}},
		{IO(0x3f8, 8), []byte{0x47, 1, 0xf8, 3, 0xf8, 3, 1, 8}},
		{Memory32Fixed(true, 0xd0000000, 0x1000), []byte{0x86, 9, 0, 1, 0, 0, 0, 0xd0, 0, 0x10, 0, 0}},
		{Interrupt(true, false, false, 5), []byte{0x89, 6, 0, 3, 1, 5, 0, 0, 0}},
	} {
		if !bytes.Equal(tc.got, tc.want) {
			t.Errorf("got % x, want % x", tc.got, tc.want)
		}
	}
}

func TestBadNamesPanic(t *testing.T) {
	for _, n := range []string{"", "TOOLONG", "1ABC", "ab", "A-B"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("nameSeg(%q) did not panic", n)
				}
			}()
			nameSeg(n)
		}()
	}
}
