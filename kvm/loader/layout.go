package loader

// Guest-physical addresses of everything the loader writes. They follow the
// machine contract in docs/machine.md; the boot structures live in low RAM
// below 1 MiB, which the e820 map still reports as RAM (the kernel reclaims it
// once it has copied what it needs).
const (
	// GDTAddr is where the boot GDT is written (see GDT).
	GDTAddr = 0x500
	// StartInfoAddr is the PVH hvm_start_info, followed by its module list
	// and memory map, all inside one page.
	StartInfoAddr = 0x6000
	// BootParamsAddr is the Linux zero page (struct boot_params).
	BootParamsAddr = 0x7000
	// BootStackTop is the initial stack pointer: the free page between the
	// zero page and the page tables serves as a small boot stack. Linux sets
	// up its own stack at once; the value only keeps RSP pointing at RAM.
	BootStackTop = 0x8ff0
	// PageTableAddr is the PML4 of the identity map used by the 64-bit
	// entry; the PDPT follows at +0x1000 and four page directories at
	// +0x2000..+0x5fff (CR3 = PageTableAddr).
	PageTableAddr = 0x9000
	// CmdlineAddr is where the NUL-terminated kernel command line goes.
	CmdlineAddr = 0x20000
	// CmdlineMax is the space reserved for the command line, NUL included.
	CmdlineMax = 0x10000
	// MPTableAddr is the MP floating pointer, at the start of the EBDA; the
	// MP configuration table follows it.
	MPTableAddr = 0x9fc00
	// KernelAddr is where a bzImage's protected-mode kernel is loaded.
	KernelAddr = 0x100000

	ebdaStart   = 0x9fc00
	ebdaEnd     = 0xa0000
	highMem     = 0x100000    // first byte above the legacy hole
	mmioGap     = 0xc0000000  // first byte of the MMIO gap (3 GiB)
	fourGiB     = 0x100000000 // end of the identity map and of 32-bit pointers
	pageSize    = 0x1000
	pageTableSz = 6 * pageSize // PML4, PDPT, 4 PDs
)

// reservedSpan is low memory an ELF kernel's segments may not overlap.
type reservedSpan struct {
	start, end uint64
	what       string
}

var reservedLow = []reservedSpan{
	{0, pageSize, "page 0 (real-mode IVT, BDA and the boot GDT)"},
	{StartInfoAddr, PageTableAddr + pageTableSz, "the boot structures (start info, boot_params, stack, page tables)"},
	{CmdlineAddr, CmdlineAddr + CmdlineMax, "the command line"},
	{ebdaStart, highMem, "the EBDA (MP table) and the legacy hole"},
}
