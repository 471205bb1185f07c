package loader

import "encoding/binary"

// PVH boot: xen/include/public/arch-x86/hvm/start_info.h. The VMM starts vCPU 0
// in 32-bit protected mode at the XEN_ELFNOTE_PHYS32_ENTRY address with EBX
// holding the physical address of struct hvm_start_info.
const (
	hvmStartMagic    = 0x336ec578 // XEN_HVM_START_MAGIC_VALUE
	hvmStartVersion  = 1          // version 1 adds memmap_paddr/memmap_entries
	startInfoSize    = 56         // sizeof(struct hvm_start_info), version 1
	modlistEntrySize = 32         // sizeof(struct hvm_modlist_entry)
	memmapEntrySize  = 24         // sizeof(struct hvm_memmap_table_entry)
)

// startInfo holds what goes in the PVH start info page.
type startInfo struct {
	cmdline    uint64
	initrd     uint64 // 0 with initrdSize 0: no module
	initrdSize uint64
	rsdp       uint64 // ACPI RSDP address; 0: none
	memmap     []E820Entry
}

// encode lays out, from StartInfoAddr: struct hvm_start_info (magic, version
// 1, flags 0, nr_modules, modlist_paddr, cmdline_paddr, rsdp_paddr (0 without
// ACPI tables), memmap_paddr, memmap_entries), then the module list (the initrd as
// the only module, with no command line), then the memory map. Address
// fields that are 0 mean "not present", as the header specifies.
func (s *startInfo) encode() ([]byte, error) {
	if len(s.memmap) > MaxE820 {
		return nil, bad(ErrTooBig, "memory map has %d entries; at most %d are passed", len(s.memmap), MaxE820)
	}
	nmod := 0
	if s.initrdSize > 0 {
		nmod = 1
	}
	modlist := uint64(StartInfoAddr + startInfoSize)
	memmap := modlist + uint64(nmod*modlistEntrySize)
	n := int(memmap-StartInfoAddr) + len(s.memmap)*memmapEntrySize
	b := make([]byte, n) // at most 56+32+128*24 = 3160 bytes: inside the page
	le := binary.LittleEndian
	le.PutUint32(b[0:], hvmStartMagic)
	le.PutUint32(b[4:], hvmStartVersion)
	le.PutUint32(b[8:], 0) // flags: no SIF_* applies
	le.PutUint32(b[12:], uint32(nmod))
	if nmod > 0 {
		le.PutUint64(b[16:], modlist)
	}
	le.PutUint64(b[24:], s.cmdline)
	le.PutUint64(b[32:], s.rsdp) // rsdp_paddr
	if len(s.memmap) > 0 {
		le.PutUint64(b[40:], memmap)
	}
	le.PutUint32(b[48:], uint32(len(s.memmap)))
	le.PutUint32(b[52:], 0) // reserved
	if nmod > 0 {
		m := b[modlist-StartInfoAddr:]
		le.PutUint64(m[0:], s.initrd)
		le.PutUint64(m[8:], s.initrdSize)
		le.PutUint64(m[16:], 0) // cmdline_paddr: none
		le.PutUint64(m[24:], 0) // reserved
	}
	for i, e := range s.memmap {
		putE820(b[memmap-StartInfoAddr+uint64(i*memmapEntrySize):], e) // reserved u32 stays 0
	}
	return b, nil
}
