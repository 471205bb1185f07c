package acpi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
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
	// VMGenID, when set, adds the VM generation ID device and the Generic
	// Event Device whose interrupt tells the guest to read it again.
	VMGenID *VMGenID
}

// VMGenID places a VM generation ID (Microsoft's "Virtual Machine
// Generation ID"; Linux's vmgenid driver): the 16-byte ID at Addr in guest
// memory, which must be 8-byte aligned, outside the tables and in memory
// the guest uses for nothing else, and the GSI of the Generic Event Device
// (ACPI0013, 5.6.9; its _EVT method) that notifies the device with 0x80
// (a device-specific notification, 5.6.6) when a new ID is there.
type VMGenID struct {
	Addr uint64
	GSI  uint32
}

// VMGenIDSize is the size of the generation ID.
const VMGenIDSize = 16

// Names and IDs of the VM generation ID's objects in the DSDT. Linux 6.1
// binds _HID VMGENCTR (or VM_GEN_COUNTER); Microsoft's specification asks
// for the compatible ID VM_Gen_Counter, which guests that follow it match
// (ACPICA upper-cases _HID and _CID strings, so Linux's VM_GEN_COUNTER
// matches it too).
const (
	VMGenIDPath   = "\\_SB.VGEN"
	vmgenidHID    = "VMGENCTR"
	vmgenidCID    = "VM_Gen_Counter"
	gedHID        = "ACPI0013"
	notifyGeneric = 0x80 // the device-specific notification the driver waits for
)

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
	if err := m.checkVMGenID(); err != nil {
		return nil, err
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
	if g := m.VMGenID; g != nil && g.Addr < base+uint64(len(blob)) && g.Addr+VMGenIDSize > base {
		return nil, fmt.Errorf("acpi: the VM generation ID at %#x is inside the tables (%#x-%#x)", g.Addr, base, base+uint64(len(blob)))
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
	if g := m.VMGenID; g != nil {
		devs = append(devs, vmgenidDevices(*g)...)
	}
	body := concat([][]byte{
		Name("\\_S5", Package(Integer(SleepTypeS5), Integer(0), Integer(0), Integer(0))),
		Scope("\\_SB", devs...),
	})
	return finish(append(pack(newHeader("DSDT", 2)), body...))
}

// checkVMGenID refuses a VM generation ID the guest could not use: at 0,
// not 8-byte aligned (the specification's requirement), so high that its
// 16 bytes would wrap, or on a GSI another device of the tables has.
func (m *Machine) checkVMGenID() error {
	g := m.VMGenID
	if g == nil {
		return nil
	}
	switch {
	case g.Addr == 0 || g.Addr%8 != 0 || g.Addr > math.MaxUint64-VMGenIDSize:
		return fmt.Errorf("acpi: VM generation ID at %#x: want a non-zero, 8-byte aligned address", g.Addr)
	case m.Serial.Port != 0 && g.GSI == m.Serial.IRQ:
		return fmt.Errorf("acpi: VM generation ID's GSI %d is COM1's", g.GSI)
	}
	for i, d := range m.Virtio {
		if d.GSI == g.GSI {
			return fmt.Errorf("acpi: VM generation ID's GSI %d is virtio-mmio slot %d's", g.GSI, i)
		}
	}
	return nil
}

// vmgenidDevices returns the VM generation ID device and the Generic Event
// Device that notifies it:
//
//	Device (VGEN) {
//	    Name (_HID, "VMGENCTR")
//	    Name (_CID, "VM_Gen_Counter")
//	    Name (_DDN, "VM_Gen_Counter")
//	    Name (ADDR, Package () { low 32 bits, high 32 bits })
//	}
//	Device (GED_) {
//	    Name (_HID, "ACPI0013")
//	    Name (_UID, 0)
//	    Name (_CRS, ResourceTemplate () { Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive) { GSI } })
//	    Method (_EVT, 1) { If (Arg0 == GSI) { Notify (\_SB.VGEN, 0x80) } }
//	}
//
// ADDR is a data object: evaluating it (Linux's acpi_evaluate_object, as
// for QEMU's method of the name) gives the package. Linux's GED driver
// requests each _CRS interrupt and runs _EVT with the GSI as Arg0 from
// the interrupt's thread; the vmgenid driver, on any notification, copies
// the ID again and, when it changed, reseeds the kernel's RNG with it.
func vmgenidDevices(g VMGenID) [][]byte {
	return [][]byte{
		Device("VGEN",
			Name("_HID", String(vmgenidHID)),
			Name("_CID", String(vmgenidCID)),
			Name("_DDN", String(vmgenidCID)),
			Name("ADDR", Package(Integer(g.Addr&0xffff_ffff), Integer(g.Addr>>32))),
		),
		Device("GED",
			Name("_HID", String(gedHID)),
			Name("_UID", Integer(0)),
			Name("_CRS", ResourceTemplate(Interrupt(true, false, false, g.GSI))),
			Method("_EVT", 1,
				If(LEqual(Arg(0), Integer(uint64(g.GSI))),
					Notify(VMGenIDPath, notifyGeneric),
				),
			),
		),
	}
}
