/* dgram.c - testguest.mode=dgram (dgram.h). */
#include "dgram.h"
#include "console.h"
#include "lib.h"
#include "mem.h"
#include "pattern.h"
#include "platform.h"
#include "timer.h"
#include "virtio.h"
#include "vsock.h"

#define HDR_LEN ((uint32_t)sizeof(struct vsock_hdr))
/* Ring sizes: the stream queues only need to exist for the device to
 * start; the datagram ones carry the traffic. */
#define STREAM_QSIZE 4
#define DGRAM_QSIZE 64
/* Room for one datagram, header included (a guest RX buffer of Linux's
 * usual size). */
#define DGRAM_BUF (HDR_LEN + TG_MAX_DGRAM)

static struct {
	const struct tg_config *cfg;
	struct virtio_dev dev;
	struct virtq rxq, txq, drx, dtx;
	uint64_t cid;
	uint8_t *rxbuf, *txbuf; /* DGRAM_QSIZE buffers of DGRAM_BUF each */
	bool tx_busy[DGRAM_QSIZE];
	uint16_t tx_free;
	uint64_t last_progress, timeout_tsc;
	struct {
		uint64_t sent, received, echoed, waits;
	} st;
} D;

static void drx_post(uint16_t i)
{
	virtq_set_desc(&D.drx, i, virt_to_phys(D.rxbuf + (size_t)i * DGRAM_BUF), DGRAM_BUF,
		       VIRTQ_DESC_F_WRITE, 0);
	virtq_add(&D.drx, i);
}

/* Take back the TX buffers the device is done with. */
static void dtx_reap(void)
{
	uint32_t id, len;
	while (virtq_get_used(&D.dtx, &id, &len)) {
		if (id >= D.dtx.size || !D.tx_busy[id])
			tg_die(EXIT_MISMATCH, "dgram: tx used id %u is not in flight", id);
		D.tx_busy[id] = false;
		D.tx_free++;
		D.last_progress = rdtsc();
	}
}

/* Nothing to do: wait a little, and give up after the timeout. */
static void idle(const char *what)
{
	if (D.timeout_tsc && rdtsc() - D.last_progress > D.timeout_tsc)
		tg_die(EXIT_TIMEOUT, "dgram: no progress for %lu s %s (sent %lu, received %lu, echoed %lu)",
		       D.cfg->timeout_s, what, D.st.sent, D.st.received, D.st.echoed);
	virtio_ack_interrupt(&D.dev);
	D.st.waits++;
	if (!D.cfg->nowait)
		outl(PORT_PV_WAIT, 1000);
	else
		cpu_spin_wait();
}

/* Send one datagram: header and payload copied into a free TX buffer, one
 * descriptor, published at once. */
static void dgram_send(uint32_t src_port, uint32_t dst_port, const uint8_t *data, uint32_t len)
{
	while (D.tx_free == 0) {
		dtx_reap();
		if (D.tx_free == 0)
			idle("waiting for tx buffers");
	}
	uint16_t i = 0;
	while (D.tx_busy[i])
		i++;
	uint8_t *b = D.txbuf + (size_t)i * DGRAM_BUF;
	struct vsock_hdr *h = (struct vsock_hdr *)b;
	memset(h, 0, sizeof(*h));
	h->src_cid = D.cid;
	h->dst_cid = VSOCK_HOST_CID;
	h->src_port = src_port;
	h->dst_port = dst_port;
	h->len = len;
	h->type = VSOCK_TYPE_DGRAM;
	h->op = VSOCK_OP_RW;
	memcpy(b + HDR_LEN, data, len);
	D.tx_busy[i] = true;
	D.tx_free--;
	virtq_set_desc(&D.dtx, i, virt_to_phys(b), HDR_LEN + len, 0, 0);
	virtq_add(&D.dtx, i);
	virtq_publish(&D.dtx);
	D.st.sent++;
}

/* Echo every datagram waiting in the RX queue; returns how many. */
static uint64_t echo_pass(void)
{
	uint64_t n = 0;
	uint32_t id, len;
	while (virtq_get_used(&D.drx, &id, &len)) {
		if (id >= D.drx.size || len < HDR_LEN || len > DGRAM_BUF)
			tg_die(EXIT_MISMATCH, "dgram: rx used id %u len %u", id, len);
		const uint8_t *b = D.rxbuf + (size_t)id * DGRAM_BUF;
		struct vsock_hdr h;
		memcpy(&h, b, sizeof(h)); /* copied out once */
		if (h.type != VSOCK_TYPE_DGRAM || h.op != VSOCK_OP_RW || h.src_cid != VSOCK_HOST_CID ||
		    h.dst_cid != D.cid || h.len != len - HDR_LEN)
			tg_die(EXIT_MISMATCH,
			       "dgram: bad datagram type %u op %u cid %lu->%lu len %u in %u bytes",
			       h.type, h.op, h.src_cid, h.dst_cid, h.len, len);
		D.st.received++;
		dgram_send(h.dst_port, h.src_port, b + HDR_LEN, h.len);
		D.st.echoed++;
		drx_post((uint16_t)id);
		n++;
	}
	if (n) {
		virtq_publish(&D.drx);
		D.last_progress = rdtsc();
	}
	return n;
}

static void dgram_start(const struct tg_config *cfg)
{
	D.cfg = cfg;
	if (virtio_find(cfg, VIRTIO_ID_VSOCK, &D.dev) != 0)
		tg_die(EXIT_NO_DEVICE, "no virtio-vsock device (%d virtio_mmio.device entries)",
		       cfg->ndevs);
	if (virtio_negotiate(&D.dev, (1ull << VIRTIO_F_VERSION_1) | (1ull << MICROVM_VSOCK_F_DGRAM),
			     0) != 0)
		tg_die(EXIT_NO_DEVICE, "virtio-vsock at 0x%lx does not offer datagrams (bit %d)",
		       D.dev.base, MICROVM_VSOCK_F_DGRAM);
	if (virtq_setup(&D.dev, &D.rxq, 0, STREAM_QSIZE) != 0 ||
	    virtq_setup(&D.dev, &D.txq, 1, STREAM_QSIZE) != 0 ||
	    virtq_setup(&D.dev, &D.drx, VSOCK_QUEUE_DGRAM_RX, DGRAM_QSIZE) != 0 ||
	    virtq_setup(&D.dev, &D.dtx, VSOCK_QUEUE_DGRAM_TX, DGRAM_QSIZE) != 0)
		tg_die(EXIT_NO_DEVICE, "virtio-vsock at 0x%lx: no datagram queues", D.dev.base);
	D.cid = virtio_config_read64(&D.dev, 0);
	if (D.cid <= VSOCK_HOST_CID || D.cid >= 0xffffffffu)
		tg_die(EXIT_NO_DEVICE, "virtio-vsock guest_cid %lu is not a guest cid", D.cid);
	D.rxbuf = heap_alloc((size_t)DGRAM_BUF * D.drx.size, 4096);
	D.txbuf = heap_alloc((size_t)DGRAM_BUF * D.dtx.size, 4096);
	if (!D.rxbuf || !D.txbuf)
		tg_die(EXIT_INTERNAL, "out of memory for datagram buffers");
	D.tx_free = D.dtx.size;
	for (uint16_t i = 0; i < D.drx.size; i++)
		drx_post(i);
	virtio_driver_ok(&D.dev);
	virtq_publish(&D.drx);
	D.timeout_tsc = ms_to_tsc(cfg->timeout_s * 1000);
	D.last_progress = rdtsc();
	tg_log("dgram: device at 0x%lx, guest cid %lu, features 0x%lx, datagram queues %u/%u",
	       D.dev.base, D.cid, D.dev.features, D.drx.size, D.dtx.size);
}

void dgram_run(const struct tg_config *cfg)
{
	static uint8_t payload[DGRAM_BUF - HDR_LEN];
	dgram_start(cfg);
	uint64_t count = cfg->has_count ? cfg->count : 1;
	uint32_t size = cfg->has_bytes ? (uint32_t)cfg->bytes : 64;
	uint64_t t0 = rdtsc();
	for (uint64_t i = 0; i < count; i++) {
		for (uint32_t k = 0; k < size; k++)
			payload[k] = pattern_byte(i * size + k);
		dgram_send(cfg->port, cfg->port, payload, size);
		/* Echo what already came, so the RX queue never runs dry while
		 * we send. */
		dtx_reap();
		echo_pass();
	}
	uint64_t t1 = rdtsc();
	tg_log("dgram: sent %lu datagrams of %u bytes to port %u", count, size, cfg->port);
	while (D.st.echoed < count) {
		dtx_reap();
		if (echo_pass() == 0)
			idle("waiting for datagrams to echo");
	}
	while (D.tx_free < D.dtx.size) {
		dtx_reap();
		if (D.tx_free < D.dtx.size)
			idle("draining tx");
	}
	uint64_t us = (t1 - t0) / (tsc_hz() / 1000000 ? tsc_hz() / 1000000 : 1);
	tg_log("dgram done: sent %lu, received %lu, echoed %lu, waits %lu, kicks %lu/%lu, send %lu us",
	       D.st.sent, D.st.received, D.st.echoed, D.st.waits, D.dtx.kicks, D.drx.kicks, us);
	tg_exit(EXIT_OK);
}
