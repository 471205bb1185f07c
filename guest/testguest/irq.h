/*
 * irq.h - testguest.irq=1: virtio completions by interrupt.
 *
 * One device interrupt, routed IOAPIC pin -> LAPIC -> IDT vector
 * TG_IRQ_VECTOR, whose handler runs at CPL0 (boot.S's irq_entry calls
 * tg_irq()). The rest of the guest stays at CPL3, now with RFLAGS.IF=1.
 *
 * Who touches what:
 *  - tg_irq() (CPL0) owns the device's InterruptStatus and InterruptACK: it
 *    reads and acknowledges until the status reads 0, ORs what it saw into
 *    a word irq_take_status() hands to CPL3, counts the interrupt and sends
 *    the LAPIC EOI. Nothing else reads InterruptStatus in irq mode.
 *  - CPL3 (vsock.c, modes.c) never sleeps on the wait port; when a pass over
 *    the rings finds nothing it waits for the interrupt count to move
 *    (irq_wait), then looks at the rings again: an interrupt only says
 *    "look". The count is sampled before each pass, so an interrupt that
 *    arrives during the pass is not lost.
 *
 * The interrupt controllers are programmed from CPL3 through MMIO (the
 * identity map is user-accessible): the LAPIC at 0xfee00000 and the IOAPIC
 * at 0xfec00000 (82093AA interface), as both microvm (docs/machine.md) and
 * QEMU's microvm machine place them. The device's IRQ number from
 * virtio_mmio.device= is the IOAPIC pin (identity, as their MP tables say).
 */
#ifndef TG_IRQ_H
#define TG_IRQ_H

/* IDT vectors (boot.S includes this file for them). */
#define TG_IRQ_VECTOR 0x30	  /* the device interrupt, DPL0 gate -> tg_irq() */
#define TG_IRQ_ENABLE_VECTOR 0x31 /* DPL3 gate: `int` it to run CPL3 with IF=1 */
#define TG_SPURIOUS_VECTOR 0xff	  /* LAPIC spurious vector: reaches the exit-9 stub */

#define LAPIC_BASE 0xfee00000ull
#define IOAPIC_BASE 0xfec00000ull

/* LAPIC registers (Intel SDM vol. 3, 11.4.1). */
#define LAPIC_ID 0x020
#define LAPIC_VERSION 0x030
#define LAPIC_TPR 0x080
#define LAPIC_EOI 0x0b0
#define LAPIC_SVR 0x0f0
#define LAPIC_LVT_LINT0 0x350
#define LAPIC_SVR_ENABLE 0x100
#define LAPIC_LVT_MASKED 0x10000

/* IOAPIC (82093AA): IOREGSEL, IOWIN, and the indirect registers. */
#define IOAPIC_REGSEL 0x00
#define IOAPIC_WIN 0x10
#define IOAPIC_REG_VERSION 0x01
#define IOAPIC_REG_REDTBL 0x10 /* entry n: low 0x10+2n, high 0x11+2n */
#define IOAPIC_RTE_MASKED (1u << 16)
#define IOAPIC_RTE_LEVEL (1u << 15)
#define IOAPIC_RTE_ACTIVE_LOW (1u << 13)
#define IOAPIC_RTE_LOGICAL (1u << 11)

/* Legacy 8259 data ports (OCW1: interrupt mask). */
#define PORT_PIC1_DATA 0x21
#define PORT_PIC2_DATA 0xa1

#ifndef __ASSEMBLER__

#include "virtio.h"
#include <stdbool.h>
#include <stdint.h>

/* Set (to 1) once irq_start() has armed the handler; boot.S's gates send
 * vectors TG_IRQ_VECTOR and TG_IRQ_ENABLE_VECTOR to the exit-9 stub while it
 * is 0, so the default polled mode behaves as if they did not exist. */
extern volatile uint32_t tg_irq_armed;

/*
 * Fail (exit 8) unless this CPU can take interrupts. boot.S iretqs to CPL3
 * with IOPL 3; a PVM host runs guest CPL3 natively with IOPL 0 (and IF 1)
 * whatever the guest set, and cannot deliver interrupts to a guest that is
 * not PVM-enlightened (the vCPU triple-faults). So CPL3 reading IOPL != 3
 * means such a host.
 */
void irq_check_cpu(void);

/*
 * Route dev->irq to TG_IRQ_VECTOR on this CPU: mask the 8259s and LAPIC
 * LINT0, enable the LAPIC (spurious vector TG_SPURIOUS_VECTOR), program the
 * IOAPIC entry (fixed, physical destination = our LAPIC id, edge, active
 * high, unmasked), arm the handler and set RFLAGS.IF through boot.S's gate.
 * Call before the device is reset and started. Exits 8 when there is no
 * LAPIC or IOAPIC or the pin does not exist.
 */
void irq_start(const struct virtio_dev *dev);

/* Interrupts taken so far (by tg_irq). */
uint64_t irq_count(void);
/* Interrupts whose InterruptStatus read 0 (already acknowledged). */
uint64_t irq_empty_count(void);

/* InterruptStatus bits tg_irq() acknowledged since the last call. */
uint32_t irq_take_status(void);

/*
 * Wait until irq_count() differs from seen or max_tsc TSC ticks passed.
 * Returns true when an interrupt came.
 */
bool irq_wait(uint64_t seen, uint64_t max_tsc);

/* The handler body, at CPL0 with IF=0 (boot.S's irq_entry). */
void tg_irq(void);

#endif /* __ASSEMBLER__ */

#endif
