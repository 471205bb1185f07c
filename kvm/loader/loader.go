package loader

import (
	"fmt"
	"strings"

	"github.com/microvm/microvm/kvm/guestmem"
)

// Kind is the kernel image format, which decides the boot flow.
type Kind int

const (
	// BzImage is a Linux bzImage, started through the 64-bit boot protocol
	// at KernelAddr+0x200 with boot_params at BootParamsAddr.
	BzImage Kind = iota + 1
	// PVH is an ELF (32- or 64-bit) with a XEN_ELFNOTE_PHYS32_ENTRY note,
	// started in 32-bit protected mode with hvm_start_info at StartInfoAddr.
	PVH
	// ELF64 is an x86-64 ELF without the PVH note (a vmlinux), started
	// through the 64-bit boot protocol at its physical entry point, as
	// Firecracker does.
	ELF64
)

// String names the format.
func (k Kind) String() string {
	switch k {
	case BzImage:
		return "bzImage"
	case PVH:
		return "PVH ELF"
	case ELF64:
		return "ELF64"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Config is what Load needs.
type Config struct {
	// Kernel is the kernel image: a bzImage, or an ELF kernel.
	Kernel Image
	// Initrd, when non-nil, is loaded as the initial ramdisk.
	Initrd *Image
	// Cmdline is the kernel command line. It must not contain NUL.
	Cmdline string
	// E820 is the memory map given to the guest; nil means
	// E820(mem.Ranges()).
	E820 []E820Entry
	// CPUs is the number of vCPUs the MP table announces (1..MaxCPUs).
	CPUs int
	// RSDP, when not 0, is the guest-physical address of the ACPI RSDP
	// the caller wrote: it goes into boot_params.acpi_rsdp_addr and the
	// PVH hvm_start_info's rsdp_paddr. The MP table is written either way.
	RSDP uint64
}

// Boot is the result of Load: the state vCPU 0 must start in, and where
// things were put. Register values are complete (not bits to OR into KVM's
// reset state): CR0 in particular leaves caching enabled.
type Boot struct {
	Kind Kind
	Mode Mode

	RIP    uint64
	RSP    uint64
	RSI    uint64 // boot_params (Long64); 0 for PVH
	RBX    uint64 // hvm_start_info (PVH); 0 for Long64
	RFLAGS uint64 // RFLAGSR1 only: interrupts disabled

	CR0, CR3, CR4, EFER uint64

	// GDT is the table written at GDTAddr. CS is the code segment; DS is
	// loaded into DS, ES, FS, GS and SS; TR is the TSS. The IDT is left
	// empty (base 0, limit 0): interrupts stay off until the kernel loads its
	// own.
	GDT DescriptorTable
	CS  Segment
	DS  Segment
	TR  Segment

	// Kernel is the memory the kernel occupies from its load address up to
	// the highest address it may use before reading the memory map (for a
	// bzImage: the run address plus init_size).
	Kernel guestmem.Range
	// Initrd is where the initrd went (Size 0: none).
	Initrd guestmem.Range
	// Cmdline is the command line, NUL included.
	Cmdline guestmem.Range
}

// Load detects the kernel's format, loads it, the command line and the
// initrd into mem, writes the boot structures (GDT, page tables, boot_params
// or hvm_start_info, MP table) and returns the entry state for vCPU 0. The
// layout is in layout.go and doc.go. Errors are one line naming the file.
func Load(mem *guestmem.Memory, cfg Config) (*Boot, error) {
	kname := cfg.Kernel.Name
	if kname == "" {
		kname = "(unnamed)"
	}
	kerr := func(err error) error { return inFile("kernel", kname, err) }
	switch {
	case mem == nil:
		return nil, bad(ErrConfig, "loader: no guest memory")
	case cfg.Kernel.R == nil || cfg.Kernel.Size <= 0:
		return nil, kerr(bad(ErrConfig, "empty or missing"))
	case uint64(cfg.Kernel.Size) > maxImage:
		return nil, kerr(bad(ErrTooBig, "%s is larger than 4 GiB", size(uint64(cfg.Kernel.Size))))
	case cfg.CPUs < 1 || cfg.CPUs > MaxCPUs:
		return nil, bad(ErrTooManyCPUs, "loader: %d vCPUs requested; the MP table supports 1..%d", cfg.CPUs, MaxCPUs)
	case strings.IndexByte(cfg.Cmdline, 0) >= 0:
		return nil, bad(ErrConfig, "command line contains a NUL byte")
	}
	lowEnd, err := lowRAMEnd(mem)
	if err != nil {
		return nil, err
	}
	e820 := cfg.E820
	if e820 == nil {
		e820 = E820(mem.Ranges())
	}
	if len(e820) > MaxE820 {
		return nil, bad(ErrTooBig, "memory map has %d entries; at most %d can be passed", len(e820), MaxE820)
	}

	kind, err := detect(cfg.Kernel)
	if err != nil {
		return nil, kerr(err)
	}
	p := &plan{mem: mem, cfg: cfg, lowEnd: lowEnd, e820: e820, cmdlineMax: CmdlineMax - 1}
	if kind == BzImage {
		err = p.loadBzImage()
	} else {
		err = p.loadELF()
	}
	if err != nil {
		return nil, kerr(err)
	}
	if err := p.placeCmdline(); err != nil {
		return nil, kerr(err)
	}
	if err := p.placeInitrd(); err != nil {
		return nil, err
	}
	if err := p.writeBootStructures(); err != nil {
		return nil, err
	}
	return p.boot, nil
}

// detect tells a bzImage (BzImage) from an ELF kernel (ELF64 is returned for
// both ELF kinds; loadELF tells PVH apart) by the header alone.
func detect(img Image) (Kind, error) {
	head, err := readAt(img, 0, min(uint64(img.Size), offHeader+4), "header")
	if err != nil {
		return 0, err
	}
	switch {
	case isELF(head):
		return ELF64, nil
	case len(head) >= offHeader+4 && string(head[offHeader:offHeader+4]) == "HdrS":
		return BzImage, nil
	}
	m := head[:min(len(head), 4)]
	return 0, bad(ErrUnknownFormat, "not a bzImage or ELF kernel (starts with %x, no HdrS at 0x202)", m)
}

// Check parses a kernel image's headers as Load would, without guest memory,
// and returns its format. A VMM calls it before it opens KVM, so a bad
// kernel file is reported as such on any host, with or without /dev/kvm.
// What only guest memory can tell (does it fit?) is left to Load.
func Check(img Image) (Kind, error) {
	name := img.Name
	if name == "" {
		name = "(unnamed)"
	}
	kerr := func(err error) error { return inFile("kernel", name, err) }
	switch {
	case img.R == nil || img.Size <= 0:
		return 0, kerr(bad(ErrConfig, "empty or missing"))
	case uint64(img.Size) > maxImage:
		return 0, kerr(bad(ErrTooBig, "%s is larger than 4 GiB", size(uint64(img.Size))))
	}
	kind, err := detect(img)
	if err != nil {
		return 0, kerr(err)
	}
	if kind == BzImage {
		if _, err := parseSetupHeader(img); err != nil {
			return 0, kerr(err)
		}
		return BzImage, nil
	}
	k, err := parseELF(img)
	if err != nil {
		return 0, kerr(err)
	}
	switch {
	case k.pvh:
		return PVH, nil
	case !k.is64:
		return 0, kerr(bad(ErrUnsupported, "ELF32 kernel without a PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): no way to start it"))
	}
	return ELF64, nil
}

// plan carries one Load through its steps.
type plan struct {
	mem    *guestmem.Memory
	cfg    Config
	lowEnd uint64 // end of RAM contiguous from 1 MiB, capped at the MMIO gap
	e820   []E820Entry

	boot       *Boot
	setup      *setupHeader // bzImage only
	kernelEnd  uint64       // the initrd goes at or above this
	initrdMax  uint64       // and ends at or below this (exclusive)
	cmdlineMax uint64       // longest command line, NUL excluded
}

// loadBzImage loads the protected-mode kernel of a bzImage at KernelAddr.
func (p *plan) loadBzImage() error {
	img := p.cfg.Kernel
	sh, err := parseSetupHeader(img)
	if err != nil {
		return err
	}
	imageLen := uint64(img.Size) - sh.setupSize
	imageEnd := KernelAddr + imageLen
	need := max(imageEnd, sh.runStart+sh.initSize)
	if need > p.lowEnd {
		return bad(ErrTooBig, "needs %s (image %s at %#x, init_size %s from %#x) but guest memory has %s",
			size(need), size(imageLen), KernelAddr, size(sh.initSize), sh.runStart, size(p.lowEnd))
	}
	if err := copyIn(p.mem, KernelAddr, img.R, sh.setupSize, imageLen); err != nil {
		return err
	}
	p.setup = sh
	p.kernelEnd = need
	p.initrdMax = p.lowEnd
	if sh.initrdMax != 0 {
		p.initrdMax = min(p.initrdMax, sh.initrdMax+1)
	}
	p.cmdlineMax = min(p.cmdlineMax, sh.cmdlineMax)
	p.boot = long64Boot(BzImage, KernelAddr+entry64Offset)
	p.boot.Kernel = guestmem.Range{GPA: KernelAddr, Size: need - KernelAddr}
	return nil
}

// loadELF loads an ELF kernel's PT_LOAD segments at their physical addresses.
func (p *plan) loadELF() error {
	img := p.cfg.Kernel
	k, err := parseELF(img)
	if err != nil {
		return err
	}
	if !k.pvh && !k.is64 {
		return bad(ErrUnsupported, "ELF32 kernel without a PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): no way to start it")
	}
	lo, hi := ^uint64(0), uint64(0)
	for i, s := range k.loads {
		end := s.paddr + s.memsz // checked below 4 GiB by parseELF
		if !inRAM(p.mem, s.paddr, s.memsz) {
			return bad(ErrTooBig, "segment %d at %#x-%#x is outside guest RAM (%s below the MMIO gap)", i, s.paddr, end, size(p.lowEnd))
		}
		for _, r := range reservedLow {
			if s.paddr < r.end && end > r.start {
				return bad(ErrUnsupported, "segment %d at %#x-%#x overlaps %s at %#x-%#x", i, s.paddr, end, r.what, r.start, r.end)
			}
		}
		lo, hi = min(lo, s.paddr), max(hi, end)
	}
	entry := k.entry
	if k.pvh {
		entry = k.pvhEntry
	}
	phys, ok := k.physEntry(entry, k.pvh)
	if !ok {
		return bad(ErrMalformed, "entry point %#x is in no loadable segment", entry)
	}
	for _, s := range k.loads {
		if err := copyIn(p.mem, s.paddr, img.R, s.offset, s.filesz); err != nil {
			return err
		}
		if err := p.mem.Zero(s.paddr+s.filesz, s.memsz-s.filesz); err != nil {
			return err
		}
	}
	p.kernelEnd = max(hi, highMem)
	p.initrdMax = p.lowEnd
	if k.pvh {
		p.boot = pvhBoot(phys)
	} else {
		p.boot = long64Boot(ELF64, phys)
	}
	p.boot.Kernel = guestmem.Range{GPA: lo, Size: hi - lo}
	return nil
}

// physEntry returns the physical address of entry: as is when it lies in a
// segment's physical range, else translated from a segment's virtual range
// (a vmlinux's e_entry is normally physical already). The PVH entry is
// physical by definition.
func (k *elfKernel) physEntry(entry uint64, physOnly bool) (uint64, bool) {
	for _, s := range k.loads {
		if entry >= s.paddr && entry-s.paddr < s.memsz {
			return entry, true
		}
	}
	if physOnly {
		return 0, false
	}
	for _, s := range k.loads {
		if entry >= s.vaddr && entry-s.vaddr < s.memsz {
			return entry - s.vaddr + s.paddr, true
		}
	}
	return 0, false
}

// placeCmdline writes the NUL-terminated command line at CmdlineAddr.
func (p *plan) placeCmdline() error {
	n := uint64(len(p.cfg.Cmdline))
	if n > p.cmdlineMax {
		return bad(ErrTooBig, "command line of %d bytes is longer than the %d the kernel accepts", n, p.cmdlineMax)
	}
	b := append([]byte(p.cfg.Cmdline), 0)
	if err := p.mem.Write(CmdlineAddr, b); err != nil {
		return bad(ErrTooBig, "command line: %v", err)
	}
	p.boot.Cmdline = guestmem.Range{GPA: CmdlineAddr, Size: n + 1}
	return nil
}

// placeInitrd puts the initrd page-aligned as high as possible below
// p.initrdMax and at or above p.kernelEnd.
func (p *plan) placeInitrd() error {
	ird := p.cfg.Initrd
	if ird == nil {
		return nil
	}
	name := ird.Name
	if name == "" {
		name = "(unnamed)"
	}
	if ird.R == nil || ird.Size <= 0 {
		return inFile("initrd", name, bad(ErrConfig, "empty or missing"))
	}
	n := uint64(ird.Size)
	addr, ok := initrdAddr(n, p.kernelEnd, p.initrdMax)
	if !ok {
		limit := "the top of low RAM"
		if p.initrdMax < p.lowEnd {
			limit = "the kernel's initrd_addr_max"
		}
		return bad(ErrTooBig, "initrd %s (%s) does not fit between the end of the kernel at %#x and %s at %#x",
			name, size(n), p.kernelEnd, limit, p.initrdMax)
	}
	if err := copyIn(p.mem, addr, ird.R, 0, n); err != nil {
		return inFile("initrd", name, err)
	}
	p.boot.Initrd = guestmem.Range{GPA: addr, Size: n}
	return nil
}

// initrdAddr returns the highest page-aligned address a at which n bytes fit
// in [lo, hi), if any.
func initrdAddr(n, lo, hi uint64) (uint64, bool) {
	if n == 0 || n > hi {
		return 0, false
	}
	a := (hi - n) &^ (pageSize - 1)
	lo = (lo + pageSize - 1) &^ (pageSize - 1)
	if a < lo {
		return 0, false
	}
	return a, true
}

// writeBootStructures writes the GDT, the page tables and boot_params (64-bit
// entry) or the start info (PVH), and the MP table.
func (p *plan) writeBootStructures() error {
	b := p.boot
	fail := func(what string, err error) error {
		return bad(ErrTooBig, "boot structures: %s: %v", what, err)
	}
	if err := p.mem.Write(GDTAddr, gdtBytes()); err != nil {
		return fail("GDT", err)
	}
	switch b.Mode {
	case Long64:
		if err := p.mem.Write(PageTableAddr, pageTables()); err != nil {
			return fail("page tables", err)
		}
		zp := zeroPage{cmdline: b.Cmdline.GPA, cmdlineMax: uint32(p.cmdlineMax), initrd: b.Initrd.GPA, initrdSize: b.Initrd.Size, rsdp: p.cfg.RSDP, e820: p.e820}
		if p.setup != nil {
			zp.hdr = p.setup.raw
		}
		zb, err := zp.encode()
		if err != nil {
			return err
		}
		if err := p.mem.Write(BootParamsAddr, zb); err != nil {
			return fail("boot_params", err)
		}
	case Protected32:
		si := startInfo{cmdline: b.Cmdline.GPA, initrd: b.Initrd.GPA, initrdSize: b.Initrd.Size, rsdp: p.cfg.RSDP, memmap: p.e820}
		sb, err := si.encode()
		if err != nil {
			return err
		}
		if err := p.mem.Write(StartInfoAddr, sb); err != nil {
			return fail("hvm_start_info", err)
		}
	}
	return WriteMPTable(p.mem, p.cfg.CPUs)
}

// long64Boot is the entry state of the Linux 64-bit boot protocol
// (boot.rst, "64-bit Boot Protocol"): long mode, identity paging, CS =
// __BOOT_CS, the data selectors = __BOOT_DS, RSI = boot_params.
func long64Boot(k Kind, rip uint64) *Boot {
	return &Boot{
		Kind: k, Mode: Long64,
		RIP: rip, RSP: BootStackTop, RSI: BootParamsAddr, RFLAGS: RFLAGSR1,
		CR0: CR0PE | CR0ET | CR0PG, CR3: PageTableAddr, CR4: CR4PAE, EFER: EFERLME | EFERLMA,
		GDT: bootGDT, CS: code64, DS: data, TR: tss,
	}
}

// pvhBoot is the PVH entry state (start_info.h, "PVH boot ABI"): 32-bit
// protected mode, paging off, flat 4 GiB CS (execute/read) and data segments,
// a busy TSS of limit 0x67, EBX = hvm_start_info.
func pvhBoot(rip uint64) *Boot {
	return &Boot{
		Kind: PVH, Mode: Protected32,
		RIP: rip, RSP: BootStackTop, RBX: StartInfoAddr, RFLAGS: RFLAGSR1,
		CR0: CR0PE | CR0ET,
		GDT: bootGDT, CS: code32, DS: data, TR: tss,
	}
}
