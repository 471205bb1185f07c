package loader

import "encoding/binary"

// Mode is the CPU mode vCPU 0 starts in.
type Mode int

const (
	// Protected32 is 32-bit protected mode with flat 4 GiB segments and
	// paging off (the PVH entry).
	Protected32 Mode = iota + 1
	// Long64 is 64-bit long mode with the identity map of the first 4 GiB
	// at PageTableAddr (the Linux 64-bit boot protocol).
	Long64
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case Protected32:
		return "32-bit protected"
	case Long64:
		return "64-bit long"
	}
	return "Mode(?)"
}

// Control register and EFER bits the entry states use.
const (
	CR0PE    = 1 << 0  // protection enable
	CR0ET    = 1 << 4  // extension type (hard-wired to 1 on modern CPUs)
	CR0PG    = 1 << 31 // paging
	CR4PAE   = 1 << 5  // physical address extension, required by long mode
	EFERLME  = 1 << 8  // long mode enable
	EFERLMA  = 1 << 10 // long mode active
	RFLAGSR1 = 1 << 1  // the always-one reserved bit; IF stays clear
)

// Segment describes a segment register's hidden state in the form KVM's
// struct kvm_segment takes it, and encodes to the GDT descriptor the loader
// writes for it, so the VMM can copy the fields across without re-deriving
// them.
type Segment struct {
	Selector uint16
	Base     uint64
	// Limit is in bytes (0xffffffff for a flat 4 GiB segment), as KVM wants
	// it; the descriptor stores it in 4 KiB units when G is set.
	Limit   uint32
	Type    uint8 // 4-bit type: 0xb code execute/read accessed, 0x3 data read/write accessed, 0xb busy TSS
	S       bool  // code or data segment (false: system segment such as a TSS)
	DPL     uint8
	Present bool
	DB      bool // default operation size 32 bits
	L       bool // 64-bit code segment
	G       bool // limit granularity 4 KiB
	AVL     bool
}

// Descriptor encodes the low 8 bytes of the segment's GDT descriptor (Intel
// SDM vol. 3, 3.4.5). A 64-bit system descriptor's upper 8 bytes hold
// Base>>32 and are written separately.
func (s Segment) Descriptor() uint64 {
	limit := uint64(s.Limit)
	if s.G {
		limit >>= 12
	}
	d := limit & 0xffff
	d |= (s.Base & 0xffffff) << 16
	d |= uint64(s.Type&0xf) << 40
	d |= b2u(s.S) << 44
	d |= uint64(s.DPL&3) << 45
	d |= b2u(s.Present) << 47
	d |= (limit >> 16 & 0xf) << 48
	d |= b2u(s.AVL) << 52
	d |= b2u(s.L) << 53
	d |= b2u(s.DB) << 54
	d |= b2u(s.G) << 55
	d |= (s.Base >> 24 & 0xff) << 56
	return d
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// DescriptorTable is a GDTR/IDTR value.
type DescriptorTable struct {
	Base  uint64
	Limit uint16
}

// Selectors of the boot GDT. Linux's 64-bit boot protocol asks for
// __BOOT_CS = 0x10 and __BOOT_DS = 0x18; the PVH entry uses the 32-bit code
// segment at 0x08 and the same data segment. The TSS takes two slots (a
// 16-byte system descriptor in long mode; in protected mode the second slot is
// an unused null descriptor).
const (
	SelCode32 = 0x08
	SelCode64 = 0x10
	SelData   = 0x18
	SelTSS    = 0x20
	gdtSlots  = 6
)

// The boot segments. All are flat, DPL 0; the TSS is a busy 32/64-bit TSS of
// base 0 and limit 0x67, which VM entry requires TR to hold and which the
// kernel replaces before it could use it.
var (
	code32 = Segment{Selector: SelCode32, Limit: 0xffffffff, Type: 0xb, S: true, Present: true, DB: true, G: true}
	code64 = Segment{Selector: SelCode64, Limit: 0xffffffff, Type: 0xb, S: true, Present: true, L: true, G: true}
	data   = Segment{Selector: SelData, Limit: 0xffffffff, Type: 0x3, S: true, Present: true, DB: true, G: true}
	tss    = Segment{Selector: SelTSS, Limit: 0x67, Type: 0xb, Present: true}
)

// gdtBytes is the boot GDT: null, code32, code64, data, TSS (2 slots).
func gdtBytes() []byte {
	b := make([]byte, gdtSlots*8)
	for _, s := range []Segment{code32, code64, data, tss} {
		binary.LittleEndian.PutUint64(b[s.Selector:], s.Descriptor())
	}
	binary.LittleEndian.PutUint64(b[SelTSS+8:], tss.Base>>32)
	return b
}

// bootGDT is the GDTR value for the table at GDTAddr.
var bootGDT = DescriptorTable{Base: GDTAddr, Limit: gdtSlots*8 - 1}

// Page table entry bits.
const (
	ptePresent = 1 << 0
	pteWrite   = 1 << 1
	ptePS      = 1 << 7 // 2 MiB page in a page directory entry
)

// pageTables builds the identity map of [0, 4 GiB) with 2 MiB pages: a PML4
// at PageTableAddr whose entry 0 points to the PDPT at +0x1000, whose entries
// 0..3 point to the page directories at +0x2000..+0x5000.
func pageTables() []byte {
	b := make([]byte, pageTableSz)
	pdpt := uint64(PageTableAddr + pageSize)
	binary.LittleEndian.PutUint64(b[0:], pdpt|ptePresent|pteWrite)
	for i := uint64(0); i < 4; i++ {
		pd := uint64(PageTableAddr + (2+i)*pageSize)
		binary.LittleEndian.PutUint64(b[pageSize+8*i:], pd|ptePresent|pteWrite)
		for j := uint64(0); j < 512; j++ {
			addr := (i*512 + j) << 21
			binary.LittleEndian.PutUint64(b[(2+i)*pageSize+8*j:], addr|ptePresent|pteWrite|ptePS)
		}
	}
	return b
}
