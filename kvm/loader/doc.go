// Package loader puts a kernel into guest memory and says how to start it.
//
// Load detects the kernel format, loads the kernel, the command line and the
// initrd, writes the boot structures the kernel expects, and returns a *Boot:
// the complete entry state of vCPU 0 (mode, RIP/RSP/RSI/RBX, RFLAGS, CR0, CR3,
// CR4, EFER, GDTR and the CS/DS/TR segments as values), which the VMM copies
// into KVM's regs and sregs. The other vCPUs are started by the kernel through
// INIT/SIPI and find themselves in the MP table. All guest memory is touched
// through *guestmem.Memory; file contents are read straight into bounded views
// of it.
//
// # Formats and boot flows
//
//   - bzImage (Documentation/arch/x86/boot.rst): recognised by "HdrS" at
//     0x202; requires boot protocol 2.12+ with XLF_KERNEL_64 and LOADED_HIGH.
//     The protected-mode kernel (the file from (setup_sects+1)*512, with
//     setup_sects 0 meaning 4) is loaded at 1 MiB, the setup header is copied
//     into boot_params, and vCPU 0 starts in 64-bit mode at 1 MiB + 0x200 with
//     RSI = boot_params. The kernel decompresses itself to pref_address (or
//     its load address aligned to kernel_alignment, when higher) and needs
//     init_size bytes from there: Load checks this fits in RAM.
//   - PVH (xen/include/public/arch-x86/hvm/start_info.h): an ELF32 or ELF64
//     with the XEN_ELFNOTE_PHYS32_ENTRY note (type 18, owner "Xen"), looked
//     for in PT_NOTE segments and then SHT_NOTE sections. PT_LOAD segments are
//     loaded at p_paddr (p_memsz beyond p_filesz zeroed); vCPU 0 starts in
//     32-bit protected mode, paging off, at the note's address with EBX =
//     hvm_start_info.
//   - ELF64 without the note (a vmlinux): loaded the same way and started
//     through the 64-bit boot protocol at its physical e_entry, with a
//     boot_params whose setup header Load synthesises (as Firecracker does).
//
// # Guest memory written (docs/machine.md)
//
//	0x00500  GDT: null, 0x08 32-bit code (PVH), 0x10 64-bit code (__BOOT_CS),
//	         0x18 data (__BOOT_DS), 0x20 TSS (16-byte long-mode descriptor)
//	0x06000  PVH: hvm_start_info v1, then the module list (the initrd, no
//	         cmdline), then the memory map; 56 + 32 + 24*n bytes, n <= 128
//	0x07000  64-bit entry: boot_params (zero page), 4 KiB
//	0x08ff0  initial RSP (the page below the page tables)
//	0x09000  64-bit entry: PML4; 0xa000 PDPT; 0xb000-0xefff four page
//	         directories identity-mapping [0, 4 GiB) with 2 MiB pages; CR3 = 0x9000
//	0x20000  command line, NUL-terminated (at most cmdline_size bytes for a
//	         bzImage, 64 KiB - 1 otherwise)
//	0x9fc00  MP floating pointer, then the MP configuration table (EBDA)
//	1 MiB    bzImage protected-mode kernel; ELF kernels go at their p_paddr
//	         (never over the structures above, nor below 4 KiB)
//	top      initrd: page-aligned, as high as possible below the end of RAM
//	         contiguous from 1 MiB (at most the MMIO gap at 3 GiB) and, for a
//	         bzImage, below initrd_addr_max; above the kernel (for a bzImage,
//	         above the run address plus init_size)
//
// The e820 map given to the guest (boot_params.e820_table or the PVH memory
// map) is Config.E820, by default E820(mem.Ranges()): RAM [0, 0x9fc00), the
// EBDA [0x9fc00, 0xa0000) and the legacy hole [0xa0000, 0x100000) reserved,
// then RAM. The boot structures below 1 MiB stay RAM: the kernel reads them
// before it allocates memory.
//
// # MP table
//
// Intel MP spec 1.4: floating pointer at 0x9fc00 (where Linux's scan of the
// last KiB of base memory finds it), configuration table right after, both in
// the 1 KiB EBDA. It has one processor entry per vCPU (APIC ID = index, vCPU 0
// the BSP), the ISA bus, one I/O APIC (ID = number of vCPUs, 0xfec00000), ISA
// IRQ i routed to I/O APIC pin i for i < 24 (conforming: edge, active high,
// which the virtio-mmio devices' IRQs 5+ are), ExtINT to LINT0 and NMI to
// LINT1. That is 44 + 20*n + 28*8 bytes after the 16-byte pointer, so at most
// MaxCPUs = 37 vCPUs fit; more is ErrTooManyCPUs.
//
// # ACPI
//
// The loader writes no ACPI tables (package acpi builds them, the machine
// copies them to 0xe0000); when Config.RSDP is set it passes the RSDP's
// address in boot_params.acpi_rsdp_addr (offset 0x70, boot protocol 2.14)
// and in hvm_start_info.rsdp_paddr. Otherwise both are 0.
//
// # Setup header decoding
//
// The bzImage setup header is decoded with gokvm's bootparam.New and its
// packed SetupHeader struct (TestGokvmSetupHeaderOffsets checks every field
// against boot.rst's offsets). gokvm's BootParam type and Bytes are not used:
// boot_params is encoded here by explicit offsets.
//
// # Errors
//
// Every error is one line naming the file ("kernel bzImage: needs 46 MiB
// ...", "initrd initrd.img (200 MiB) does not fit ...") and wraps one of the
// sentinels (ErrUnknownFormat, ErrUnsupported, ErrMalformed, ErrTooBig,
// ErrTooManyCPUs, ErrConfig) or the reader's I/O error. Every offset, size
// and count read from a file is checked, with overflow-safe arithmetic,
// before it is used; FuzzLoadKernel holds Load to that.
//
// Concurrency: Load and WriteMPTable write guest memory and must not run
// while vCPUs do; nothing here keeps state between calls.
package loader
