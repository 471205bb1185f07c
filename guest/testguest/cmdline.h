/* cmdline.h - the testguest.* and virtio_mmio.device= parameters. */
#ifndef TG_CMDLINE_H
#define TG_CMDLINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tg_mode {
	MODE_NONE,
	MODE_HELLO,
	MODE_FAIL,
	MODE_ECHO,
	MODE_CONNECT,
	MODE_SINK,
	MODE_SOURCE,
	MODE_RNG, /* virtio transport self-test (virtio-rng) */
	MODE_DGRAM, /* experimental vsock datagrams (dgram.h) */
};

#define TG_MAX_MMIO_DEVS 8
#define TG_DEFAULT_TIMEOUT_S 30
#define TG_MAX_TIMEOUT_S 1000000
#define TG_DEFAULT_BUFSIZE 4096
#define TG_MIN_BUFSIZE 64
#define TG_MAX_BUFSIZE 65536
#define TG_MAX_DGRAM 4096 /* largest testguest.bytes in dgram mode */

/* One virtio_mmio.device=<size>@<addr>:<irq>[:<id>] entry. */
struct mmio_dev {
	uint64_t base, size;
	uint32_t irq;
};

struct tg_config {
	enum tg_mode mode;
	uint32_t port;
	bool has_port;
	uint64_t conns;
	bool has_conns;
	uint64_t bytes;
	bool has_bytes;
	uint64_t count;		/* dgram: datagrams to send and to echo */
	bool has_count;
	uint64_t timeout_s;	/* 0: no timeout */
	bool irq;
	uint32_t bufsize;	/* RX buffer payload bytes */
	bool nowait;		/* testguest.wait=0: never use the wait port */
	int ndevs;
	struct mmio_dev devs[TG_MAX_MMIO_DEVS];
};

/*
 * Parse a kernel command line. Words are separated by spaces or tabs.
 * Unknown words are ignored, except unknown testguest.* keys, which are an
 * error (they are typos). A repeated key takes its last value. Returns 0, or
 * -1 with a message in err.
 */
int cmdline_parse(const char *s, struct tg_config *cfg, char *err, size_t errlen);

/* Linux memparse-like: decimal or 0x hex, optional K/M/G suffix (only when
 * allow_suffix). Parses [*s, end) entirely; returns 0 or -1. */
int parse_u64(const char *s, const char *end, bool allow_suffix, uint64_t *out);

const char *mode_name(enum tg_mode m);

#endif
