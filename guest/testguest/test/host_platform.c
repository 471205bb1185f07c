/* host_platform.c - platform.h for HOST_TEST builds, over the fake machine. */
#include "fake.h"
#include "irq.h"
#include "lib.h"
#include "platform.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint8_t fake_lowmem[0x100000];
uint64_t fake_tsc;
static uint8_t cmos_index;
static uint8_t pic_mask[2];

/* ---- interrupts: one CPU's IF, a LAPIC, an IOAPIC ---- */

static struct {
	bool cpu_if;	 /* RFLAGS.IF at CPL3 */
	bool in_handler; /* delivering: IF=0 until the "iretq" */
	uint32_t svr, tpr, lint0;
	bool pending, in_service; /* one vector's IRR and ISR bits */
	uint32_t pending_vector, in_service_vector;
	uint32_t regsel;
	uint64_t rte[FAKE_IOAPIC_PINS];
	uint64_t raised, delivered, eois;
} X = {
	.lint0 = 0x700, /* ExtINT, unmasked: how QEMU and KVM reset the BSP's LINT0 */
	.rte = { [0 ... FAKE_IOAPIC_PINS - 1] = IOAPIC_RTE_MASKED }, /* 82093AA reset */
};

static void fake_irq_deliver(void);
/* main.c: what boot.S's exit-9 stub calls. */
__attribute__((noreturn)) void tg_exception(uint64_t vector, const uint64_t *frame);

void fake_irq_raise(void)
{
	X.raised++;
	if (hcfg.irq_drop || hcfg.irq_pin >= FAKE_IOAPIC_PINS)
		return;
	uint64_t e = X.rte[hcfg.irq_pin];
	if (e & IOAPIC_RTE_MASKED)
		return; /* an edge on a masked pin is lost (82093AA) */
	uint32_t dest = (uint32_t)(e >> 56);
	if (e & (0x7u << 8))
		host_fail("IOAPIC pin %u: delivery mode %llu, want fixed", hcfg.irq_pin,
			  (unsigned long long)(e >> 8) & 7);
	if (e & (IOAPIC_RTE_LOGICAL | IOAPIC_RTE_LEVEL | IOAPIC_RTE_ACTIVE_LOW))
		host_fail("IOAPIC pin %u: entry 0x%llx is not physical, edge, active high",
			  hcfg.irq_pin, (unsigned long long)e);
	if (dest != FAKE_APIC_ID)
		host_fail("IOAPIC pin %u: destination %u, the CPU's LAPIC id is %u", hcfg.irq_pin,
			  dest, FAKE_APIC_ID);
	X.pending = true;
	X.pending_vector = (uint32_t)(e & 0xff);
}

bool fake_in_irq_handler(void)
{
	return X.in_handler;
}

/* What boot.S's IDT does with a vector: irq_entry (armed) or the exit-9
 * stub. */
static void take_vector(uint32_t vec)
{
	if (vec == TG_IRQ_VECTOR && tg_irq_armed) {
		tg_irq();
		return;
	}
	static uint64_t frame[5];
	tg_exception(vec, frame);
}

static void fake_irq_deliver(void)
{
	while (X.cpu_if && !X.in_handler && (X.svr & LAPIC_SVR_ENABLE) && X.pending &&
	       !X.in_service) {
		X.pending = false;
		X.in_service = true;
		X.in_service_vector = X.pending_vector;
		X.in_handler = true;
		X.delivered++;
		take_vector(X.in_service_vector);
		X.in_handler = false;
		if (X.in_service)
			host_fail("interrupt handler returned without an EOI");
	}
}

static uint32_t lapic_read(uint64_t off)
{
	switch (off) {
	case LAPIC_ID:
		return (uint32_t)FAKE_APIC_ID << 24;
	case LAPIC_VERSION:
		return 0x00050014; /* integrated APIC, 6 LVT entries */
	case LAPIC_TPR:
		return X.tpr;
	case LAPIC_SVR:
		return X.svr;
	case LAPIC_LVT_LINT0:
		return X.lint0;
	}
	return 0;
}

static void lapic_write(uint64_t off, uint32_t v)
{
	switch (off) {
	case LAPIC_TPR:
		X.tpr = v;
		break;
	case LAPIC_SVR:
		X.svr = v;
		break;
	case LAPIC_LVT_LINT0:
		X.lint0 = v;
		break;
	case LAPIC_EOI:
		if (!X.in_service)
			host_fail("LAPIC EOI with no interrupt in service");
		X.in_service = false;
		X.eois++;
		break;
	default:
		host_fail("LAPIC write 0x%x to register 0x%llx", v, (unsigned long long)off);
	}
}

static uint32_t ioapic_read(uint64_t off)
{
	if (off == IOAPIC_REGSEL)
		return X.regsel;
	if (off != IOAPIC_WIN)
		return 0;
	if (X.regsel == IOAPIC_REG_VERSION)
		return (FAKE_IOAPIC_PINS - 1) << 16 | 0x11;
	uint32_t r = X.regsel - IOAPIC_REG_REDTBL;
	if (X.regsel >= IOAPIC_REG_REDTBL && r / 2 < FAKE_IOAPIC_PINS)
		return (uint32_t)(X.rte[r / 2] >> (r % 2 ? 32 : 0));
	return 0;
}

static void ioapic_write(uint64_t off, uint32_t v)
{
	if (off == IOAPIC_REGSEL) {
		X.regsel = v & 0xff;
		return;
	}
	if (off != IOAPIC_WIN)
		host_fail("IOAPIC write to offset 0x%llx", (unsigned long long)off);
	uint32_t r = X.regsel - IOAPIC_REG_REDTBL;
	if (X.regsel < IOAPIC_REG_REDTBL || r / 2 >= FAKE_IOAPIC_PINS)
		host_fail("IOAPIC write to register 0x%x", X.regsel);
	uint64_t *e = &X.rte[r / 2];
	if (r % 2)
		*e = (*e & 0xffffffffull) | (uint64_t)v << 32;
	else
		*e = (*e & ~0xffffffffull) | v;
}

int fake_irq_final_check(char *why, size_t n)
{
	if (!tg_irq_armed)
		return 0;
	if (!hcfg.irq_drop && X.delivered == 0) {
		snprintf(why, n, "irq mode: no interrupt delivered (%llu raised)",
			 (unsigned long long)X.raised);
		return -1;
	}
	if (X.eois != X.delivered) {
		snprintf(why, n, "irq mode: %llu interrupts, %llu EOIs",
			 (unsigned long long)X.delivered, (unsigned long long)X.eois);
		return -1;
	}
	if (pic_mask[0] != 0xff || pic_mask[1] != 0xff || !(X.lint0 & LAPIC_LVT_MASKED)) {
		snprintf(why, n, "irq mode: 8259 masks 0x%x 0x%x, LINT0 0x%x", pic_mask[0],
			 pic_mask[1], X.lint0);
		return -1;
	}
	return 0;
}

uint64_t read_rflags(void)
{
	/* boot.S sets IOPL 3; PVM shows IOPL 0 and IF 1 (docs/testguest.md). */
	if (hcfg.pvm)
		return 0x246;
	return 0x3046 | (X.cpu_if ? 0x200 : 0);
}

void cpu_enable_interrupts(void)
{
	if (!tg_irq_armed) {
		take_vector(TG_IRQ_ENABLE_VECTOR);
		return;
	}
	X.cpu_if = true;
	fake_irq_deliver();
}

void cpu_spin_wait(void)
{
	fake_idle(10);
	fake_irq_deliver();
}

void outb(uint16_t port, uint8_t v)
{
	if (port == PORT_COM1) {
		fputc(v, stdout);
		if (v == '\n')
			fflush(stdout);
	} else if (port == PORT_DEBUG_EXIT) {
		char why[256];
		fflush(stdout);
		if (v == 0 && (fake_final_check(why, sizeof(why)) != 0 ||
			       fake_irq_final_check(why, sizeof(why)) != 0))
			host_fail("guest exited 0 but the host side disagrees: %s", why);
		_exit(v);
	} else if (port == PORT_CMOS_INDEX) {
		cmos_index = v;
	} else if (port == PORT_PIC1_DATA || port == PORT_PIC2_DATA) {
		pic_mask[port == PORT_PIC2_DATA] = v;
	}
}

uint8_t inb(uint16_t port)
{
	if (port == PORT_COM1 + 5)
		return 0x20; /* THR empty */
	if (port == PORT_CMOS_DATA)
		return 0; /* no memory size: main.c must use the memory map */
	return 0xff;
}

void outl(uint16_t port, uint32_t v)
{
	if (port == PORT_PV_WAIT)
		fake_wait(v);
}

/* An interrupt can be taken after any MMIO access. */
uint32_t mmio_read32(uint64_t addr)
{
	uint32_t v = 0xffffffffu;
	if (addr >= FAKE_MMIO_BASE && addr < FAKE_MMIO_BASE + FAKE_MMIO_SIZE)
		v = fake_mmio_read(addr - FAKE_MMIO_BASE);
	else if (addr >= LAPIC_BASE && addr < LAPIC_BASE + 0x1000)
		v = lapic_read(addr - LAPIC_BASE);
	else if (addr >= IOAPIC_BASE && addr < IOAPIC_BASE + 0x20)
		v = ioapic_read(addr - IOAPIC_BASE);
	fake_irq_deliver();
	return v;
}

void mmio_write32(uint64_t addr, uint32_t v)
{
	if (addr >= FAKE_MMIO_BASE && addr < FAKE_MMIO_BASE + FAKE_MMIO_SIZE)
		fake_mmio_write(addr - FAKE_MMIO_BASE, v);
	else if (addr >= LAPIC_BASE && addr < LAPIC_BASE + 0x1000)
		lapic_write(addr - LAPIC_BASE, v);
	else if (addr >= IOAPIC_BASE && addr < IOAPIC_BASE + 0x20)
		ioapic_write(addr - IOAPIC_BASE, v);
	fake_irq_deliver();
}

uint64_t rdtsc(void)
{
	fake_tsc += 1000; /* 1 us per look at the clock */
	return fake_tsc;
}

/* boot.S stores the CPL0 reading of CPUID 0x40000010 here; the host build
 * has no boot.S, so the fake machine leaves it 0 and timer.c falls back to
 * cpuid() below. */
uint32_t hv_tsc_khz;

void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
	(void)sub;
	r[0] = r[1] = r[2] = r[3] = 0;
	if (leaf == 0)
		r[0] = 1;
	else if (leaf == 1)
		r[2] = 1u << 31; /* hypervisor */
	else if (leaf == 0x40000000)
		r[0] = 0x40000010;
	else if (leaf == 0x40000010)
		r[0] = (uint32_t)(FAKE_TSC_HZ / 1000);
}

void *phys_to_virt(uint64_t pa)
{
	if (pa < sizeof(fake_lowmem))
		return fake_lowmem + pa;
	return (void *)(uintptr_t)pa;
}

uint64_t virt_to_phys(const void *p)
{
	const uint8_t *b = p;
	if (b >= fake_lowmem && b < fake_lowmem + sizeof(fake_lowmem))
		return (uint64_t)(b - fake_lowmem);
	return (uint64_t)(uintptr_t)p;
}

__attribute__((noreturn)) void tg_exit(int code)
{
	outb(PORT_DEBUG_EXIT, (uint8_t)code);
	abort();
}

/* The "image": the heap starts here (main.c: heap = RAM after the image). */
static uint8_t *heap_area;
#define HOST_HEAP (64u << 20)

uint64_t host_image_end(void);
uint64_t host_image_end(void)
{
	if (!heap_area) {
		heap_area = aligned_alloc(4096, HOST_HEAP);
		if (!heap_area)
			abort();
	}
	return (uint64_t)(uintptr_t)heap_area;
}
