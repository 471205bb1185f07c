/*
 * tables.h - count CPUs from the Intel MP table or the ACPI MADT.
 *
 * Every read goes through a physmem map callback, which returns NULL for a
 * range that is not known memory; every length and pointer inside a table is
 * checked against what the table itself claims. The functions are pure so
 * the host harness runs them over byte buffers.
 */
#ifndef TG_TABLES_H
#define TG_TABLES_H

#include <stdint.h>

struct physmem {
	const void *(*map)(void *ctx, uint64_t pa, uint64_t len);
	void *ctx;
};

/* Where the count came from. */
enum cpu_source { CPUS_NONE, CPUS_MADT, CPUS_MP };

/*
 * Enabled processors in the ACPI MADT. rsdp_hint is hvm_start_info's
 * rsdp_paddr (0: scan the EBDA's first KiB and 0xe0000-0xfffff).
 * Returns the count, 0 when no valid MADT was found.
 */
int acpi_count_cpus(const struct physmem *m, uint64_t rsdp_hint);

/*
 * Enabled processor entries (type 0) in the MP configuration table, found
 * through the floating pointer in the EBDA's first KiB, the last KiB of base
 * memory or 0xf0000-0xfffff. Returns the count, 0 when none was found.
 */
int mp_count_cpus(const struct physmem *m);

/* MADT first, then the MP table. */
int count_cpus(const struct physmem *m, uint64_t rsdp_hint, enum cpu_source *src);

#endif
