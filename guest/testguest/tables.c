/* tables.c - MP specification 1.4 and ACPI MADT parsing. */
#include "tables.h"
#include "lib.h"

static const uint8_t *map(const struct physmem *m, uint64_t pa, uint64_t len)
{
	return m->map(m->ctx, pa, len);
}

static uint8_t sum8(const uint8_t *p, uint64_t n)
{
	uint8_t s = 0;
	for (uint64_t i = 0; i < n; i++)
		s = (uint8_t)(s + p[i]);
	return s;
}

static uint16_t rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
	return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* The EBDA's physical address from the BIOS data area, 0 if implausible. */
static uint64_t ebda_base(const struct physmem *m)
{
	const uint8_t *bda = map(m, 0x40e, 2);
	if (!bda)
		return 0;
	uint64_t ebda = (uint64_t)rd16(bda) << 4;
	if (ebda < 0x80000 || ebda >= 0xa0000)
		return 0;
	return ebda;
}

/* ---- Intel MP table ---- */

#define MP_FLOAT_LEN 16
#define MP_CONFIG_HDR_LEN 44

/* Scan [base, base+len) on 16-byte boundaries for a valid "_MP_" floating
 * pointer. Returns its address or 0. */
static uint64_t mp_scan(const struct physmem *m, uint64_t base, uint64_t len)
{
	for (uint64_t pa = base; pa + MP_FLOAT_LEN <= base + len; pa += 16) {
		const uint8_t *f = map(m, pa, MP_FLOAT_LEN);
		if (!f || memcmp(f, "_MP_", 4) != 0)
			continue;
		uint64_t flen = (uint64_t)f[8] * 16; /* length in 16-byte units */
		if (flen < MP_FLOAT_LEN)
			continue;
		const uint8_t *full = map(m, pa, flen);
		if (!full || sum8(full, flen) != 0)
			continue;
		return pa;
	}
	return 0;
}

static int mp_parse(const struct physmem *m, uint64_t fpa)
{
	const uint8_t *f = map(m, fpa, MP_FLOAT_LEN);
	if (!f)
		return 0;
	if (f[11] != 0) {
		/* MP feature byte 1: a default configuration, which always
		 * has two processors (MP spec 1.4, chapter 5). */
		return 2;
	}
	uint64_t cpa = rd32(f + 4);
	if (cpa == 0)
		return 0;
	const uint8_t *h = map(m, cpa, MP_CONFIG_HDR_LEN);
	if (!h || memcmp(h, "PCMP", 4) != 0)
		return 0;
	uint32_t blen = rd16(h + 4);
	if (blen < MP_CONFIG_HDR_LEN)
		return 0;
	const uint8_t *t = map(m, cpa, blen);
	if (!t || sum8(t, blen) != 0)
		return 0;
	/*
	 * Walk the entries by the base table length, not the entry count at
	 * offset 34: QEMU's qboot writes 0 there, and Linux ignores it too.
	 */
	uint32_t off = MP_CONFIG_HDR_LEN;
	int cpus = 0;
	while (off < blen) {
		uint32_t esize;
		switch (t[off]) {
		case 0:
			esize = 20; /* processor */
			break;
		case 1: /* bus */
		case 2: /* I/O APIC */
		case 3: /* I/O interrupt assignment */
		case 4: /* local interrupt assignment */
			esize = 8;
			break;
		default:
			return cpus; /* unknown entry, size unknown: stop here */
		}
		if (esize > blen - off)
			break; /* truncated entry */
		if (t[off] == 0 && (t[off + 3] & 1)) /* CPU flags: EN */
			cpus++;
		off += esize;
	}
	return cpus;
}

int mp_count_cpus(const struct physmem *m)
{
	uint64_t fpa = 0;
	uint64_t ebda = ebda_base(m);
	if (ebda)
		fpa = mp_scan(m, ebda, 1024);
	if (!fpa) {
		/* Last KiB of base memory: the BDA gives its size in KiB. */
		uint64_t top = 0xa0000;
		const uint8_t *bda = map(m, 0x413, 2);
		if (bda) {
			uint64_t kib = rd16(bda);
			if (kib >= 512 && kib <= 640)
				top = kib * 1024;
		}
		fpa = mp_scan(m, top - 1024, 1024);
		if (!fpa && top != 0xa0000)
			fpa = mp_scan(m, 0x9fc00, 1024);
	}
	if (!fpa)
		fpa = mp_scan(m, 0xf0000, 0x10000);
	if (!fpa)
		return 0;
	return mp_parse(m, fpa);
}

/* ---- ACPI ---- */

#define RSDP_V1_LEN 20
#define SDT_HDR_LEN 36
#define MADT_HDR_LEN 44
#define SDT_MAX_LEN (1u << 20) /* sanity cap */

static bool rsdp_valid(const struct physmem *m, uint64_t pa)
{
	const uint8_t *r = map(m, pa, RSDP_V1_LEN);
	if (!r || memcmp(r, "RSD PTR ", 8) != 0 || sum8(r, RSDP_V1_LEN) != 0)
		return false;
	if (r[15] >= 2) {
		const uint8_t *r2 = map(m, pa, 36);
		if (!r2)
			return false;
		uint32_t len = rd32(r2 + 20);
		if (len < 36 || len > 4096)
			return false;
		const uint8_t *full = map(m, pa, len);
		if (!full || sum8(full, len) != 0)
			return false;
	}
	return true;
}

static uint64_t rsdp_scan(const struct physmem *m, uint64_t base, uint64_t len)
{
	for (uint64_t pa = base; pa + RSDP_V1_LEN <= base + len; pa += 16)
		if (rsdp_valid(m, pa))
			return pa;
	return 0;
}

/* Map a whole SDT whose checksum is valid; sets *len. */
static const uint8_t *sdt_map(const struct physmem *m, uint64_t pa, uint32_t *len)
{
	const uint8_t *h = map(m, pa, SDT_HDR_LEN);
	if (!h)
		return NULL;
	uint32_t l = rd32(h + 4);
	if (l < SDT_HDR_LEN || l > SDT_MAX_LEN)
		return NULL;
	const uint8_t *t = map(m, pa, l);
	if (!t || sum8(t, l) != 0)
		return NULL;
	*len = l;
	return t;
}

static int madt_parse(const uint8_t *t, uint32_t len)
{
	if (len < MADT_HDR_LEN)
		return 0;
	int cpus = 0;
	uint32_t off = MADT_HDR_LEN;
	while (off + 2 <= len) {
		uint8_t type = t[off], elen = t[off + 1];
		if (elen < 2 || elen > len - off)
			break; /* malformed: keep what was counted */
		if (type == 0 && elen >= 8 && (rd32(t + off + 4) & 1))
			cpus++; /* processor local APIC, enabled */
		else if (type == 9 && elen >= 16 && (rd32(t + off + 8) & 1))
			cpus++; /* processor local x2APIC, enabled */
		off += elen;
	}
	return cpus;
}

int acpi_count_cpus(const struct physmem *m, uint64_t rsdp_hint)
{
	uint64_t rsdp = 0;
	if (rsdp_hint && rsdp_valid(m, rsdp_hint))
		rsdp = rsdp_hint;
	if (!rsdp) {
		uint64_t ebda = ebda_base(m);
		if (ebda)
			rsdp = rsdp_scan(m, ebda, 1024);
	}
	if (!rsdp)
		rsdp = rsdp_scan(m, 0xe0000, 0x20000);
	if (!rsdp)
		return 0;

	const uint8_t *r = map(m, rsdp, RSDP_V1_LEN);
	uint64_t root = rd32(r + 16);
	unsigned esize = 4;
	if (r[15] >= 2) {
		const uint8_t *r2 = map(m, rsdp, 36);
		uint64_t x = rd64(r2 + 24);
		if (x) {
			root = x;
			esize = 8;
		}
	}
	uint32_t rlen;
	const uint8_t *rt = sdt_map(m, root, &rlen);
	if (!rt || memcmp(rt, esize == 8 ? "XSDT" : "RSDT", 4) != 0)
		return 0;
	for (uint32_t off = SDT_HDR_LEN; off + esize <= rlen; off += esize) {
		uint64_t pa = esize == 8 ? rd64(rt + off) : rd32(rt + off);
		uint32_t len;
		const uint8_t *t = sdt_map(m, pa, &len);
		if (t && memcmp(t, "APIC", 4) == 0)
			return madt_parse(t, len);
	}
	return 0;
}

int count_cpus(const struct physmem *m, uint64_t rsdp_hint, enum cpu_source *src)
{
	int n = acpi_count_cpus(m, rsdp_hint);
	if (n > 0) {
		*src = CPUS_MADT;
		return n;
	}
	n = mp_count_cpus(m);
	if (n > 0) {
		*src = CPUS_MP;
		return n;
	}
	*src = CPUS_NONE;
	return 0;
}
