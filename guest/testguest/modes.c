/*
 * modes.c - what the guest does: hello, fail, and the vsock modes
 * echo/connect/sink/source built on vsock.c's engine.
 */
#include "modes.h"
#include "console.h"
#include "irq.h"
#include "lib.h"
#include "mem.h"
#include "pattern.h"
#include "platform.h"
#include "tables.h"
#include "timer.h"
#include "virtio.h"
#include "vsock.h"
#include "dgram.h"

static const struct tg_config *cfg;
static uint64_t start_tsc;

/* pattern_byte(i) for i < 2 * PATTERN_PERIOD: any 64 KiB window of the
 * stream is contiguous here. */
static uint8_t pattern[2 * PATTERN_PERIOD];

static void pattern_init(void)
{
	for (uint32_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = pattern_byte(i);
}

static const uint8_t *pattern_at(uint64_t off)
{
	return pattern + (off % PATTERN_PERIOD);
}

/* ---- hello / fail ---- */

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

/* ---- shared pieces of the vsock modes ---- */

static const char *close_reason_name(enum close_reason why)
{
	switch (why) {
	case CLOSE_PEER_RST:
		return "peer reset";
	case CLOSE_OUR_RST:
		return "we reset";
	case CLOSE_REFUSED:
		return "refused";
	default:
		return "transport reset";
	}
}

/* Console output costs a VM exit per byte or so: per-connection lines only
 * for the first few connections. */
#define LOG_CLOSES 16

static void log_closed(struct conn *c)
{
	uint64_t n = vsock_closed();
	if (n <= LOG_CLOSES)
		tg_log("closed %u<->%u (%s): rx %lu tx %lu bytes", c->local_port, c->peer_port,
		       close_reason_name(c->why), c->rx_total, c->tx_total);
	if (n == LOG_CLOSES)
		tg_log("(no more per-connection lines)");
}

/* Listener modes finish after testguest.conns closed connections. */
static bool listener_done(void)
{
	return cfg->has_conns && vsock_closed() >= cfg->conns;
}

static __attribute__((noreturn)) void listener_finish(void)
{
	vsock_log_stats();
	tg_log("%s done: %lu connections", mode_name(cfg->mode), vsock_closed());
	tg_exit(EXIT_OK);
}

/* Payload we only count: consumed at once. */
static void rx_discard(struct conn *c, const uint8_t *data, uint32_t len)
{
	(void)data;
	c->fwd_cnt += len;
}

/* Send cfg->bytes of the pattern. */
static uint32_t tx_pattern(struct conn *c, const uint8_t **data)
{
	if (c->tx_total >= cfg->bytes)
		return 0;
	*data = pattern_at(c->tx_total);
	return (uint32_t)MIN(cfg->bytes - c->tx_total, (uint64_t)VSOCK_MAX_PKT);
}

static bool open_plain(struct conn *c)
{
	(void)c;
	return true;
}

/* ---- echo ---- */

/*
 * Each connection owns a ring of VSOCK_BUF_ALLOC bytes: [fwd_cnt, tx_cnt) is
 * being sent (TX descriptors point into it), [tx_cnt, rx_cnt) waits to be
 * sent. fwd_cnt advances only when the device has consumed echoed bytes, so
 * a host that stops reading stops the guest: the window is the ring.
 */
#define RING_MASK (VSOCK_BUF_ALLOC - 1)

static uint8_t *ring_pool[VSOCK_MAX_CONNS];
static int ring_pool_n;

static bool echo_open(struct conn *c)
{
	c->buf = ring_pool_n ? ring_pool[--ring_pool_n] : heap_alloc(VSOCK_BUF_ALLOC, 4096);
	if (!c->buf)
		tg_log("out of memory for an echo buffer: refusing %u", c->peer_port);
	return c->buf != NULL;
}

static void echo_release(struct conn *c)
{
	if (c->buf)
		ring_pool[ring_pool_n++] = c->buf;
	c->buf = NULL;
}

static void echo_rx(struct conn *c, const uint8_t *data, uint32_t len)
{
	uint32_t pos = c->rx_cnt & RING_MASK;
	uint32_t first = MIN(len, VSOCK_BUF_ALLOC - pos);
	memcpy(c->buf + pos, data, first);
	memcpy(c->buf, data + first, len - first);
}

static uint32_t echo_tx_ready(struct conn *c, const uint8_t **data)
{
	uint32_t pending = c->rx_cnt - c->tx_cnt;
	if (!pending)
		return 0;
	uint32_t pos = c->tx_cnt & RING_MASK;
	*data = c->buf + pos;
	return MIN(pending, VSOCK_BUF_ALLOC - pos);
}

static void echo_tx_done(struct conn *c, uint32_t len)
{
	c->fwd_cnt += len;
}

static void echo_peer_shutdown(struct conn *c)
{
	/* A host that reads no more cannot be echoed to. */
	if (c->peer_shut & VSOCK_SHUTDOWN_RCV)
		vsock_reset(c);
}

static bool echo_want_shutdown(struct conn *c)
{
	/* The host sends no more and everything it sent went back out. */
	return (c->peer_shut & VSOCK_SHUTDOWN_SEND) && c->fwd_cnt == c->rx_cnt;
}

static const struct vsock_mode echo_mode = {
	.name = "echo",
	.open = echo_open,
	.rx = echo_rx,
	.tx_ready = echo_tx_ready,
	.tx_done = echo_tx_done,
	.peer_shutdown = echo_peer_shutdown,
	.want_shutdown = echo_want_shutdown,
	.closed = log_closed,
	.release = echo_release,
	.done = listener_done,
	.finish = listener_finish,
};

/* ---- sink ---- */

static bool sink_want_shutdown(struct conn *c)
{
	return c->peer_shut & VSOCK_SHUTDOWN_SEND;
}

static const struct vsock_mode sink_mode = {
	.name = "sink",
	.open = open_plain,
	.rx = rx_discard,
	.want_shutdown = sink_want_shutdown,
	.closed = log_closed,
	.done = listener_done,
	.finish = listener_finish,
};

/* ---- source ---- */

static void source_peer_shutdown(struct conn *c)
{
	if ((c->peer_shut & VSOCK_SHUTDOWN_RCV) && c->tx_total < cfg->bytes)
		vsock_reset(c);
}

static bool source_want_shutdown(struct conn *c)
{
	return c->tx_total >= cfg->bytes;
}

static const struct vsock_mode source_mode = {
	.name = "source",
	.open = open_plain,
	.rx = rx_discard,
	.tx_ready = tx_pattern,
	.peer_shutdown = source_peer_shutdown,
	.want_shutdown = source_want_shutdown,
	.closed = log_closed,
	.done = listener_done,
	.finish = listener_finish,
};

/* ---- connect ---- */

static bool connect_finished;

static void connect_rx(struct conn *c, const uint8_t *data, uint32_t len)
{
	uint64_t off = c->rx_total;
	if (off + len > c->tx_total)
		tg_die(EXIT_MISMATCH, "connect: got %lu bytes back, only %lu sent",
		       off + len, c->tx_total);
	uint32_t done = 0;
	while (done < len) {
		uint32_t n = MIN(len - done, PATTERN_PERIOD);
		const uint8_t *want = pattern_at(off + done);
		if (memcmp(data + done, want, n) != 0) {
			uint32_t i = 0;
			while (data[done + i] == want[i])
				i++;
			tg_die(EXIT_MISMATCH, "connect: mismatch at byte %lu: got 0x%02x, want 0x%02x",
			       off + done + i, data[done + i], want[i]);
		}
		done += n;
	}
	c->fwd_cnt += len;
}

static void connect_peer_shutdown(struct conn *c)
{
	if (c->rx_total < cfg->bytes)
		tg_die(EXIT_RESET, "connect: host shut down (flags %u) after %lu of %lu bytes",
		       c->peer_shut, c->rx_total, cfg->bytes);
}

static bool connect_want_shutdown(struct conn *c)
{
	return c->rx_total >= cfg->bytes;
}

static void connect_closed(struct conn *c)
{
	log_closed(c);
	if (c->why == CLOSE_REFUSED)
		tg_die(EXIT_RESET, "connect: port %u refused", cfg->port);
	if (c->rx_total < cfg->bytes)
		tg_die(EXIT_RESET, "connect: connection %s after %lu of %lu bytes",
		       close_reason_name(c->why), c->rx_total, cfg->bytes);
	connect_finished = true;
}

static bool connect_done(void)
{
	return connect_finished;
}

static __attribute__((noreturn)) void connect_finish(void)
{
	uint64_t us = (rdtsc() - start_tsc) / MAX(tsc_hz() / 1000000, 1ull);
	vsock_log_stats();
	/* bytes per microsecond = MB/s, each way. */
	tg_log("connect ok: %lu bytes echoed in %lu ms (%lu MB/s)", cfg->bytes, us / 1000,
	       us ? cfg->bytes / us : 0);
	tg_exit(EXIT_OK);
}

static const struct vsock_mode connect_mode = {
	.name = "connect",
	.open = open_plain,
	.rx = connect_rx,
	.tx_ready = tx_pattern,
	.peer_shutdown = connect_peer_shutdown,
	.want_shutdown = connect_want_shutdown,
	.closed = connect_closed,
	.done = connect_done,
	.finish = connect_finish,
	.always_waiting = true,
};

/* ---- rng: a virtio transport self-test against QEMU's virtio-rng ---- */

/*
 * Not a vsock mode: it exercises virtio.c (negotiation, queue setup,
 * avail/used rings, notification, event index) against a real device where
 * no vsock device exists, e.g. QEMU -device virtio-rng-device. Reads
 * testguest.bytes (default 65536) of entropy in 256 requests of up to 4 KiB
 * and exits 0; no device: 5. With testguest.irq=1 it waits for the device's
 * interrupts the way vsock.c does.
 */
static __attribute__((noreturn)) void mode_rng(void)
{
	static struct virtio_dev dev;
	static struct virtq q;
	if (virtio_find(cfg, VIRTIO_ID_RNG, &dev) != 0)
		tg_die(EXIT_NO_DEVICE, "no virtio-rng device");
	if (cfg->irq)
		irq_start(&dev);
	if (virtio_negotiate(&dev, 1ull << VIRTIO_F_VERSION_1, 1ull << VIRTIO_F_EVENT_IDX) != 0 ||
	    virtq_setup(&dev, &q, 0, 8) != 0)
		tg_die(EXIT_NO_DEVICE, "virtio-rng unusable");
	virtio_driver_ok(&dev);
	enum { CHUNK = 4096 };
	uint8_t *buf = heap_alloc((size_t)CHUNK * q.size, 4096);
	if (!buf)
		tg_die(EXIT_INTERNAL, "out of memory");
	uint64_t want = cfg->has_bytes ? cfg->bytes : 65536, got = 0, reqs = 0, nonzero = 0;
	uint64_t deadline = rdtsc() + ms_to_tsc(cfg->timeout_s ? cfg->timeout_s * 1000 : ~0ull / 2 / 1000000);
	uint32_t inflight = 0;
	bool posted[VIRTQ_MAX_SIZE] = { false };
	while (got < want) {
		uint64_t seen = irq_count();
		/* Keep every descriptor busy. */
		for (uint16_t i = 0; i < q.size; i++) {
			if (posted[i])
				continue;
			virtq_set_desc(&q, i, virt_to_phys(buf + (size_t)i * CHUNK), CHUNK,
				       VIRTQ_DESC_F_WRITE, 0);
			virtq_add(&q, i);
			posted[i] = true;
			inflight++;
		}
		virtq_publish(&q);
		uint32_t id, len;
		bool any = false;
		while (virtq_get_used(&q, &id, &len)) {
			if (!posted[id] || len > CHUNK)
				tg_die(EXIT_MISMATCH, "rng: bad used entry id %u len %u", id, len);
			posted[id] = false;
			inflight--;
			for (uint32_t k = 0; k < len; k++)
				nonzero += buf[(size_t)id * CHUNK + k] != 0;
			got += len;
			reqs++;
			any = true;
		}
		if (!any) {
			if ((int64_t)(rdtsc() - deadline) > 0)
				tg_die(EXIT_TIMEOUT, "rng: timeout after %lu bytes", got);
			if (!cfg->irq) {
				virtio_ack_interrupt(&dev);
				outl(PORT_PV_WAIT, 1000);
			} else if (irq_count() == seen) {
				irq_take_status();
				mfence(); /* used_event before the used index */
				if (!virtq_used_pending(&q))
					irq_wait(seen, ms_to_tsc(100));
			}
		}
	}
	if (nonzero < got / 2)
		tg_die(EXIT_MISMATCH, "rng: %lu of %lu bytes are zero", got - nonzero, got);
	char irqs[48] = "";
	if (cfg->irq)
		tg_snprintf(irqs, sizeof(irqs), ", irqs %lu", irq_count());
	tg_log("rng ok: %lu bytes in %lu requests, queue %u, features 0x%lx, kicks %lu%s", got,
	       reqs, q.size, dev.features, q.kicks, irqs);
	tg_exit(EXIT_OK);
}

/* ---- dispatch ---- */

static __attribute__((noreturn)) void run_vsock(const struct vsock_mode *m)
{
	pattern_init();
	vsock_start(cfg, m);
	start_tsc = rdtsc();
	if (m == &connect_mode)
		vsock_connect(cfg->port);
	else
		vsock_listen(cfg->port);
	vsock_run();
}

void run_mode(const struct tg_config *c, const struct boot_info *bi)
{
	cfg = c;
	switch (c->mode) {
	case MODE_HELLO:
		mode_hello(bi);
	case MODE_FAIL:
		tg_die(EXIT_FAIL_MODE, "fail mode: exiting with status %d", EXIT_FAIL_MODE);
	case MODE_ECHO:
		run_vsock(&echo_mode);
	case MODE_CONNECT:
		run_vsock(&connect_mode);
	case MODE_SINK:
		run_vsock(&sink_mode);
	case MODE_SOURCE:
		run_vsock(&source_mode);
	case MODE_RNG:
		mode_rng();
	case MODE_DGRAM:
		dgram_run(cfg);
	default:
		tg_die(EXIT_INTERNAL, "no mode");
	}
}
