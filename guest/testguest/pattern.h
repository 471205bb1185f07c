/*
 * pattern.h - the deterministic byte stream the vsock modes send and check:
 * byte i of a connection is (i*7 + (i >> 8)) & 0xff. It repeats every
 * 65536 bytes (both terms depend only on i mod 65536), so a 128 KiB table
 * holds every 64 KiB window and packets can point straight into it.
 */
#ifndef TG_PATTERN_H
#define TG_PATTERN_H

#include <stdint.h>

#define PATTERN_PERIOD 65536u

static inline uint8_t pattern_byte(uint64_t i)
{
	return (uint8_t)(i * 7 + (i >> 8));
}

#endif
