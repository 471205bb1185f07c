/* cmdline.c - command-line parsing; pure functions, tested on the host. */
#include "cmdline.h"
#include "lib.h"
#include "platform.h"

static const struct {
	const char *name;
	enum tg_mode mode;
} modes[] = {
	{ "hello", MODE_HELLO },     { "fail", MODE_FAIL }, { "echo", MODE_ECHO },
	{ "connect", MODE_CONNECT }, { "sink", MODE_SINK }, { "source", MODE_SOURCE },
	{ "dgram", MODE_DGRAM },
	{ "rng", MODE_RNG },
};

const char *mode_name(enum tg_mode m)
{
	for (size_t i = 0; i < ARRAY_SIZE(modes); i++)
		if (modes[i].mode == m)
			return modes[i].name;
	return "none";
}

/* Does [s, end) equal the NUL-terminated word w? */
static bool eq(const char *s, const char *end, const char *w)
{
	size_t n = strlen(w);
	return (size_t)(end - s) == n && memcmp(s, w, n) == 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int parse_u64(const char *s, const char *end, bool allow_suffix, uint64_t *out)
{
	unsigned base = 10;
	if (end - s > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
	}
	if (s >= end)
		return -1;
	uint64_t v = 0;
	const char *p = s;
	for (; p < end; p++) {
		int d = hexval(*p);
		if (d < 0 || (unsigned)d >= base)
			break;
		if (v > (UINT64_MAX - (uint64_t)d) / base)
			return -1; /* overflow */
		v = v * base + (uint64_t)d;
	}
	if (p == s)
		return -1;
	if (p < end && allow_suffix && p + 1 == end) {
		unsigned shift;
		switch (*p) {
		case 'k':
		case 'K':
			shift = 10;
			break;
		case 'm':
		case 'M':
			shift = 20;
			break;
		case 'g':
		case 'G':
			shift = 30;
			break;
		default:
			return -1;
		}
		if (v > (UINT64_MAX >> shift))
			return -1;
		v <<= shift;
		p++;
	}
	if (p != end)
		return -1;
	*out = v;
	return 0;
}

static const char *find(const char *s, const char *end, char c)
{
	for (; s < end; s++)
		if (*s == c)
			return s;
	return NULL;
}

/* <size>@<addr>:<irq>[:<id>] */
static int parse_mmio_dev(const char *s, const char *end, struct mmio_dev *d)
{
	const char *at = find(s, end, '@');
	if (!at)
		return -1;
	const char *colon = find(at + 1, end, ':');
	if (!colon)
		return -1;
	const char *colon2 = find(colon + 1, end, ':');
	uint64_t size, base, irq, id;
	if (parse_u64(s, at, true, &size) || parse_u64(at + 1, colon, true, &base) ||
	    parse_u64(colon + 1, colon2 ? colon2 : end, false, &irq))
		return -1;
	if (colon2 && parse_u64(colon2 + 1, end, false, &id))
		return -1;
	/* The registers we touch end at config offset 0x108 (guest_cid). */
	if (size < 0x108 || base > PHYS_LIMIT || size > PHYS_LIMIT - base || irq > 0xffffffffu)
		return -1;
	d->base = base;
	d->size = size;
	d->irq = (uint32_t)irq;
	return 0;
}

#define ERR(...)                                           \
	do {                                               \
		tg_snprintf(err, errlen, __VA_ARGS__);     \
		return -1;                                 \
	} while (0)

int cmdline_parse(const char *s, struct tg_config *cfg, char *err, size_t errlen)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->timeout_s = TG_DEFAULT_TIMEOUT_S;
	cfg->bufsize = TG_DEFAULT_BUFSIZE;
	if (errlen)
		err[0] = '\0';

	const char *p = s;
	for (;;) {
		while (*p == ' ' || *p == '\t' || *p == '\n')
			p++;
		if (!*p)
			break;
		const char *w = p;
		while (*p && *p != ' ' && *p != '\t' && *p != '\n')
			p++;
		const char *wend = p;
		const char *eqs = find(w, wend, '=');
		const char *kend = eqs ? eqs : wend;
		const char *v = eqs ? eqs + 1 : wend;
		int wlen = (int)(wend - w);

		if (eq(w, kend, "virtio_mmio.device")) {
			if (cfg->ndevs == TG_MAX_MMIO_DEVS)
				ERR("more than %d virtio_mmio.device entries", TG_MAX_MMIO_DEVS);
			if (!eqs || parse_mmio_dev(v, wend, &cfg->devs[cfg->ndevs]))
				ERR("bad virtio_mmio.device entry '%.*s'", wlen, w);
			cfg->ndevs++;
			continue;
		}
		if (kend - w < 10 || memcmp(w, "testguest.", 10) != 0)
			continue; /* someone else's parameter */
		if (!eqs || v == wend)
			ERR("'%.*s' needs a value", wlen, w);

		const char *key = w + 10;
		uint64_t n = 0;
		bool numeric = !eq(key, kend, "mode");
		if (numeric && parse_u64(v, wend, true, &n))
			ERR("bad number in '%.*s'", wlen, w);

		if (eq(key, kend, "mode")) {
			cfg->mode = MODE_NONE;
			for (size_t i = 0; i < ARRAY_SIZE(modes); i++)
				if (eq(v, wend, modes[i].name))
					cfg->mode = modes[i].mode;
			if (cfg->mode == MODE_NONE)
				ERR("unknown mode in '%.*s'", wlen, w);
		} else if (eq(key, kend, "port")) {
			/* 0xffffffff is VMADDR_PORT_ANY, not a port. */
			if (n >= 0xffffffffu)
				ERR("port out of range in '%.*s'", wlen, w);
			cfg->port = (uint32_t)n;
			cfg->has_port = true;
		} else if (eq(key, kend, "conns")) {
			if (n == 0)
				ERR("testguest.conns must be at least 1");
			cfg->conns = n;
			cfg->has_conns = true;
		} else if (eq(key, kend, "bytes")) {
			cfg->bytes = n;
			cfg->has_bytes = true;
		} else if (eq(key, kend, "count")) {
			cfg->count = n;
			cfg->has_count = true;
		} else if (eq(key, kend, "timeout")) {
			if (n > TG_MAX_TIMEOUT_S)
				ERR("testguest.timeout above %d", TG_MAX_TIMEOUT_S);
			cfg->timeout_s = n;
		} else if (eq(key, kend, "irq")) {
			if (n > 1)
				ERR("testguest.irq must be 0 or 1");
			cfg->irq = n == 1;
		} else if (eq(key, kend, "wait")) {
			if (n > 1)
				ERR("testguest.wait must be 0 or 1");
			cfg->nowait = n == 0;
		} else if (eq(key, kend, "bufsize")) {
			if (n < TG_MIN_BUFSIZE || n > TG_MAX_BUFSIZE)
				ERR("testguest.bufsize must be in [%d, %d]", TG_MIN_BUFSIZE,
				    TG_MAX_BUFSIZE);
			cfg->bufsize = (uint32_t)n;
		} else {
			ERR("unknown parameter '%.*s'", (int)(kend - w), w);
		}
	}

	switch (cfg->mode) {
	case MODE_NONE:
		ERR("no testguest.mode= given");
	case MODE_ECHO:
	case MODE_SINK:
		if (!cfg->has_port)
			ERR("mode %s needs testguest.port=", mode_name(cfg->mode));
		break;
	case MODE_DGRAM:
		if (!cfg->has_port)
			ERR("mode dgram needs testguest.port=");
		if (cfg->has_bytes && cfg->bytes > TG_MAX_DGRAM)
			ERR("mode dgram: testguest.bytes above %d", TG_MAX_DGRAM);
		break;
	case MODE_CONNECT:
	case MODE_SOURCE:
		if (!cfg->has_port || !cfg->has_bytes)
			ERR("mode %s needs testguest.port= and testguest.bytes=",
			    mode_name(cfg->mode));
		break;
	default:
		break;
	}
	return 0;
}
