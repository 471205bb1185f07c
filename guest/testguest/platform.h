/*
 * platform.h - the only door to the hardware: port I/O, MMIO, the TSC, CPUID
 * and the physical-address view.
 *
 * The guest runs at CPL3 with IOPL=3 and an identity map of the first 4 GiB
 * (User bit set), so every primitive here is a plain user-mode instruction,
 * except cpu_enable_interrupts(), a software interrupt into boot.S.
 * A HOST_TEST build replaces them with functions from test/host_platform.c
 * that talk to a fake machine, so the rest of the code compiles unchanged
 * for a host-side harness.
 */
#ifndef TG_PLATFORM_H
#define TG_PLATFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Compiler barrier: x86 is TSO, so ring ordering only needs the compiler kept
 * in line, except store->load ordering, which needs mfence(). */
#define barrier() __asm__ __volatile__("" ::: "memory")

static inline void mfence(void)
{
	__asm__ __volatile__("mfence" ::: "memory");
}

static inline void cpu_relax(void)
{
	__asm__ __volatile__("pause" ::: "memory");
}

/* Well-known ports (docs/machine.md). */
#define PORT_COM1 0x3f8
#define PORT_DEBUG_EXIT 0xf4
#define PORT_PV_WAIT 0x600
#define PORT_CMOS_INDEX 0x70
#define PORT_CMOS_DATA 0x71

#ifndef HOST_TEST

static inline void outb(uint16_t port, uint8_t v)
{
	__asm__ __volatile__("outb %0, %1" : : "a"(v), "Nd"(port) : "memory");
}

static inline uint8_t inb(uint16_t port)
{
	uint8_t v;
	__asm__ __volatile__("inb %1, %0" : "=a"(v) : "Nd"(port) : "memory");
	return v;
}

static inline void outl(uint16_t port, uint32_t v)
{
	__asm__ __volatile__("outl %0, %1" : : "a"(v), "Nd"(port) : "memory");
}

static inline uint32_t mmio_read32(uint64_t addr)
{
	return *(volatile uint32_t *)(uintptr_t)addr;
}

static inline void mmio_write32(uint64_t addr, uint32_t v)
{
	*(volatile uint32_t *)(uintptr_t)addr = v;
}

static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;
	__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

static inline void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
	__asm__ __volatile__("cpuid"
			     : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3])
			     : "a"(leaf), "c"(sub));
}

/* RFLAGS as the CPU runs us (a PVM host shows IOPL 0 here: irq.h). */
static inline uint64_t read_rflags(void)
{
	uint64_t f;
	__asm__ __volatile__("pushfq; popq %0" : "=r"(f));
	return f;
}

/* irq mode: boot.S's DPL3 gate 0x31 (TG_IRQ_ENABLE_VECTOR) sets RFLAGS.IF in
 * the frame it iretqs through, so CPL3 continues with interrupts on. (A CPL3
 * `sti` would depend on IOPL, which PVM hosts do not honour.) */
static inline void cpu_enable_interrupts(void)
{
	__asm__ __volatile__("int $0x31" ::: "memory");
}

/* One round of an irq-mode wait loop. */
static inline void cpu_spin_wait(void)
{
	__asm__ __volatile__("pause" ::: "memory");
}

/* Identity map: a physical address below PHYS_LIMIT is its own pointer. */
static inline void *phys_to_virt(uint64_t pa)
{
	return (void *)(uintptr_t)pa;
}

static inline uint64_t virt_to_phys(const void *p)
{
	return (uint64_t)(uintptr_t)p;
}

/* boot.S maps [0, 4 GiB). */
#define PHYS_LIMIT 0x100000000ull
/* The heap stays below the MMIO gap (3 GiB at the latest). */
#define HEAP_LIMIT 0xc0000000ull

#else /* HOST_TEST */

void outb(uint16_t port, uint8_t v);
uint8_t inb(uint16_t port);
void outl(uint16_t port, uint32_t v);
uint32_t mmio_read32(uint64_t addr);
void mmio_write32(uint64_t addr, uint32_t v);
uint64_t rdtsc(void);
void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]);
uint64_t read_rflags(void);
void cpu_enable_interrupts(void);
void cpu_spin_wait(void);
void *phys_to_virt(uint64_t pa);
uint64_t virt_to_phys(const void *p);
#define PHYS_LIMIT (1ull << 47)
#define HEAP_LIMIT PHYS_LIMIT

#endif /* HOST_TEST */

#endif
