/* irq.c - testguest.irq=1: LAPIC/IOAPIC set-up, the CPL0 handler, the wait. */
#include "irq.h"
#include "console.h"
#include "lib.h"
#include "platform.h"

#define RFLAGS_IOPL_SHIFT 12
/* Reads of InterruptStatus per interrupt, at most: until it reads 0, so the
 * device's line drops and its next interrupt is a new edge. */
#define IRQ_ACK_TRIES 4

volatile uint32_t tg_irq_armed;

/* Shared between tg_irq() (CPL0, IF=0) and CPL3 on the one CPU: CPL3 only
 * reads count/empty (aligned 64-bit loads cannot tear) and takes status with
 * one atomic exchange, so no update can be lost between them. */
static struct {
	struct virtio_dev dev;
	volatile uint64_t count, empty;
	uint32_t status;
} irq;

static uint32_t lapic_read(uint32_t reg)
{
	return mmio_read32(LAPIC_BASE + reg);
}

static void lapic_write(uint32_t reg, uint32_t v)
{
	mmio_write32(LAPIC_BASE + reg, v);
}

static uint32_t ioapic_read(uint32_t reg)
{
	mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, reg);
	return mmio_read32(IOAPIC_BASE + IOAPIC_WIN);
}

static void ioapic_write(uint32_t reg, uint32_t v)
{
	mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, reg);
	mmio_write32(IOAPIC_BASE + IOAPIC_WIN, v);
}

void irq_check_cpu(void)
{
	unsigned iopl = (unsigned)(read_rflags() >> RFLAGS_IOPL_SHIFT) & 3;
	if (iopl != 3)
		tg_die(EXIT_INTERNAL,
		       "irq mode unsupported: CPL3 runs with IOPL %u, not the 3 boot.S set: a PVM "
		       "host, which cannot deliver interrupts to this guest",
		       iopl);
}

void irq_start(const struct virtio_dev *dev)
{
	uint32_t ver = lapic_read(LAPIC_VERSION);
	/* 0x1X: an integrated APIC (SDM 11.4.8); all ones: nothing there. */
	if (ver == 0xffffffffu || (ver & 0xf0) != 0x10)
		tg_die(EXIT_INTERNAL, "irq: no local APIC at 0x%lx (version 0x%x)",
		       (uint64_t)LAPIC_BASE, ver);
	uint32_t apic_id = lapic_read(LAPIC_ID) >> 24;

	uint32_t iover = ioapic_read(IOAPIC_REG_VERSION);
	uint32_t max_pin = (iover >> 16) & 0xff;
	if (iover == 0xffffffffu || (iover & 0xff) < 0x11)
		tg_die(EXIT_INTERNAL, "irq: no IOAPIC at 0x%lx (version 0x%x)",
		       (uint64_t)IOAPIC_BASE, iover);
	if (dev->irq > max_pin)
		tg_die(EXIT_INTERNAL, "irq: device irq %u is not a pin of the IOAPIC at 0x%lx (0-%u)",
		       dev->irq, (uint64_t)IOAPIC_BASE, max_pin);

	/* Nothing but our pin may interrupt: the 8259s (where there are any;
	 * QEMU's are live with IRQ0 ticking, and reach the LAPIC through LINT0
	 * as ExtINT) are masked at both ends. */
	outb(PORT_PIC1_DATA, 0xff);
	outb(PORT_PIC2_DATA, 0xff);
	lapic_write(LAPIC_LVT_LINT0, LAPIC_LVT_MASKED);
	lapic_write(LAPIC_TPR, 0);
	lapic_write(LAPIC_SVR, LAPIC_SVR_ENABLE | TG_SPURIOUS_VECTOR);

	irq.dev = *dev;
	irq.count = irq.empty = 0;
	irq.status = 0;
	tg_irq_armed = 1;

	/* High word (destination) first, then the low word unmasks. */
	uint32_t reg = IOAPIC_REG_REDTBL + 2 * dev->irq;
	ioapic_write(reg + 1, apic_id << 24);
	ioapic_write(reg, TG_IRQ_VECTOR); /* fixed, physical, active high, edge, unmasked */

	cpu_enable_interrupts();
	tg_log("irq: IOAPIC pin %u -> LAPIC %u vector 0x%x, interrupts on", dev->irq, apic_id,
	       TG_IRQ_VECTOR);
}

uint64_t irq_count(void)
{
	return irq.count;
}

uint64_t irq_empty_count(void)
{
	return irq.empty;
}

uint32_t irq_take_status(void)
{
	return __atomic_exchange_n(&irq.status, 0, __ATOMIC_SEQ_CST);
}

bool irq_wait(uint64_t seen, uint64_t max_tsc)
{
	uint64_t start = rdtsc();
	while (irq.count == seen) {
		if (rdtsc() - start >= max_tsc)
			return false;
		cpu_spin_wait();
	}
	return true;
}

void tg_irq(void)
{
	uint32_t seen = 0;
	for (int i = 0; i < IRQ_ACK_TRIES; i++) {
		uint32_t isr = virtio_ack_interrupt(&irq.dev);
		if (!isr)
			break;
		seen |= isr;
	}
	/* CPL3 is stopped while we run: plain read-modify-writes suffice. */
	irq.status |= seen;
	if (!seen)
		irq.empty++;
	irq.count++;
	lapic_write(LAPIC_EOI, 0);
}
