package loader

import (
	"encoding/binary"

	"github.com/microvm/microvm/kvm/guestmem"
)

// Intel MultiProcessor Specification 1.4, chapter 4. The floating pointer
// goes at the start of the EBDA (MPTableAddr), where Linux's scan of "the
// last KiB of base memory" finds it, and the configuration table right after
// it; both must fit in the 1 KiB EBDA.
const (
	mpfSize        = 16 // MP floating pointer structure
	mpcHeaderSize  = 44 // MP configuration table header
	mpProcSize     = 20 // processor entry
	mpEntrySize    = 8  // bus, I/O APIC, I/O and local interrupt entries
	mpIOAPICPins   = 24 // ISA IRQ i -> I/O APIC pin i, i < 24
	mpFixedEntries = 1 + 1 + mpIOAPICPins + 2
	ebdaSize       = ebdaEnd - ebdaStart

	// MaxCPUs is the most vCPUs the MP table in the EBDA can describe:
	// (1024 - 16 - 44 - 28*8) / 20 = 37.
	MaxCPUs = (ebdaSize - mpfSize - mpcHeaderSize - mpFixedEntries*mpEntrySize) / mpProcSize

	// LAPICAddr and IOAPICAddr are the (KVM in-kernel) interrupt
	// controllers' MMIO addresses.
	LAPICAddr  = 0xfee00000
	IOAPICAddr = 0xfec00000

	mpSpecRev      = 4    // MP 1.4
	lapicVersion   = 0x14 // integrated xAPIC, as KVM reports
	ioapicVersion  = 0x11 // KVM's IOAPIC
	cpuSignature   = 6<<8 | 0<<4 | 0
	cpuFeatureFPU  = 1 << 0
	cpuFeatureAPIC = 1 << 9
	isaBusID       = 0

	mpTypeProc   = 0
	mpTypeBus    = 1
	mpTypeIOAPIC = 2
	mpTypeIOInt  = 3
	mpTypeLocInt = 4
	mpIntINT     = 0
	mpIntNMI     = 1
	mpIntExtINT  = 3
	mpCPUEnabled = 1 << 0
	mpCPUBSP     = 1 << 1
	mpAllLAPICs  = 0xff
	mpConforming = 0 // polarity and trigger "conform to the bus": ISA is edge, active high
)

// mpTable builds the floating pointer followed by the configuration table, as
// placed at MPTableAddr.
//
// Entries, in the order the spec requires (by type): one processor per vCPU
// (APIC ID = index, enabled, vCPU 0 the bootstrap processor, family 6 with
// FPU and APIC features); the ISA bus (ID 0); the I/O APIC (ID = ncpus,
// version 0x11, at IOAPICAddr, enabled); 24 INT entries routing ISA IRQ i to
// I/O APIC pin i with conforming (edge, active high) polarity and trigger,
// the identity routing KVM's in-kernel irqchip uses by default; ExtINT to
// LINT0 of the BSP and NMI to LINT1 of every local APIC.
func mpTable(ncpus int) ([]byte, error) {
	if ncpus < 1 || ncpus > MaxCPUs {
		return nil, bad(ErrTooManyCPUs, "MP table: %d vCPUs (the EBDA holds entries for 1..%d)", ncpus, MaxCPUs)
	}
	nentries := ncpus + mpFixedEntries
	tableLen := mpcHeaderSize + ncpus*mpProcSize + mpFixedEntries*mpEntrySize
	b := make([]byte, mpfSize+tableLen)
	le := binary.LittleEndian

	// Floating pointer.
	copy(b[0:], "_MP_")
	le.PutUint32(b[4:], MPTableAddr+mpfSize) // configuration table address
	b[8] = 1                                 // length in 16-byte units
	b[9] = mpSpecRev
	// b[11] = 0: a configuration table is present (no default config);
	// b[12] bit 7 (IMCRP) = 0: virtual wire mode, no IMCR.
	b[10] = checksum(b[:mpfSize])

	// Configuration table header; checksum last.
	t := b[mpfSize:]
	copy(t[0:], "PCMP")
	le.PutUint16(t[4:], uint16(tableLen))
	t[6] = mpSpecRev
	copy(t[8:16], "MICROVM ")
	copy(t[16:28], "MICROVM     ")
	le.PutUint16(t[34:], uint16(nentries))
	le.PutUint32(t[36:], LAPICAddr)

	e := t[mpcHeaderSize:]
	for i := 0; i < ncpus; i++ {
		e[0] = mpTypeProc
		e[1] = uint8(i)
		e[2] = lapicVersion
		e[3] = mpCPUEnabled
		if i == 0 {
			e[3] |= mpCPUBSP
		}
		le.PutUint32(e[4:], cpuSignature)
		le.PutUint32(e[8:], cpuFeatureFPU|cpuFeatureAPIC)
		e = e[mpProcSize:]
	}
	e[0], e[1] = mpTypeBus, isaBusID
	copy(e[2:8], "ISA   ")
	e = e[mpEntrySize:]
	ioapicID := uint8(ncpus)
	e[0], e[1], e[2], e[3] = mpTypeIOAPIC, ioapicID, ioapicVersion, 1 // enabled
	le.PutUint32(e[4:], IOAPICAddr)
	e = e[mpEntrySize:]
	for irq := 0; irq < mpIOAPICPins; irq++ {
		e[0], e[1] = mpTypeIOInt, mpIntINT
		le.PutUint16(e[2:], mpConforming)
		e[4], e[5], e[6], e[7] = isaBusID, uint8(irq), ioapicID, uint8(irq)
		e = e[mpEntrySize:]
	}
	e[0], e[1] = mpTypeLocInt, mpIntExtINT
	le.PutUint16(e[2:], mpConforming)
	e[4], e[5], e[6], e[7] = isaBusID, 0, 0, 0 // to the BSP's LINT0
	e = e[mpEntrySize:]
	e[0], e[1] = mpTypeLocInt, mpIntNMI
	le.PutUint16(e[2:], mpConforming)
	e[4], e[5], e[6], e[7] = isaBusID, 0, mpAllLAPICs, 1 // to every LINT1

	t[7] = checksum(t[:tableLen])
	return b, nil
}

// checksum returns the byte that makes b (whose checksum byte is still 0)
// sum to zero modulo 256.
func checksum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return -s
}

// WriteMPTable writes the MP floating pointer and configuration table for
// ncpus vCPUs at MPTableAddr (see mpTable for the entries). It fails with
// ErrTooManyCPUs beyond MaxCPUs, and when the EBDA is not in guest memory.
func WriteMPTable(mem *guestmem.Memory, ncpus int) error {
	b, err := mpTable(ncpus)
	if err != nil {
		return err
	}
	if err := mem.Zero(ebdaStart, ebdaSize); err != nil {
		return bad(ErrTooBig, "MP table: the EBDA at %#x is not in guest memory: %v", ebdaStart, err)
	}
	return mem.Write(MPTableAddr, b)
}
