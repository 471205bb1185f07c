/*
 * mem.h - guest-physical memory: which ranges may be read, and a bump heap.
 *
 * Pointers handed over by the loader (start_info, its memory map, the
 * command line) are trusted to be in memory and only checked to be mapped.
 * Pointers found inside firmware tables are not: phys_map() accepts a range
 * only inside low memory (below 1 MiB) or one RAM/ACPI range of the memory
 * map, so a bad table can never make us read an MMIO page.
 */
#ifndef TG_MEM_H
#define TG_MEM_H

#include <stddef.h>
#include <stdint.h>

#define MEM_MAX_RANGES 32

/* Allow reads of [base, base+len). Adjacent/overlapping ranges merge. */
void mem_allow(uint64_t base, uint64_t len);
/* Forget every allowed range (tests). */
void mem_reset(void);
/* [pa, pa+len) inside one allowed range? Then its pointer, else NULL. */
const void *phys_map(uint64_t pa, uint64_t len);
/* [pa, pa+len) below PHYS_LIMIT? Then its pointer, else NULL. */
const void *phys_map_loader(uint64_t pa, uint64_t len);

/* Heap: [base, end), page granular. heap_alloc returns zeroed memory aligned
 * to align (a power of two), or NULL when it does not fit. */
void heap_init(uint64_t base, uint64_t end);
void *heap_alloc(size_t n, size_t align);
uint64_t heap_free_bytes(void);

#endif
