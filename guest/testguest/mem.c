/* mem.c - allowed physical ranges and the bump allocator. */
#include "mem.h"
#include "lib.h"
#include "platform.h"

static struct {
	uint64_t base, end; /* [base, end) */
} ranges[MEM_MAX_RANGES];
static int nranges;

static uint64_t heap_cur, heap_end;

void mem_reset(void)
{
	nranges = 0;
}

void mem_allow(uint64_t base, uint64_t len)
{
	if (len == 0 || base >= PHYS_LIMIT)
		return;
	uint64_t end = len > PHYS_LIMIT - base ? PHYS_LIMIT : base + len;
	/* Merge with every range it touches, then insert. */
	for (int i = 0; i < nranges;) {
		if (ranges[i].base <= end && base <= ranges[i].end) {
			base = MIN(base, ranges[i].base);
			end = MAX(end, ranges[i].end);
			ranges[i] = ranges[--nranges];
			i = 0;
			continue;
		}
		i++;
	}
	if (nranges < MEM_MAX_RANGES) {
		ranges[nranges].base = base;
		ranges[nranges].end = end;
		nranges++;
	}
}

const void *phys_map(uint64_t pa, uint64_t len)
{
	if (len == 0 || pa > UINT64_MAX - len)
		return NULL;
	for (int i = 0; i < nranges; i++)
		if (pa >= ranges[i].base && pa + len <= ranges[i].end)
			return phys_to_virt(pa);
	return NULL;
}

const void *phys_map_loader(uint64_t pa, uint64_t len)
{
	if (pa >= PHYS_LIMIT || len > PHYS_LIMIT - pa)
		return NULL;
	return phys_to_virt(pa);
}

void heap_init(uint64_t base, uint64_t end)
{
	heap_cur = (base + 4095) & ~4095ull;
	heap_end = end & ~4095ull;
	if (heap_end < heap_cur)
		heap_end = heap_cur;
}

void *heap_alloc(size_t n, size_t align)
{
	if (align < 16)
		align = 16;
	uint64_t p = (heap_cur + align - 1) & ~(uint64_t)(align - 1);
	if (p < heap_cur || p > heap_end || n > heap_end - p)
		return NULL;
	heap_cur = p + n;
	void *v = phys_to_virt(p);
	memset(v, 0, n);
	return v;
}

uint64_t heap_free_bytes(void)
{
	return heap_end - heap_cur;
}
