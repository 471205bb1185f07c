/* modes.h - what the guest does, chosen by testguest.mode=. */
#ifndef TG_MODES_H
#define TG_MODES_H

#include "cmdline.h"
#include <stdint.h>

/* What main.c learned at boot. */
struct boot_info {
	const char *cmdline;
	uint64_t rsdp_paddr;
	uint32_t memmap_entries;
	uint64_t heap_bytes;
};

__attribute__((noreturn)) void run_mode(const struct tg_config *cfg, const struct boot_info *bi);

#ifdef HOST_TEST
uint64_t host_image_end(void);
#endif

#endif
