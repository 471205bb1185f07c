/* timer.h - time from the TSC, readable at CPL3. */
#ifndef TG_TIMER_H
#define TG_TIMER_H

#include <stdint.h>

enum tsc_source { TSC_CPUID_15, TSC_CPUID_16, TSC_HV_LEAF, TSC_ASSUMED };

/* Find the TSC frequency: CPUID 0x15, then 0x16, then the hypervisor
 * leaf 0x40000010, else 2 GHz. Only needs to be roughly right. */
void timer_init(void);
uint64_t tsc_hz(void);
enum tsc_source tsc_source(void);
const char *tsc_source_name(void);

/* TSC ticks in ms milliseconds. */
uint64_t ms_to_tsc(uint64_t ms);

#endif
