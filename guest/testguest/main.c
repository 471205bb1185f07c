/*
 * main.c - CPL3 entry: read hvm_start_info, set up memory, parse the command
 * line and run the selected mode.
 */
#include "cmdline.h"
#include "console.h"
#include "irq.h"
#include "lib.h"
#include "mem.h"
#include "modes.h"
#include "platform.h"
#include "timer.h"

#define HVM_START_MAGIC 0x336ec578u
#define E820_RAM 1
#define E820_ACPI 3
#define E820_NVS 4
#define MAX_MEMMAP 128
#define CMDLINE_MAX 4096

/* PVH boot ABI (xen/include/public/arch-x86/hvm/start_info.h). */
struct hvm_start_info {
	uint32_t magic;
	uint32_t version;
	uint32_t flags;
	uint32_t nr_modules;
	uint64_t modlist_paddr;
	uint64_t cmdline_paddr;
	uint64_t rsdp_paddr;
	uint64_t memmap_paddr; /* version >= 1 */
	uint32_t memmap_entries;
	uint32_t reserved;
};
_Static_assert(sizeof(struct hvm_start_info) == 56, "hvm_start_info layout");

struct hvm_memmap_entry {
	uint64_t addr;
	uint64_t size;
	uint32_t type;
	uint32_t reserved;
};
_Static_assert(sizeof(struct hvm_memmap_entry) == 24, "hvm_memmap_entry layout");

static char cmdline[CMDLINE_MAX];
static struct tg_config config;
static struct boot_info boot;

#ifndef HOST_TEST
extern char __image_start[], __image_end[];
#endif

static uint8_t cmos_read(uint8_t reg)
{
	outb(PORT_CMOS_INDEX, reg);
	return inb(PORT_CMOS_DATA);
}

/* End of RAM from the CMOS, for loaders that pass no memory map. */
static uint64_t cmos_ram_end(void)
{
	uint64_t above16m = (uint64_t)cmos_read(0x34) | (uint64_t)cmos_read(0x35) << 8;
	if (above16m && above16m != 0xffff)
		return (16ull << 20) + (above16m << 16);
	uint64_t ext_kib = (uint64_t)cmos_read(0x30) | (uint64_t)cmos_read(0x31) << 8;
	if (ext_kib && ext_kib != 0xffff)
		return (1ull << 20) + (ext_kib << 10);
	return 0;
}

static void setup_memory(const struct hvm_start_info *si, uint64_t img_end)
{
	/* Low memory (BDA, EBDA, BIOS area) is always readable for tables. */
	mem_allow(0, 0x100000);

	uint64_t heap_end = 0;
	uint32_t n = si->version >= 1 ? si->memmap_entries : 0;
	const struct hvm_memmap_entry *mm = NULL;
	if (n) {
		if (n > MAX_MEMMAP)
			n = MAX_MEMMAP;
		mm = phys_map_loader(si->memmap_paddr, (uint64_t)n * sizeof(*mm));
	}
	if (mm) {
		for (uint32_t i = 0; i < n; i++) {
			struct hvm_memmap_entry e = mm[i];
			if (e.type == E820_RAM || e.type == E820_ACPI || e.type == E820_NVS)
				mem_allow(e.addr, e.size);
			if (e.type == E820_RAM && e.addr <= img_end && e.size > img_end - e.addr)
				heap_end = e.addr + e.size;
		}
		boot.memmap_entries = n;
	} else {
		uint64_t end = cmos_ram_end();
		if (end > img_end) {
			heap_end = end;
			mem_allow(0x100000, end - 0x100000);
		}
	}
	/* Leave the top of the map alone (the MMIO gap starts at 3 GiB at the
	 * latest) and keep to what the 4 GiB identity map covers. */
	if (heap_end > HEAP_LIMIT)
		heap_end = HEAP_LIMIT;
	if (heap_end <= img_end)
		heap_end = img_end + (16ull << 20); /* nothing known: hope for 16 MiB */
	heap_init(img_end, heap_end);
	boot.heap_bytes = heap_free_bytes();
}

static void copy_cmdline(uint64_t pa)
{
	cmdline[0] = '\0';
	if (!pa)
		return;
	for (size_t i = 0; i + 1 < sizeof(cmdline); i++) {
		const char *c = phys_map_loader(pa + i, 1);
		if (!c || !*c)
			return;
		cmdline[i] = *c;
		cmdline[i + 1] = '\0';
	}
}

void tg_main(uint64_t start_info_pa);

void tg_main(uint64_t start_info_pa)
{
	con_init();
	timer_init();

	const struct hvm_start_info *si = phys_map_loader(start_info_pa, sizeof(*si));
	if (!si || si->magic != HVM_START_MAGIC)
		tg_die(EXIT_INTERNAL, "no PVH start info (ebx=0x%lx)", start_info_pa);

	uint64_t img_end;
#ifndef HOST_TEST
	img_end = virt_to_phys(__image_end);
#else
	img_end = host_image_end();
#endif
	setup_memory(si, img_end);
	copy_cmdline(si->cmdline_paddr);
	boot.rsdp_paddr = si->rsdp_paddr;
	boot.cmdline = cmdline;

	char err[160];
	if (cmdline_parse(cmdline, &config, err, sizeof(err)) != 0)
		tg_die(EXIT_INTERNAL, "bad command line: %s", err);
	if (config.irq)
		irq_check_cpu(); /* before anything could route an interrupt */
	run_mode(&config, &boot);
}

/* Called at CPL0 by boot.S's isr_common: nothing should ever get here. */
__attribute__((noreturn)) void tg_exception(uint64_t vector, const uint64_t *frame);

__attribute__((noreturn)) void tg_exception(uint64_t vector, const uint64_t *frame)
{
	/* Vectors that push an error code: #DF #TS #NP #SS #GP #PF #AC #CP
	 * #VC #SX. */
	bool has_err = vector == 8 || (vector >= 10 && vector <= 14) || vector == 17 ||
		       vector == 21 || vector == 29 || vector == 30;
	uint64_t err = has_err ? frame[0] : 0;
	const uint64_t *f = has_err ? frame + 1 : frame;
	tg_die(EXIT_EXCEPTION,
	       "unexpected exception or interrupt, vector %lu error 0x%lx rip 0x%lx cs 0x%lx "
	       "rflags 0x%lx rsp 0x%lx",
	       vector, err, f[0], f[1], f[2], f[3]);
}
