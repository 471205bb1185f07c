package acpi

import (
	"bytes"
	"encoding/binary"
)

// OEM identification written into every table.
const (
	OEMID        = "MICRVM"   // 6 bytes
	OEMTableID   = "MICROVM " // 8 bytes
	OEMRevision  = 1
	CreatorID    = "MVMG" // 4 bytes: the microvm Go table writer
	CreatorRevID = 1
)

// Header is the System Description Table Header (5.2.6), 36 bytes, that
// starts every table except the RSDP.
type Header struct {
	Signature       [4]byte
	Length          uint32 // of the whole table, header included
	Revision        uint8
	Checksum        uint8 // the whole table sums to zero
	OEMID           [6]byte
	OEMTableID      [8]byte
	OEMRevision     uint32
	CreatorID       [4]byte
	CreatorRevision uint32
}

// HeaderSize is the size of Header.
const HeaderSize = 36

func newHeader(sig string, rev uint8) Header {
	h := Header{Revision: rev, OEMRevision: OEMRevision, CreatorRevision: CreatorRevID}
	copy(h.Signature[:], sig)
	copy(h.OEMID[:], OEMID)
	copy(h.OEMTableID[:], OEMTableID)
	copy(h.CreatorID[:], CreatorID)
	return h
}

// RSDP is the Root System Description Pointer (5.2.5.3), revision 2: 36 bytes.
type RSDP struct {
	Signature        [8]byte // "RSD PTR "
	Checksum         uint8   // over the first 20 bytes (the ACPI 1.0 part)
	OEMID            [6]byte
	Revision         uint8  // 2: ACPI 2.0 and later
	RSDTAddress      uint32 // 0: no RSDT
	Length           uint32 // 36
	XSDTAddress      uint64
	ExtendedChecksum uint8 // over all 36 bytes
	Reserved         [3]byte
}

// RSDPSize is the size of RSDP; rsdpV1Size the part the first checksum covers.
const (
	RSDPSize   = 36
	rsdpV1Size = 20
)

// GAS is a Generic Address Structure (5.2.3.2), 12 bytes.
type GAS struct {
	SpaceID    uint8 // GASSystemIO, ...
	BitWidth   uint8
	BitOffset  uint8
	AccessSize uint8 // 1 = byte access
	Address    uint64
}

// GAS address space IDs and access sizes.
const (
	GASSystemMemory = 0
	GASSystemIO     = 1
	GASAccessByte   = 1
)

// ioPort8 is a byte-wide register at an I/O port.
func ioPort8(port uint16) GAS {
	return GAS{SpaceID: GASSystemIO, BitWidth: 8, AccessSize: GASAccessByte, Address: uint64(port)}
}

// FADT is the Fixed ACPI Description Table (5.2.9, table 5.9), revision 6:
// 276 bytes. On a hardware-reduced platform every PM1/PM2/PM timer/GPE block
// is zero; what matters is Flags, IAPC_BOOT_ARCH, the reset register, X_DSDT
// and the sleep control and status registers.
type FADT struct {
	Header
	FirmwareCtrl     uint32 // FACS: none on a hardware-reduced platform
	DSDT             uint32 // 0: X_DSDT is used
	Reserved0        uint8  // INT_MODEL in ACPI 1.0
	PreferredPMProf  uint8
	SCIInt           uint16
	SMICmd           uint32
	ACPIEnable       uint8
	ACPIDisable      uint8
	S4BIOSReq        uint8
	PStateCnt        uint8
	PM1aEvtBlk       uint32
	PM1bEvtBlk       uint32
	PM1aCntBlk       uint32
	PM1bCntBlk       uint32
	PM2CntBlk        uint32
	PMTmrBlk         uint32
	GPE0Blk          uint32
	GPE1Blk          uint32
	PM1EvtLen        uint8
	PM1CntLen        uint8
	PM2CntLen        uint8
	PMTmrLen         uint8
	GPE0BlkLen       uint8
	GPE1BlkLen       uint8
	GPE1Base         uint8
	CstCnt           uint8
	PLvl2Lat         uint16
	PLvl3Lat         uint16
	FlushSize        uint16
	FlushStride      uint16
	DutyOffset       uint8
	DutyWidth        uint8
	DayAlrm          uint8
	MonAlrm          uint8
	Century          uint8
	IAPCBootArch     uint16
	Reserved1        uint8
	Flags            uint32
	ResetReg         GAS
	ResetValue       uint8
	ARMBootArch      uint16
	MinorVersion     uint8
	XFirmwareCtrl    uint64
	XDSDT            uint64
	XPM1aEvtBlk      GAS
	XPM1bEvtBlk      GAS
	XPM1aCntBlk      GAS
	XPM1bCntBlk      GAS
	XPM2CntBlk       GAS
	XPMTmrBlk        GAS
	XGPE0Blk         GAS
	XGPE1Blk         GAS
	SleepControlReg  GAS
	SleepStatusReg   GAS
	HypervisorVendor uint64
}

// FADTSize is the size of FADT revision 6.
const FADTSize = 276

// FADT values (5.2.9.3 IA-PC boot architecture flags, 5.2.9 table 5.10
// fixed feature flags).
const (
	fadtRevision      = 6
	fadtMinorVersion  = 5      // ACPI 6.5
	BootArchLegacy    = 1 << 0 // LEGACY_DEVICES: ISA devices (COM1, CMOS) exist
	BootArch8042      = 1 << 1 // an 8042 (microvm's i8042, for the reset line)
	BootArchNoVGA     = 1 << 2 // VGA Not Present
	BootArchNoMSI     = 1 << 3 // MSI Not Supported: there is no PCI
	FlagWBINVD        = 1 << 0
	FlagPwrButton     = 1 << 4 // no fixed-feature power button
	FlagSlpButton     = 1 << 5 // no fixed-feature sleep button
	FlagResetRegSup   = 1 << 10
	FlagHWReducedACPI = 1 << 20
)

// MADT is the fixed part of the Multiple APIC Description Table (5.2.12):
// 44 bytes, followed by the interrupt controller structures.
type MADT struct {
	Header
	LocalAPICAddress uint32
	Flags            uint32 // MADTPCATCompat when dual 8259s exist
}

// MADTSize is the size of MADT's fixed part.
const MADTSize = 44

// MADT values.
const (
	madtRevision   = 5
	MADTPCATCompat = 1 << 0

	madtTypeLocalAPIC  = 0
	madtTypeIOAPIC     = 1
	madtTypeIntSrcOvr  = 2
	madtTypeLocalNMI   = 4
	localAPICEnabled   = 1 << 0
	localAPICAllUIDs   = 0xff
	mpsINTIConforming  = 0 // polarity and trigger mode "conform to the bus"
	mpsINTIActiveHigh  = 1 << 0
	mpsINTIEdge        = 1 << 2
	madtISABus         = 0
	madtLegacyIRQCount = 16
)

// MADTLocalAPIC is a Processor Local APIC structure (5.2.12.2), 8 bytes.
type MADTLocalAPIC struct {
	Type, Length uint8
	ProcessorUID uint8
	APICID       uint8
	Flags        uint32
}

// MADTIOAPIC is an I/O APIC structure (5.2.12.3), 12 bytes.
type MADTIOAPIC struct {
	Type, Length uint8
	IOAPICID     uint8
	Reserved     uint8
	Address      uint32
	GSIBase      uint32
}

// MADTIntSrcOvr is an Interrupt Source Override structure (5.2.12.5), 10 bytes.
type MADTIntSrcOvr struct {
	Type, Length uint8
	Bus          uint8 // 0: ISA
	Source       uint8 // ISA IRQ
	GSI          uint32
	Flags        uint16 // MPS INTI flags
}

// MADTLocalNMI is a Local APIC NMI structure (5.2.12.7), 6 bytes.
type MADTLocalNMI struct {
	Type, Length uint8
	ProcessorUID uint8 // 0xff: all processors
	Flags        uint16
	LINT         uint8
}

// Struct sizes from the specification, checked against binary.Size in tests.
const (
	GASSize           = 12
	MADTLocalAPICSize = 8
	MADTIOAPICSize    = 12
	MADTIntSrcOvrSize = 10
	MADTLocalNMISize  = 6
)

// pack encodes fixed-layout structs packed and little-endian. The structs
// hold only fixed-size fields, so encoding cannot fail.
func pack(vs ...any) []byte {
	var b bytes.Buffer
	for _, v := range vs {
		if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
			panic("acpi: pack: " + err.Error())
		}
	}
	return b.Bytes()
}

// Checksum returns the byte that makes b, whose checksum byte is still 0,
// sum to zero modulo 256.
func Checksum(b []byte) uint8 {
	var s uint8
	for _, c := range b {
		s += c
	}
	return -s
}

// Offsets of the checksum bytes.
const (
	headerChecksumOff  = 9
	rsdpChecksumOff    = 8
	rsdpExtChecksumOff = 32
	headerLengthOff    = 4
)

// finish fills in a table's Length and Checksum.
func finish(t []byte) []byte {
	binary.LittleEndian.PutUint32(t[headerLengthOff:], uint32(len(t)))
	t[headerChecksumOff] = 0
	t[headerChecksumOff] = Checksum(t)
	return t
}
