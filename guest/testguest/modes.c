/* modes.c - hello, fail, and the vsock modes' dispatch. */
#include "modes.h"
#include "console.h"
#include "lib.h"
#include "mem.h"
#include "tables.h"

static const void *guest_map(void *ctx, uint64_t pa, uint64_t len)
{
	(void)ctx;
	return phys_map(pa, len);
}

static __attribute__((noreturn)) void mode_hello(const struct boot_info *bi)
{
	struct physmem m = { guest_map, NULL };
	enum cpu_source src;
	int cpus = count_cpus(&m, bi->rsdp_paddr, &src);
	if (cpus <= 0)
		cpus = 1; /* no MP table or MADT: a uniprocessor machine */
	tg_log("hello cpus=%d", cpus);
	tg_exit(EXIT_OK);
}

void run_mode(const struct tg_config *cfg, const struct boot_info *bi)
{
	switch (cfg->mode) {
	case MODE_HELLO:
		mode_hello(bi);
	case MODE_FAIL:
		tg_die(EXIT_FAIL_MODE, "fail mode: exiting with status %d", EXIT_FAIL_MODE);
	default:
		tg_die(EXIT_INTERNAL, "mode %s not built", mode_name(cfg->mode));
	}
}
