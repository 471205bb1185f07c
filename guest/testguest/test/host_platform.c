/* host_platform.c - platform.h for HOST_TEST builds, over the fake machine. */
#include "fake.h"
#include "lib.h"
#include "platform.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint8_t fake_lowmem[0x100000];
uint64_t fake_tsc;
static uint8_t cmos_index;

void outb(uint16_t port, uint8_t v)
{
	if (port == PORT_COM1) {
		fputc(v, stdout);
		if (v == '\n')
			fflush(stdout);
	} else if (port == PORT_DEBUG_EXIT) {
		char why[256];
		fflush(stdout);
		if (v == 0 && fake_final_check(why, sizeof(why)) != 0)
			host_fail("guest exited 0 but the host side disagrees: %s", why);
		_exit(v);
	} else if (port == PORT_CMOS_INDEX) {
		cmos_index = v;
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

uint32_t mmio_read32(uint64_t addr)
{
	if (addr >= FAKE_MMIO_BASE && addr < FAKE_MMIO_BASE + FAKE_MMIO_SIZE)
		return fake_mmio_read(addr - FAKE_MMIO_BASE);
	return 0xffffffffu;
}

void mmio_write32(uint64_t addr, uint32_t v)
{
	if (addr >= FAKE_MMIO_BASE && addr < FAKE_MMIO_BASE + FAKE_MMIO_SIZE)
		fake_mmio_write(addr - FAKE_MMIO_BASE, v);
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
