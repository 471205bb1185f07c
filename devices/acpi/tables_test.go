package acpi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestStructSizes pins every layout struct to the length the specification
// gives it.
func TestStructSizes(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want int
	}{
		{"Header", Header{}, HeaderSize},
		{"RSDP", RSDP{}, RSDPSize},
		{"GAS", GAS{}, GASSize},
		{"FADT", FADT{}, FADTSize},
		{"MADT", MADT{}, MADTSize},
		{"MADTLocalAPIC", MADTLocalAPIC{}, MADTLocalAPICSize},
		{"MADTIOAPIC", MADTIOAPIC{}, MADTIOAPICSize},
		{"MADTIntSrcOvr", MADTIntSrcOvr{}, MADTIntSrcOvrSize},
		{"MADTLocalNMI", MADTLocalNMI{}, MADTLocalNMISize},
	} {
		if got := binary.Size(tc.v); got != tc.want {
			t.Errorf("binary.Size(%s) = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestFADTOffsets spot-checks field offsets against table 5.9.
func TestFADTOffsets(t *testing.T) {
	f := FADT{Flags: 0x11223344, XDSDT: 0x5566778899aabbcc}
	f.IAPCBootArch = 0xabcd
	f.SleepControlReg.Address = 0x1234
	f.SleepStatusReg.Address = 0x5678
	f.ResetReg.Address = 0x9abc
	f.ResetValue = 0x77
	f.MinorVersion = 9
	b := pack(f)
	le := binary.LittleEndian
	for _, c := range []struct {
		name      string
		off       int
		got, want uint64
	}{
		{"IAPC_BOOT_ARCH", 109, uint64(le.Uint16(b[109:])), 0xabcd},
		{"Flags", 112, uint64(le.Uint32(b[112:])), 0x11223344},
		{"RESET_REG.Address", 116 + 4, le.Uint64(b[120:]), 0x9abc},
		{"RESET_VALUE", 128, uint64(b[128]), 0x77},
		{"FADT Minor Version", 131, uint64(b[131]), 9},
		{"X_DSDT", 140, le.Uint64(b[140:]), 0x5566778899aabbcc},
		{"SLEEP_CONTROL_REG.Address", 244 + 4, le.Uint64(b[248:]), 0x1234},
		{"SLEEP_STATUS_REG.Address", 256 + 4, le.Uint64(b[260:]), 0x5678},
	} {
		if c.got != c.want {
			t.Errorf("%s at %d = %#x, want %#x", c.name, c.off, c.got, c.want)
		}
	}
}

func testMachine(cpus int) Machine {
	m := Machine{
		CPUs: cpus, LAPICAddr: 0xfee0_0000, IOAPICAddr: 0xfec0_0000, IOAPICID: uint8(cpus),
		SleepControlPort: 0x610, SleepStatusPort: 0x611, ResetPort: 0x612, ResetValue: 1,
	}
	m.Serial.Port, m.Serial.IRQ = 0x3f8, 4
	for i := 0; i < 3; i++ {
		m.Virtio = append(m.Virtio, MMIODevice{Base: 0xd000_0000 + uint32(i)*0x1000, Size: 0x1000, GSI: uint32(5 + i)})
	}
	m.VMGenID = &VMGenID{Addr: 0xe_f000, GSI: 23}
	return m
}

func sum(b []byte) uint8 {
	var s uint8
	for _, c := range b {
		s += c
	}
	return s
}

// TestBuildChecksumsAndLinks checks each table's signature, length and
// checksum, and that the pointers lead from the RSDP to every table.
func TestBuildChecksumsAndLinks(t *testing.T) {
	for _, cpus := range []int{1, 2, 32, 255} {
		tb, err := Build(TablesAddr, testMachine(cpus))
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(tb.Bytes)) > TablesEnd-TablesAddr {
			t.Fatalf("%d vCPUs: %d bytes of tables do not fit below %#x", cpus, len(tb.Bytes), TablesEnd)
		}
		le := binary.LittleEndian
		at := func(gpa uint64) []byte {
			if gpa < tb.Base || gpa >= tb.Base+uint64(len(tb.Bytes)) {
				t.Fatalf("address %#x outside the tables", gpa)
			}
			return tb.Bytes[gpa-tb.Base:]
		}
		table := func(gpa uint64, sig string) []byte {
			b := at(gpa)
			if string(b[:4]) != sig {
				t.Fatalf("at %#x: signature %q, want %q", gpa, b[:4], sig)
			}
			n := le.Uint32(b[4:])
			if int(n) > len(b) || n < HeaderSize {
				t.Fatalf("%s: length %d", sig, n)
			}
			if s := sum(b[:n]); s != 0 {
				t.Errorf("%s: checksum off by %d", sig, s)
			}
			return b[:n]
		}
		r := at(tb.RSDP)[:RSDPSize]
		if tb.RSDP%16 != 0 || string(r[:8]) != "RSD PTR " || r[15] != 2 || le.Uint32(r[20:]) != RSDPSize {
			t.Fatalf("RSDP header wrong: % x", r)
		}
		if sum(r[:20]) != 0 || sum(r) != 0 {
			t.Errorf("RSDP checksums: first 20 bytes sum %d, all %d", sum(r[:20]), sum(r))
		}
		xsdt := table(le.Uint64(r[24:]), "XSDT")
		if len(xsdt) != HeaderSize+16 {
			t.Fatalf("XSDT length %d", len(xsdt))
		}
		fadt := table(le.Uint64(xsdt[36:]), "FACP")
		madt := table(le.Uint64(xsdt[44:]), "APIC")
		if len(fadt) != FADTSize || fadt[8] != 6 {
			t.Errorf("FADT length %d revision %d, want %d, 6", len(fadt), fadt[8], FADTSize)
		}
		if fl := le.Uint32(fadt[112:]); fl&FlagHWReducedACPI == 0 || fl&FlagResetRegSup == 0 {
			t.Errorf("FADT flags %#x lack HW_REDUCED_ACPI or RESET_REG_SUP", fl)
		}
		table(le.Uint64(fadt[140:]), "DSDT")
		wantMADT := MADTSize + cpus*MADTLocalAPICSize + MADTIOAPICSize + 16*MADTIntSrcOvrSize + MADTLocalNMISize
		if len(madt) != wantMADT {
			t.Errorf("%d vCPUs: MADT length %d, want %d", cpus, len(madt), wantMADT)
		}
		// Walk the MADT's entries: lengths must chain to the end exactly.
		n := map[uint8]int{}
		for e := madt[MADTSize:]; len(e) > 0; e = e[e[1]:] {
			if len(e) < 2 || e[1] < 2 || int(e[1]) > len(e) {
				t.Fatalf("MADT entry with bad length: % x", e[:min(len(e), 8)])
			}
			n[e[0]]++
		}
		if n[madtTypeLocalAPIC] != cpus || n[madtTypeIOAPIC] != 1 || n[madtTypeIntSrcOvr] != 16 || n[madtTypeLocalNMI] != 1 {
			t.Errorf("MADT entries by type: %v", n)
		}
	}
}

func TestBuildRejects(t *testing.T) {
	m := testMachine(1)
	for _, tc := range []struct {
		name string
		base uint64
		m    func(Machine) Machine
	}{
		{"unaligned base", TablesAddr + 8, func(m Machine) Machine { return m }},
		{"base above 4 GiB", 1 << 32, func(m Machine) Machine { return m }},
		{"no vCPUs", TablesAddr, func(m Machine) Machine { m.CPUs = 0; return m }},
		{"256 vCPUs", TablesAddr, func(m Machine) Machine { m.CPUs = 256; return m }},
		{"no sleep port", TablesAddr, func(m Machine) Machine { m.SleepControlPort = 0; return m }},
		{"VM generation ID at 0", TablesAddr, func(m Machine) Machine { m.VMGenID = &VMGenID{GSI: 23}; return m }},
		{"VM generation ID not 8-byte aligned", TablesAddr, func(m Machine) Machine { m.VMGenID = &VMGenID{Addr: 0xe_f004, GSI: 23}; return m }},
		{"VM generation ID wrapping", TablesAddr, func(m Machine) Machine { m.VMGenID = &VMGenID{Addr: 1<<64 - 8, GSI: 23}; return m }},
		{"VM generation ID in the tables", TablesAddr, func(m Machine) Machine { m.VMGenID = &VMGenID{Addr: TablesAddr + 0x40, GSI: 23}; return m }},
		{"VM generation ID just below the tables", TablesAddr + 0x1000, func(m Machine) Machine { m.VMGenID = &VMGenID{Addr: TablesAddr + 0x1000 - 8, GSI: 23}; return m }},
		{"GED on COM1's GSI", TablesAddr, func(m Machine) Machine { m.VMGenID = &VMGenID{Addr: 0xe_f000, GSI: 4}; return m }},
		{"GED on a virtio GSI", TablesAddr, func(m Machine) Machine { m.VMGenID = &VMGenID{Addr: 0xe_f000, GSI: 7}; return m }},
	} {
		if _, err := Build(tc.base, tc.m(m)); err == nil {
			t.Errorf("%s: Build accepted it", tc.name)
		}
	}
}

// TestBuildVMGenID checks the DSDT with and without a VM generation ID:
// with one, it holds the VGEN device and the GED exactly as
// vmgenidDevices encodes them (TestVMGenIDDevicesMatchIASL checks those
// bytes), ADDR split into the two 32-bit halves; without, neither; and an
// ID right after the tables is accepted.
func TestBuildVMGenID(t *testing.T) {
	dsdt := func(m Machine) []byte {
		t.Helper()
		tb, err := Build(TablesAddr, m)
		if err != nil {
			t.Fatal(err)
		}
		off := tb.Offsets["DSDT"]
		return tb.Bytes[off : off+int(binary.LittleEndian.Uint32(tb.Bytes[off+4:]))]
	}
	m := testMachine(2)
	m.VMGenID = &VMGenID{Addr: 0x1_2345_6780, GSI: 20}
	with := dsdt(m)
	for _, part := range vmgenidDevices(*m.VMGenID) {
		if !bytes.Contains(with, part) {
			t.Errorf("DSDT lacks % x", part)
		}
	}
	addr := Name("ADDR", Package(Integer(0x2345_6780), Integer(1)))
	if !bytes.Contains(with, addr) {
		t.Errorf("DSDT lacks ADDR as Package {0x23456780, 1}: % x", addr)
	}
	m.VMGenID = nil
	without := dsdt(m)
	for _, s := range []string{"VGEN", "ACPI0013", "VMGENCTR", "_EVT"} {
		if bytes.Contains(without, []byte(s)) {
			t.Errorf("DSDT without a VM generation ID holds %q", s)
		}
	}
	m.VMGenID = &VMGenID{Addr: 0xf_0000, GSI: 20}
	tb, err := Build(TablesAddr, m)
	if err != nil {
		t.Fatal(err)
	}
	m.VMGenID.Addr = (TablesAddr + uint64(len(tb.Bytes)) + 7) &^ 7
	if _, err := Build(TablesAddr, m); err != nil {
		t.Errorf("VM generation ID right after the tables: %v", err)
	}
}

// TestIASLDisassembles writes each table to a file and has iasl (Debian's
// acpica-tools) disassemble it: no errors, and the text says what the
// tables mean. The RSDP is not a table with a header, and iasl 20200925
// refuses to disassemble one alone; TestBuildChecksumsAndLinks checks it.
func TestIASLDisassembles(t *testing.T) {
	iasl, err := exec.LookPath("iasl")
	if err != nil {
		testenv.Missing(t, "no iasl: %v (apt-get install acpica-tools)", err)
		return
	}
	tb, err := Build(TablesAddr, testMachine(2))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	addr := func(sig string) string { return fmt.Sprintf("%016X", tb.Base+uint64(tb.Offsets[sig])) }
	want := map[string][]string{
		"XSDT": {"ACPI Table Address   0 : " + addr("FACP"), "ACPI Table Address   1 : " + addr("APIC")},
		"FACP": {"Hardware Reduced (V5) : 1", "Address : " + addr("DSDT"), "Reset Register Supported (V2) : 1", "Sleep Control Register",
			"Address : 0000000000000610", "Value to cause reset : 01"},
		"APIC": {"Local Apic Address : FEE00000", "Processor ID : 01", "Address : FEC00000", "Interrupt Source Override", "Local APIC NMI"},
		"DSDT": {`Name (\_S5, Package (0x04)`, `Device (COM1)`, `EisaId ("PNP0501")`,
			`IO (Decode16,`, `0x03F8,`, `Device (VR02)`, `Name (_HID, "LNRO0005")`,
			`Memory32Fixed (ReadWrite,`, `0xD0002000,`, `Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,, )`,
			`0x00000007,`,
			`Device (VGEN)`, `Name (_HID, "VMGENCTR")`, `Name (_CID, "VM_Gen_Counter")`, `Name (ADDR, Package (0x02) { 0x000EF000, Zero })`,
			`Device (GED)`, `Name (_HID, "ACPI0013" /* Generic Event Device */)`, `0x00000017,`, `Method (_EVT, 1, NotSerialized)`,
			`If ((Arg0 == 0x17))`, `Notify (\_SB.VGEN, 0x80)`},
	}
	for sig, off := range tb.Offsets {
		if sig == "RSDP" {
			continue
		}
		n := int(binary.LittleEndian.Uint32(tb.Bytes[off+4:]))
		in := filepath.Join(dir, strings.ToLower(sig)+".dat")
		if err := os.WriteFile(in, tb.Bytes[off:off+n], 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(iasl, "-d", in)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("iasl -d %s: %v\n%s", sig, err, out)
			continue
		}
		if s := string(out); strings.Contains(s, "Error") || strings.Contains(s, "Warning") {
			t.Errorf("iasl -d %s reports problems:\n%s", sig, s)
		}
		dsl, err := os.ReadFile(strings.TrimSuffix(in, ".dat") + ".dsl")
		if err != nil {
			t.Fatalf("iasl -d %s: %v\n%s", sig, err, out)
		}
		text := squeeze(string(dsl))
		for _, w := range want[sig] {
			if !strings.Contains(text, squeeze(w)) {
				t.Errorf("%s disassembly lacks %q:\n%s", sig, w, dsl)
			}
		}
		if strings.Contains(text, "Invalid") || strings.Contains(text, "**** ") {
			t.Errorf("%s disassembly flags something:\n%s", sig, dsl)
		}
	}
}

// squeeze collapses runs of blanks so column alignment does not matter.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }
