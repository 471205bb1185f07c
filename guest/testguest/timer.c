/* timer.c - TSC frequency discovery. */
#include "timer.h"
#include "platform.h"

static uint64_t hz;
static enum tsc_source src;

/* TSC kHz from CPUID 0x40000010 read at CPL0 by boot.S (0: none). */
extern uint32_t hv_tsc_khz;

void timer_init(void)
{
	uint32_t r[4];
	hz = 0;
	cpuid(0, 0, r);
	uint32_t max_basic = r[0];
	/* The hypervisor's word on the guest TSC comes first. */
	if (hv_tsc_khz) {
		hz = (uint64_t)hv_tsc_khz * 1000;
		src = TSC_HV_LEAF;
	}
	if (!hz && max_basic >= 0x15) {
		/* eax = denominator, ebx = numerator, ecx = crystal Hz */
		cpuid(0x15, 0, r);
		if (r[0] && r[1] && r[2]) {
			hz = (uint64_t)r[2] * r[1] / r[0];
			src = TSC_CPUID_15;
		}
	}
	if (!hz && max_basic >= 0x16) {
		cpuid(0x16, 0, r); /* eax[15:0] = base MHz */
		if (r[0] & 0xffff) {
			hz = (uint64_t)(r[0] & 0xffff) * 1000000;
			src = TSC_CPUID_16;
		}
	}
	if (!hz && max_basic >= 1) {
		cpuid(1, 0, r);
		if (r[2] & (1u << 31)) { /* running under a hypervisor */
			cpuid(0x40000000, 0, r);
			if (r[0] >= 0x40000010 && r[0] < 0x40010000) {
				cpuid(0x40000010, 0, r); /* eax = TSC kHz */
				if (r[0]) {
					hz = (uint64_t)r[0] * 1000;
					src = TSC_HV_LEAF;
				}
			}
		}
	}
	if (!hz) {
		hz = 2000000000ull;
		src = TSC_ASSUMED;
	}
}

uint64_t tsc_hz(void)
{
	return hz;
}

enum tsc_source tsc_source(void)
{
	return src;
}

const char *tsc_source_name(void)
{
	switch (src) {
	case TSC_CPUID_15:
		return "cpuid 0x15";
	case TSC_CPUID_16:
		return "cpuid 0x16";
	case TSC_HV_LEAF:
		return "cpuid 0x40000010";
	default:
		return "assumed";
	}
}

uint64_t ms_to_tsc(uint64_t ms)
{
	/* ms is at most ~1e9 (timeout cap), hz/1000 at most ~1e7: no overflow. */
	return ms * (hz / 1000);
}
