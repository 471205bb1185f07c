package acpi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Where the machine puts the tables: the BIOS read-only area, which the
// e820 map reserves and Linux scans for the RSDP (acpi_find_root_pointer
// looks at 0xe0000-0xfffff on 16-byte boundaries).
const (
	TablesAddr = 0xe_0000
	TablesEnd  = 0x10_0000
)

// Machine describes what the tables announce.
type Machine struct {
	// CPUs is the number of vCPUs: APIC IDs and processor UIDs 0..CPUs-1.
	CPUs int
	// LAPICAddr and IOAPICAddr are the interrupt controllers' MMIO bases.
	LAPICAddr, IOAPICAddr uint32
	// IOAPICID is the I/O APIC's ID (the MP table uses CPUs).
	IOAPICID uint8
	// PCAT says dual 8259 PICs exist (KVM's in-kernel irqchip); the MADT's
	// PCAT_COMPAT flag.
	PCAT bool
	// Serial is COM1 (port base, IRQ); Port 0 leaves it out.
	Serial struct {
		Port uint16
		IRQ  uint32
	}
	// Virtio are the virtio-mmio devices, in slot order.
	Virtio []MMIODevice
	// SleepControlPort, SleepStatusPort and ResetPort are the byte-wide
	// I/O registers of the FADT; ResetValue is what the guest writes to
	// ResetPort to restart.
	SleepControlPort, SleepStatusPort, ResetPort uint16
	ResetValue                                   uint8
}

// MMIODevice is a virtio-mmio window and its GSI.
type MMIODevice struct {
	Base, Size uint32
	GSI        uint32
}

// SleepTypeS5 is the SLP_TYP value the DSDT's \_S5 package gives: a guest
// powers off by writing SleepEnable | SleepTypeS5<<SleepTypeShift to the
// sleep control register (4.8.3.7).
const (
	SleepTypeS5    = 5
	SleepTypeShift = 2
	SleepTypeMask  = 0x7 << SleepTypeShift
	SleepEnable    = 1 << 5
)

// Tables is the result of Build.
type Tables struct {
	// Bytes is the blob to copy to Base.
	Bytes []byte
	// Base is the guest-physical address the blob was laid out for.
	Base uint64
	// RSDP is the RSDP's address (Base: the RSDP comes first).
	RSDP uint64
	// Offsets of each table inside Bytes, by signature ("RSDP", "XSDT",
	// "FACP", "APIC", "DSDT").
	Offsets map[string]int
}

// Build lays out the tables for m at base (16-byte aligned, below 4 GiB)
// and returns them with every length and checksum filled in.
func Build(base uint64, m Machine) (*Tables, error) {
	switch {
	case base%16 != 0 || base >= 1<<32:
		return nil, fmt.Errorf("acpi: table base %#x: want 16-byte aligned below 4 GiB", base)
	case m.CPUs < 1 || m.CPUs > 255:
		return nil, fmt.Errorf("acpi: %d vCPUs: the MADT's xAPIC entries describe 1..255", m.CPUs)
	case m.SleepControlPort == 0 || m.SleepStatusPort == 0 || m.ResetPort == 0:
		return nil, errors.New("acpi: the sleep control, sleep status and reset ports are required")
	}
	dsdt := buildDSDT(m)
	madt := buildMADT(m)

	// Order: RSDP, XSDT, FADT, MADT, DSDT, each 16-byte aligned.
	t := &Tables{Base: base, RSDP: base, Offsets: map[string]int{}}
	var blob []byte
	place := func(sig string, size int) int {
		off := (len(blob) + 15) &^ 15
		t.Offsets[sig] = off
		blob = append(blob, make([]byte, off+size-len(blob))...)
		return off
	}
	xsdtSize := HeaderSize + 2*8
	rsdpOff := place("RSDP", RSDPSize)
	xsdtOff := place("XSDT", xsdtSize)
	fadtOff := place("FACP", FADTSize)
	madtOff := place("APIC", len(madt))
	dsdtOff := place("DSDT", len(dsdt))
	if base+uint64(len(blob)) > 1<<32 {
		return nil, fmt.Errorf("acpi: tables at %#x (%d bytes) cross 4 GiB", base, len(blob))
	}
	addr := func(off int) uint64 { return base + uint64(off) }

	copy(blob[dsdtOff:], dsdt)
	copy(blob[madtOff:], madt)
	copy(blob[fadtOff:], buildFADT(m, addr(dsdtOff)))

	xsdt := pack(newHeader("XSDT", 1))
	xsdt = binary.LittleEndian.AppendUint64(xsdt, addr(fadtOff))
	xsdt = binary.LittleEndian.AppendUint64(xsdt, addr(madtOff))
	copy(blob[xsdtOff:], finish(xsdt))

	r := RSDP{Revision: 2, Length: RSDPSize, XSDTAddress: addr(xsdtOff)}
	copy(r.Signature[:], "RSD PTR ")
	copy(r.OEMID[:], OEMID)
	rb := pack(r)
	rb[rsdpChecksumOff] = Checksum(rb[:rsdpV1Size])
	rb[rsdpExtChecksumOff] = Checksum(rb)
	copy(blob[rsdpOff:], rb)

	t.Bytes = blob
	return t, nil
}

// buildFADT returns the hardware-reduced FADT pointing at the DSDT.
func buildFADT(m Machine, dsdt uint64) []byte {
	f := FADT{
		Header:       newHeader("FACP", fadtRevision),
		IAPCBootArch: BootArchLegacy | BootArch8042 | BootArchNoVGA | BootArchNoMSI,
		Flags:        FlagWBINVD | FlagPwrButton | FlagSlpButton | FlagResetRegSup | FlagHWReducedACPI,
		ResetReg:     ioPort8(m.ResetPort),
		ResetValue:   m.ResetValue,
		MinorVersion: fadtMinorVersion,
		XDSDT:        dsdt,

		SleepControlReg: ioPort8(m.SleepControlPort),
		SleepStatusReg:  ioPort8(m.SleepStatusPort),
	}
	f.HypervisorVendor = binary.LittleEndian.Uint64([]byte("MICROVM\x00"))
	return finish(pack(f))
}

// buildMADT returns the MADT: local APICs, the I/O APIC, ISA overrides and
// the LINT1 NMI.
func buildMADT(m Machine) []byte {
	var flags uint32
	if m.PCAT {
		flags |= MADTPCATCompat
	}
	parts := []any{MADT{Header: newHeader("APIC", madtRevision), LocalAPICAddress: m.LAPICAddr, Flags: flags}}
	for i := 0; i < m.CPUs; i++ {
		parts = append(parts, MADTLocalAPIC{Type: madtTypeLocalAPIC, Length: MADTLocalAPICSize,
			ProcessorUID: uint8(i), APICID: uint8(i), Flags: localAPICEnabled})
	}
	parts = append(parts, MADTIOAPIC{Type: madtTypeIOAPIC, Length: MADTIOAPICSize,
		IOAPICID: m.IOAPICID, Address: m.IOAPICAddr, GSIBase: 0})
	// ISA IRQ n is GSI n, as in the MP table. The overrides restate the
	// default because a hardware-reduced Linux has no legacy PIC and maps
	// ISA IRQs (COM1's IRQ 4 for the 8250 driver) only from overrides.
	for irq := 0; irq < madtLegacyIRQCount; irq++ {
		parts = append(parts, MADTIntSrcOvr{Type: madtTypeIntSrcOvr, Length: MADTIntSrcOvrSize,
			Bus: madtISABus, Source: uint8(irq), GSI: uint32(irq), Flags: mpsINTIConforming})
	}
	parts = append(parts, MADTLocalNMI{Type: madtTypeLocalNMI, Length: MADTLocalNMISize,
		ProcessorUID: localAPICAllUIDs, Flags: mpsINTIConforming, LINT: 1})
	return finish(pack(parts...))
}

// buildDSDT returns the DSDT: \_S5 and the devices under \_SB.
func buildDSDT(m Machine) []byte {
	var devs [][]byte
	if m.Serial.Port != 0 {
		devs = append(devs, Device("COM1",
			Name("_HID", EISAID("PNP0501")),
			Name("_UID", Integer(1)),
			Name("_CRS", ResourceTemplate(
				IO(m.Serial.Port, 8),
				Interrupt(true, false, false, m.Serial.IRQ),
			)),
		))
	}
	for i, d := range m.Virtio {
		devs = append(devs, Device(fmt.Sprintf("VR%02X", i),
			Name("_HID", String("LNRO0005")),
			Name("_UID", Integer(uint64(i))),
			Name("_CRS", ResourceTemplate(
				Memory32Fixed(true, d.Base, d.Size),
				Interrupt(true, false, false, d.GSI),
			)),
		))
	}
	body := concat([][]byte{
		Name("\\_S5", Package(Integer(SleepTypeS5), Integer(0), Integer(0), Integer(0))),
		Scope("\\_SB", devs...),
	})
	return finish(append(pack(newHeader("DSDT", 2)), body...))
}
