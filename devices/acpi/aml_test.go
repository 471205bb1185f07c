package acpi

import (
	"bytes"
	"encoding/hex"
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
		// Name paths (20.2.2): DualNamePrefix for two segments,
		// MultiNamePrefix and a count for more.
		{nameString("\\_SB.VGEN"), []byte{'\\', 0x2e, '_', 'S', 'B', '_', 'V', 'G', 'E', 'N'}},
		{nameString("A.B"), []byte{0x2e, 'A', '_', '_', '_', 'B', '_', '_', '_'}},
		{nameString("\\_SB.PCI0.S08"), []byte{'\\', 0x2f, 3, '_', 'S', 'B', '_', 'P', 'C', 'I', '0', 'S', '0', '8', '_'}},
		// Methods and the statements _EVT uses (20.2.5).
		{Method("_EVT", 1), []byte{0x14, 6, '_', 'E', 'V', 'T', 1}},
		{Method("M", 7), []byte{0x14, 6, 'M', '_', '_', '_', 7}},
		{Arg(0), []byte{0x68}},
		{Arg(6), []byte{0x6e}},
		{LEqual(Arg(0), Integer(0x17)), []byte{0x93, 0x68, 0x0a, 0x17}},
		{If(LEqual(Arg(1), Integer(1))), []byte{0xa0, 4, 0x93, 0x69, 1}},
		{Notify("\\_SB.VGEN", 0x80), []byte{0x86, '\\', 0x2e, '_', 'S', 'B', '_', 'V', 'G', 'E', 'N', 0x0a, 0x80}},
		{Notify("COM1", 2), []byte{0x86, 'C', 'O', 'M', '1', 0x0a, 2}},
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
	for _, n := range []string{"\\", "A.", ".A", "\\_SB..X", "\\_SB.TOOLONG"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("nameString(%q) did not panic", n)
				}
			}()
			nameString(n)
		}()
	}
	for _, f := range []struct {
		name string
		f    func()
	}{
		{"Method with 8 arguments", func() { Method("M", 8) }},
		{"Method with -1 arguments", func() { Method("M", -1) }},
		{"Arg7", func() { Arg(7) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", f.name)
				}
			}()
			f.f()
		}()
	}
}

// TestVMGenIDDevicesMatchIASL compares the VM generation ID's AML with what
// iasl 20200925 (acpica-tools) compiles from the ASL in vmgenidDevices'
// comment, with the ID at 0xef000 and the GSI 23, inside Scope (\_SB):
//
//	iasl -f -oa vmgenid.asl
//
// -f because iasl's compiler refuses "VMGENCTR" as a _HID (its last four
// characters are not hex digits; Linux matches it all the same), -oa so
// that it keeps \_SB.VGEN a full path as written. The bytes are the
// table's after its 36-byte header.
func TestVMGenIDDevicesMatchIASL(t *testing.T) {
	const iasl = "10410a5c5f53425f" + // Scope (\_SB), PkgLength 0xa4
		"5b824d045647454e" + // Device (VGEN), PkgLength 0x4d
		"085f4849440d564d47454e43545200" + // Name (_HID, "VMGENCTR")
		"085f4349440d564d5f47656e5f436f756e74657200" + // Name (_CID, "VM_Gen_Counter")
		"085f44444e0d564d5f47656e5f436f756e74657200" + // Name (_DDN, "VM_Gen_Counter")
		"0841444452120802" + "0c00f00e00" + "00" + // Name (ADDR, Package (2) { 0xef000, Zero })
		"5b8249044745445f" + // Device (GED_), PkgLength 0x49
		"085f4849440d414350493030313300" + // Name (_HID, "ACPI0013")
		"085f55494400" + // Name (_UID, Zero)
		"085f435253110e0a0b" + "890600030117000000" + "7900" + // Name (_CRS, ResourceTemplate () { Interrupt (...) { 23 } })
		"14195f45565401" + // Method (_EVT, 1, NotSerialized)
		"a012" + "93680a17" + // If (LEqual (Arg0, 0x17))
		"865c2e5f53425f5647454e0a80" // Notify (\_SB.VGEN, 0x80)
	want, err := hex.DecodeString(iasl)
	if err != nil {
		t.Fatal(err)
	}
	got := Scope("\\_SB", vmgenidDevices(VMGenID{Addr: 0xe_f000, GSI: 23})...)
	if !bytes.Equal(got, want) {
		t.Errorf("VM generation ID AML:\n got % x\nwant % x", got, want)
	}
}
