package loader

import (
	"encoding/binary"
	"errors"

	"github.com/bobuhiro11/gokvm/bootparam"
)

// Setup header and zero page layout: Documentation/arch/x86/boot.rst ("The
// Real-Mode Kernel Header") and arch/x86/include/uapi/asm/bootparam.h. All
// offsets are from the start of the file / of struct boot_params, which share
// the setup header at 0x1f1.
const (
	offExtRamdiskImage = 0x0c0
	offExtRamdiskSize  = 0x0c4
	offExtCmdLinePtr   = 0x0c8
	offACPIRSDPAddr    = 0x070 // boot_params.acpi_rsdp_addr (protocol 2.14)
	offE820Entries     = 0x1e8
	offSetupHeader     = 0x1f1 // setup_sects, first field of struct setup_header
	offVidMode         = 0x1fa
	offBootFlag        = 0x1fe
	offJump            = 0x200 // 2-byte short jump; its second byte sizes the header
	offHeader          = 0x202 // "HdrS"
	offVersion         = 0x206
	offTypeOfLoader    = 0x210
	offLoadFlags       = 0x211
	offRamdiskImage    = 0x218
	offRamdiskSize     = 0x21c
	offHeapEndPtr      = 0x224
	offCmdLinePtr      = 0x228
	offKernelAlignment = 0x230
	offCmdlineSize     = 0x238
	offHdrMin          = 0x264 // end of init_size: the header must reach it
	offHdrMax          = 0x290 // end of the header space in boot_params (_pad7)
	offE820Table       = 0x2d0
	zeroPageSize       = 0x1000

	hdrMagic      = 0x53726448 // "HdrS"
	bootFlagMagic = 0xaa55
	loadedHigh    = 1 << 0 // loadflags LOADED_HIGH
	canUseHeap    = 1 << 7 // loadflags CAN_USE_HEAP
	xlfKernel64   = 1 << 0 // xloadflags XLF_KERNEL_64
	loaderUnknown = 0xff   // type_of_loader: "undefined" boot loader
	vidModeNormal = 0xffff // vid_mode: "normal"
	entry64Offset = 0x200  // 64-bit entry, from the start of the loaded kernel
)

// setupHeader is what the loader needs from a bzImage.
type setupHeader struct {
	raw        []byte // file bytes [0x1f1, end of header), copied into boot_params
	version    uint16
	setupSize  uint64 // bytes before the protected-mode kernel: (setup_sects+1)*512
	initrdMax  uint64 // highest address the initrd may occupy (initrd_addr_max)
	cmdlineMax uint64 // cmdline_size: longest command line, NUL excluded
	runStart   uint64 // where the kernel runs (decompresses to)
	initSize   uint64 // memory needed from runStart during initialisation
}

// parseSetupHeader checks that the file is a bzImage this loader can start
// through the 64-bit boot protocol and returns its header. The fields are
// decoded by gokvm's bootparam.SetupHeader (a packed struct read with
// encoding/binary; TestGokvmSetupHeaderOffsets checks it against boot.rst).
func parseSetupHeader(img Image) (*setupHeader, error) {
	if img.Size < offHeader+4 {
		return nil, bad(ErrUnknownFormat, "too short for a bzImage (%d bytes)", img.Size)
	}
	jump, err := readAt(img, offJump, 2, "setup header")
	if err != nil {
		return nil, err
	}
	hdrEnd := uint64(offJump+2) + uint64(jump[1])
	bp, err := bootparam.New(img.R)
	switch {
	case errors.Is(err, bootparam.ErrorSignatureNotMatch):
		return nil, bad(ErrUnknownFormat, "no HdrS magic at 0x202")
	case errors.Is(err, bootparam.ErrorOldProtocolVersion):
		v := bp.Hdr.Version
		return nil, bad(ErrUnsupported, "boot protocol %d.%02d is too old (need 2.06 or later)", v>>8, v&0xff)
	case err != nil:
		return nil, bad(ErrMalformed, "setup header truncated (%d bytes)", img.Size)
	}
	h := bp.Hdr
	ver := func() (uint16, uint16) { return h.Version >> 8, h.Version & 0xff }
	if h.Version < 0x020c || h.XloadFlags&xlfKernel64 == 0 {
		maj, mnr := ver()
		return nil, bad(ErrUnsupported, "no 64-bit entry point (boot protocol %d.%02d, xloadflags %#x; need 2.12+ with XLF_KERNEL_64)", maj, mnr, h.XloadFlags)
	}
	if h.LoadFlags&loadedHigh == 0 {
		return nil, bad(ErrUnsupported, "a zImage (loadflags LOADED_HIGH clear) is not supported")
	}
	if hdrEnd < offHdrMin || hdrEnd > offHdrMax {
		return nil, bad(ErrMalformed, "setup header ends at %#x (jump byte %#x), outside [%#x, %#x]", hdrEnd, jump[1], offHdrMin, offHdrMax)
	}
	raw, err := readAt(img, offSetupHeader, hdrEnd-offSetupHeader, "setup header")
	if err != nil {
		return nil, err
	}
	sects := uint64(h.SetupSects)
	if sects == 0 {
		sects = 4
	}
	sh := &setupHeader{
		raw:        raw,
		version:    h.Version,
		setupSize:  (sects + 1) * 512,
		initrdMax:  uint64(h.InitrdAddrMax),
		cmdlineMax: uint64(h.CmdlineSize),
		initSize:   uint64(h.InitSize),
	}
	if uint64(img.Size) <= sh.setupSize {
		return nil, bad(ErrMalformed, "file ends at %d bytes, before the kernel after %d setup sectors", img.Size, sects)
	}
	// syssize is the protected-mode kernel's size in 16-byte units
	// (boot protocol 2.04+: 32 bits). A file shorter than that was cut
	// off; booting it would only fault somewhere in the decompressor.
	if need := sh.setupSize + 16*uint64(h.SysSize); uint64(img.Size) < need {
		return nil, bad(ErrMalformed, "truncated: the header says %d bytes (setup %d + kernel %d) but the file has %d",
			need, sh.setupSize, 16*uint64(h.SysSize), img.Size)
	}
	if sh.initSize == 0 {
		return nil, bad(ErrMalformed, "init_size is 0")
	}
	// Where the kernel decompresses to: the 64-bit entry
	// (arch/x86/boot/compressed/head_64.S) aligns a relocatable kernel's load
	// address up to kernel_alignment but never goes below LOAD_PHYSICAL_ADDR,
	// which pref_address gives; a fixed kernel runs at pref_address.
	sh.runStart = max(uint64(KernelAddr), h.PrefAddress)
	if h.RelocatableKernel != 0 {
		a := uint64(h.KernelAlignment)
		if a == 0 || a&(a-1) != 0 || a > 1<<30 {
			return nil, bad(ErrMalformed, "kernel_alignment %#x is not a power of two up to 1 GiB", a)
		}
		sh.runStart = max((uint64(KernelAddr)+a-1)&^(a-1), h.PrefAddress)
	}
	if sh.runStart >= fourGiB || sh.initSize > fourGiB {
		return nil, bad(ErrMalformed, "pref_address %#x / init_size %#x is absurd", h.PrefAddress, h.InitSize)
	}
	return sh, nil
}

// zeroPage holds what the loader puts in struct boot_params besides the
// setup header it copies from the bzImage.
type zeroPage struct {
	hdr        []byte // setup header bytes from the file, from 0x1f1; nil for an ELF64 vmlinux
	cmdline    uint64
	cmdlineMax uint32 // written to cmdline_size when hdr is nil
	initrd     uint64
	initrdSize uint64
	rsdp       uint64 // ACPI RSDP address; 0: none
	e820       []E820Entry
}

// encode builds the 4 KiB zero page. Fields written: the copied setup header;
// boot_flag and header magic, kernel_alignment and cmdline_size when there is
// no header to copy (ELF64, as Firecracker does); vid_mode 0xffff ("normal");
// type_of_loader 0xff; cmd_line_ptr and ramdisk_image/size with their high
// halves in ext_cmd_line_ptr and ext_ramdisk_image/size; e820_entries and
// e820_table; acpi_rsdp_addr (0 without ACPI tables: the kernel then scans
// for an RSDP and finds none, and uses the MP table). CAN_USE_HEAP is
// cleared and heap_end_ptr left 0: the heap belongs to the 16-bit setup
// code, which the 64-bit entry skips. Everything else is zero, including
// the sentinel byte at 0x1ef.
func (z *zeroPage) encode() ([]byte, error) {
	if len(z.e820) > MaxE820 {
		return nil, bad(ErrTooBig, "memory map has %d entries; boot_params holds %d", len(z.e820), MaxE820)
	}
	if len(z.hdr) > offHdrMax-offSetupHeader {
		return nil, bad(ErrMalformed, "setup header of %d bytes overruns boot_params", len(z.hdr))
	}
	b := make([]byte, zeroPageSize)
	le := binary.LittleEndian
	if z.hdr != nil {
		copy(b[offSetupHeader:], z.hdr)
	} else {
		le.PutUint16(b[offBootFlag:], bootFlagMagic)
		le.PutUint32(b[offHeader:], hdrMagic)
		le.PutUint32(b[offKernelAlignment:], 0x1000000)
		le.PutUint32(b[offCmdlineSize:], z.cmdlineMax)
	}
	le.PutUint16(b[offVidMode:], vidModeNormal)
	b[offTypeOfLoader] = loaderUnknown
	b[offLoadFlags] &^= canUseHeap
	le.PutUint16(b[offHeapEndPtr:], 0)
	le.PutUint32(b[offCmdLinePtr:], uint32(z.cmdline))
	le.PutUint32(b[offExtCmdLinePtr:], uint32(z.cmdline>>32))
	le.PutUint32(b[offRamdiskImage:], uint32(z.initrd))
	le.PutUint32(b[offExtRamdiskImage:], uint32(z.initrd>>32))
	le.PutUint32(b[offRamdiskSize:], uint32(z.initrdSize))
	le.PutUint32(b[offExtRamdiskSize:], uint32(z.initrdSize>>32))
	le.PutUint64(b[offACPIRSDPAddr:], z.rsdp)
	b[offE820Entries] = uint8(len(z.e820))
	for i, e := range z.e820 {
		putE820(b[offE820Table+i*e820EntrySize:], e)
	}
	return b, nil
}
