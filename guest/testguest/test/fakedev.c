/*
 * fakedev.c - a virtio-mmio v2 vsock device and a host peer, for HOST_TEST.
 *
 * The device is strict where a real one may be lenient, so guest bugs show:
 * it processes the TX queue only after a notify, stops using RX buffers once
 * it ran out until notified again, honours EVENT_IDX in both directions, and
 * checks every header, chain and credit rule it can. The host peer is a
 * scriptable set of sockets (struct host_cfg): it opens connections to the
 * guest or listens for them, sends its own stream, checks what comes back,
 * reads slowly or stalls, and closes in the different ways the spec allows.
 */
#include "fake.h"
#include "irq.h"
#include "pattern.h"
#include "virtio.h"
#include "vsock.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct host_cfg hcfg;

void host_fail(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout);
	fprintf(stdout, "HOST FAIL: ");
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fprintf(stdout, "\n");
	fflush(stdout);
	_exit(100);
}

/* ---- device ---- */

#define S_FEATURES_OK 8
#define S_DRIVER_OK 4

struct fq {
	uint32_t num, ready;
	uint64_t desc, avail, used;
	uint16_t last_avail, used_idx;
	bool kicked, starved;
};

static struct {
	uint32_t status, dfsel, drfsel, qsel, isr;
	bool raised; /* interrupt since the last wait */
	uint64_t drv_features;
	struct fq q[3];
	uint64_t steps, delivered, tx_seen;
	bool fault_done;
} D;

static uint64_t dev_features(void)
{
	uint64_t f = 0;
	if (!hcfg.no_version_1)
		f |= 1ull << VIRTIO_F_VERSION_1;
	if (hcfg.event_idx)
		f |= 1ull << VIRTIO_F_EVENT_IDX;
	return f;
}

static bool ev_idx(void)
{
	return (D.drv_features >> VIRTIO_F_EVENT_IDX) & 1;
}

static struct virtq_desc *qdesc(struct fq *q, uint16_t i)
{
	return (struct virtq_desc *)(uintptr_t)q->desc + i;
}

static volatile uint16_t *qavail(struct fq *q)
{
	return (volatile uint16_t *)(uintptr_t)q->avail;
}

static volatile uint16_t *qused(struct fq *q)
{
	return (volatile uint16_t *)(uintptr_t)q->used;
}

static bool avail_pop(struct fq *q, uint16_t *head)
{
	uint16_t idx = qavail(q)[1];
	if (idx == q->last_avail)
		return false;
	if ((uint16_t)(idx - q->last_avail) > q->num)
		host_fail("avail idx %u runs more than %u ahead of %u", idx, q->num, q->last_avail);
	*head = qavail(q)[2 + q->last_avail % q->num];
	q->last_avail++;
	if (*head >= q->num)
		host_fail("avail head %u out of range", *head);
	return true;
}

static bool need_event(uint16_t event, uint16_t new_idx, uint16_t old)
{
	return (uint16_t)(new_idx - event - 1) < (uint16_t)(new_idx - old);
}

static void used_push(struct fq *q, uint32_t id, uint32_t len)
{
	volatile uint32_t *e = (volatile uint32_t *)(uintptr_t)(q->used + 4 + 8 * (q->used_idx % q->num));
	e[0] = id;
	e[1] = len;
	uint16_t old = q->used_idx++;
	qused(q)[1] = q->used_idx;
	bool irq = ev_idx() ? need_event(qavail(q)[2 + q->num], q->used_idx, old)
			    : !(qavail(q)[0] & 1);
	if (irq) {
		D.isr |= 1;
		D.raised = true;
		fake_irq_raise();
	}
}

/* With EVENT_IDX: ask to be notified about anything past what we used. */
static void arm_notify(struct fq *q)
{
	if (ev_idx() && q->ready)
		qused(q)[2 + 4 * q->num] = q->last_avail;
}

void fake_reset(void)
{
	memset(&D, 0, sizeof(D));
}

uint32_t fake_mmio_read(uint64_t off)
{
	struct fq *q = D.qsel < 3 ? &D.q[D.qsel] : NULL;
	switch (off) {
	case 0x000:
		return 0x74726976;
	case 0x004:
		return hcfg.version;
	case 0x008:
		return hcfg.device_id;
	case 0x00c:
		return 0x554d4551;
	case 0x010:
		return D.dfsel == 0 ? (uint32_t)dev_features()
				    : D.dfsel == 1 ? (uint32_t)(dev_features() >> 32) : 0;
	case 0x034:
		return q ? hcfg.qmax : 0;
	case 0x044:
		return q ? q->ready : 0;
	case 0x060:
		if (tg_irq_armed && !fake_in_irq_handler())
			host_fail("irq mode: InterruptStatus read outside the interrupt handler");
		return D.isr;
	case 0x070:
		return D.status;
	case 0x0fc:
		return 0;
	case 0x100:
		return (uint32_t)hcfg.cid;
	case 0x104:
		return (uint32_t)(hcfg.cid >> 32);
	default:
		if (off >= 0x100)
			return 0;
		host_fail("read of register 0x%llx", (unsigned long long)off);
	}
}

static void step(void);

void fake_mmio_write(uint64_t off, uint32_t v)
{
	struct fq *q = D.qsel < 3 ? &D.q[D.qsel] : NULL;
	bool qreg = off == 0x038 || off == 0x044 || (off >= 0x080 && off <= 0x0a4);
	if (qreg && !q)
		host_fail("queue register 0x%llx with QueueSel %u", (unsigned long long)off, D.qsel);
	if (qreg && (D.status & S_DRIVER_OK))
		host_fail("queue register 0x%llx written after DRIVER_OK", (unsigned long long)off);
	switch (off) {
	case 0x014:
		D.dfsel = v;
		break;
	case 0x020:
		if (D.drfsel == 0)
			D.drv_features = (D.drv_features & ~0xffffffffull) | v;
		else if (D.drfsel == 1)
			D.drv_features = (D.drv_features & 0xffffffffull) | (uint64_t)v << 32;
		break;
	case 0x024:
		D.drfsel = v;
		break;
	case 0x030:
		D.qsel = v;
		break;
	case 0x038:
		if (v == 0 || v > hcfg.qmax || (v & (v - 1)))
			host_fail("QueueNum %u (max %u)", v, hcfg.qmax);
		q->num = v;
		break;
	case 0x044:
		if (v && (!q->num || !q->desc || !q->avail || !q->used))
			host_fail("queue %u ready before it was set up", D.qsel);
		q->ready = v;
		break;
	case 0x050:
		if (!(D.status & S_DRIVER_OK))
			host_fail("notify before DRIVER_OK");
		if (v >= 3)
			host_fail("notify of queue %u", v);
		D.q[v].kicked = true;
		step();
		break;
	case 0x064:
		if (tg_irq_armed && !fake_in_irq_handler())
			host_fail("irq mode: InterruptACK written outside the interrupt handler");
		D.isr &= ~v;
		break;
	case 0x070:
		if (v == 0) {
			fake_reset();
			break;
		}
		if ((v & S_FEATURES_OK) && !(D.status & S_FEATURES_OK)) {
			if ((D.drv_features & ~dev_features()) ||
			    !((D.drv_features >> VIRTIO_F_VERSION_1) & 1))
				v &= ~(uint32_t)S_FEATURES_OK; /* refuse */
		}
		if ((v & S_DRIVER_OK) && !(v & S_FEATURES_OK))
			host_fail("DRIVER_OK without FEATURES_OK");
		if ((v & D.status) != D.status)
			host_fail("status 0x%x clears bits of 0x%x", v, D.status);
		D.status = v;
		break;
	case 0x080: q->desc = (q->desc & ~0xffffffffull) | v; break;
	case 0x084: q->desc = (q->desc & 0xffffffffull) | (uint64_t)v << 32; break;
	case 0x090: q->avail = (q->avail & ~0xffffffffull) | v; break;
	case 0x094: q->avail = (q->avail & 0xffffffffull) | (uint64_t)v << 32; break;
	case 0x0a0: q->used = (q->used & ~0xffffffffull) | v; break;
	case 0x0a4: q->used = (q->used & 0xffffffffull) | (uint64_t)v << 32; break;
	default:
		host_fail("write 0x%x to register 0x%llx", v, (unsigned long long)off);
	}
}

/* ---- host peer ---- */

struct opkt {
	struct vsock_hdr h;
	uint8_t *data;
	uint32_t len, off;
	struct opkt *next;
};
static struct opkt *ob_head, *ob_tail;
static uint64_t ob_bytes;

enum hstate { HS_FREE, HS_REQ_SENT, HS_OPEN, HS_WAIT_RST, HS_WAIT_SHUT, HS_DONE };

#define MAX_HCONNS 512
struct hconn {
	enum hstate st;
	bool initiated;
	uint32_t hport, gport;
	uint32_t buf_alloc, rx_cnt, fwd_cnt, fwd_told;
	uint64_t rx_total;
	uint8_t *rxq; /* received, not yet consumed (listener echo) */
	uint32_t tx_cnt, gbuf_alloc, gfwd_cnt;
	uint64_t tx_total, send_target;
	uint64_t stall_until, last_creq;
	bool guest_shut_send, host_rst_sent, reset_by_guest;
	uint8_t seed;
};
static struct hconn H[MAX_HCONNS];
static int nh, opened;
static uint64_t guest_rsts, stray_pkts;

static uint8_t host_byte(uint8_t seed, uint64_t i)
{
	return (uint8_t)(i * 13 + seed * 31 + (i >> 11));
}

static void ob_push(struct hconn *c, uint16_t op, uint32_t flags, const uint8_t *data, uint32_t len)
{
	struct opkt *p = calloc(1, sizeof(*p));
	p->h.src_cid = VSOCK_HOST_CID;
	p->h.dst_cid = hcfg.cid;
	p->h.src_port = c->hport;
	p->h.dst_port = c->gport;
	p->h.len = len;
	p->h.type = VSOCK_TYPE_STREAM;
	p->h.op = op;
	p->h.flags = flags;
	p->h.buf_alloc = c->buf_alloc;
	p->h.fwd_cnt = c->fwd_cnt;
	c->fwd_told = c->fwd_cnt;
	if (len) {
		p->data = malloc(len);
		memcpy(p->data, data, len);
	}
	p->len = len;
	if (ob_tail)
		ob_tail->next = p;
	else
		ob_head = p;
	ob_tail = p;
	ob_bytes += len;
}

static void ob_rst_raw(const struct vsock_hdr *h)
{
	struct hconn tmp = { .hport = h->dst_port, .gport = h->src_port };
	ob_push(&tmp, VSOCK_OP_RST, 0, NULL, 0);
}

static struct hconn *hfind(uint32_t gport, uint32_t hport)
{
	for (int i = 0; i < nh; i++)
		if (H[i].st != HS_FREE && H[i].st != HS_DONE && H[i].gport == gport &&
		    H[i].hport == hport)
			return &H[i];
	return NULL;
}

static struct hconn *hnew(void)
{
	if (nh == MAX_HCONNS)
		host_fail("too many host connections");
	struct hconn *c = &H[nh++];
	memset(c, 0, sizeof(*c));
	c->buf_alloc = hcfg.host_buf_alloc;
	c->rxq = malloc(c->buf_alloc);
	c->stall_until = D.steps + hcfg.stall_steps;
	return c;
}

static uint32_t guest_credit(const struct hconn *c)
{
	if (hcfg.ignore_credit)
		return 1u << 30;
	uint32_t unacked = c->tx_cnt - c->gfwd_cnt;
	return unacked > c->gbuf_alloc ? 0 : c->gbuf_alloc - unacked;
}

static void check_rx_expectations(struct hconn *c, const char *when)
{
	if (hcfg.rx_kind != HR_NONE && c->initiated && c->rx_total != hcfg.expect_rx)
		host_fail("conn %u: %s after %llu of %llu bytes", c->hport, when,
			  (unsigned long long)c->rx_total, (unsigned long long)hcfg.expect_rx);
}

static void host_rx(const struct vsock_hdr *h, const uint8_t *data)
{
	if (h->src_cid != hcfg.cid || h->dst_cid != VSOCK_HOST_CID || h->type != VSOCK_TYPE_STREAM)
		host_fail("bad header: src_cid %llu dst_cid %llu type %u",
			  (unsigned long long)h->src_cid, (unsigned long long)h->dst_cid, h->type);
	if (h->op != VSOCK_OP_RW && h->len)
		host_fail("op %u with payload %u", h->op, h->len);
	struct hconn *c = hfind(h->src_port, h->dst_port);
	if (h->op == VSOCK_OP_REQUEST) {
		if (c)
			host_fail("REQUEST on an open connection");
		if (!hcfg.listen || h->dst_port != hcfg.listen_port || hcfg.refuse) {
			ob_rst_raw(h);
			return;
		}
		if (hcfg.silent)
			return;
		if (h->src_port < 1024)
			host_fail("guest connects from port %u < 1024", h->src_port);
		c = hnew();
		c->hport = h->dst_port;
		c->gport = h->src_port;
		c->gbuf_alloc = h->buf_alloc;
		c->gfwd_cnt = h->fwd_cnt;
		c->st = HS_OPEN;
		ob_push(c, VSOCK_OP_RESPONSE, 0, NULL, 0);
		return;
	}
	if (!c) {
		stray_pkts++;
		for (int i = 0; i < nh; i++)
			if (H[i].st == HS_DONE && H[i].gport == h->src_port &&
			    H[i].hport == h->dst_port && H[i].host_rst_sent && h->op == VSOCK_OP_RST)
				host_fail("guest answered our RST with an RST (port %u)", h->dst_port);
		if (h->op != VSOCK_OP_RST)
			ob_rst_raw(h);
		return;
	}
	/* The guest cannot have consumed more than we sent. */
	if ((uint32_t)(h->fwd_cnt - c->gfwd_cnt) > (uint32_t)(c->tx_cnt - c->gfwd_cnt))
		host_fail("guest fwd_cnt %u beyond what we sent (%u)", h->fwd_cnt, c->tx_cnt);
	c->gbuf_alloc = h->buf_alloc;
	c->gfwd_cnt = h->fwd_cnt;

	switch (h->op) {
	case VSOCK_OP_RESPONSE:
		if (c->st != HS_REQ_SENT)
			host_fail("RESPONSE in state %d", c->st);
		c->st = HS_OPEN;
		break;
	case VSOCK_OP_RW: {
		if (c->guest_shut_send)
			host_fail("guest data after its SHUTDOWN");
		uint32_t freeb = c->buf_alloc - (c->rx_cnt - c->fwd_cnt);
		if (h->len > freeb)
			host_fail("guest overran host credit: %u bytes, %u free", h->len, freeb);
		for (uint32_t i = 0; i < h->len; i++) {
			uint64_t off = c->rx_total + i;
			uint8_t want = data[i];
			if (hcfg.rx_kind == HR_ECHO)
				want = host_byte(c->seed, off);
			else if (hcfg.rx_kind == HR_PATTERN)
				want = pattern_byte(off);
			if (data[i] != want)
				host_fail("conn %u: byte %llu is 0x%02x, want 0x%02x", c->hport,
					  (unsigned long long)off, data[i], want);
			c->rxq[(c->rx_cnt + i) % c->buf_alloc] = data[i];
		}
		c->rx_cnt += h->len;
		c->rx_total += h->len;
		if (hcfg.expect_rx && c->initiated && c->rx_total > hcfg.expect_rx)
			host_fail("conn %u: more than %llu bytes", c->hport,
				  (unsigned long long)hcfg.expect_rx);
		break;
	}
	case VSOCK_OP_SHUTDOWN:
		if (h->flags & VSOCK_SHUTDOWN_SEND)
			c->guest_shut_send = true;
		if ((h->flags & VSOCK_SHUTDOWN_BOTH) != VSOCK_SHUTDOWN_BOTH)
			host_fail("guest SHUTDOWN with flags %u, expected both", h->flags);
		if (c->initiated && c->st == HS_OPEN && hcfg.close_kind != HC_WAIT_GUEST)
			host_fail("conn %u: guest shut down first", c->hport);
		if (c->initiated)
			check_rx_expectations(c, "guest SHUTDOWN");
		if (!c->initiated && c->rx_cnt != c->fwd_cnt)
			host_fail("guest SHUTDOWN before its data was echoed");
		if (hcfg.no_rst_reply) {
			c->st = HS_WAIT_RST; /* the guest must give up and reset */
			break;
		}
		ob_push(c, VSOCK_OP_RST, 0, NULL, 0);
		c->host_rst_sent = true;
		c->st = HS_DONE;
		break;
	case VSOCK_OP_RST:
		guest_rsts++;
		if (c->st == HS_WAIT_RST) {
			check_rx_expectations(c, "guest RST");
			c->st = HS_DONE;
		} else {
			c->reset_by_guest = true;
			c->st = HS_DONE;
		}
		break;
	case VSOCK_OP_CREDIT_UPDATE:
		break;
	case VSOCK_OP_CREDIT_REQUEST:
		ob_push(c, VSOCK_OP_CREDIT_UPDATE, 0, NULL, 0);
		break;
	default:
		host_fail("guest sent op %u", h->op);
	}
}

static void host_tick(void)
{
	int active = 0;
	for (int i = 0; i < nh; i++)
		active += H[i].initiated && H[i].st != HS_DONE;
	while (opened < hcfg.nconns && active < hcfg.conc) {
		struct hconn *c = hnew();
		c->initiated = true;
		c->hport = 0x40000000u + (uint32_t)opened;
		c->gport = hcfg.guest_port;
		c->send_target = hcfg.send_bytes;
		c->seed = (uint8_t)(opened * 7 + 1);
		c->st = HS_REQ_SENT;
		ob_push(c, VSOCK_OP_REQUEST, 0, NULL, 0);
		opened++;
		active++;
	}
	static uint8_t chunk[VSOCK_MAX_PKT];
	for (int i = 0; i < nh; i++) {
		struct hconn *c = &H[i];
		if (c->st == HS_FREE || c->st == HS_DONE || c->st == HS_REQ_SENT)
			continue;
		/* The host application reads (and, as a listener, echoes). */
		if (D.steps >= c->stall_until) {
			uint32_t n = c->rx_cnt - c->fwd_cnt;
			if (hcfg.read_chunk && n > hcfg.read_chunk)
				n = hcfg.read_chunk;
			if (!c->initiated) {
				n = n < guest_credit(c) ? n : guest_credit(c);
				uint32_t done = 0;
				while (done < n) {
					uint32_t k = n - done > VSOCK_MAX_PKT ? VSOCK_MAX_PKT : n - done;
					for (uint32_t j = 0; j < k; j++) {
						chunk[j] = c->rxq[(c->fwd_cnt + done + j) % c->buf_alloc];
						if ((int64_t)(c->tx_total + j) == hcfg.corrupt_at)
							chunk[j] ^= 0x40;
					}
					c->fwd_cnt += k; /* the header carries the new count */
					ob_push(c, VSOCK_OP_RW, 0, chunk, k);
					c->tx_cnt += k;
					c->tx_total += k;
					done += k;
				}
				if (hcfg.close_early && c->tx_total * 2 >= hcfg.expect_rx &&
				    !c->host_rst_sent) {
					ob_push(c, VSOCK_OP_RST, 0, NULL, 0);
					c->host_rst_sent = true;
					c->st = HS_DONE;
					continue;
				}
			} else {
				c->fwd_cnt += n;
			}
			if (c->fwd_cnt != c->fwd_told)
				ob_push(c, VSOCK_OP_CREDIT_UPDATE, 0, NULL, 0);
		}
		if (!c->initiated)
			continue;
		/* Host-initiated: send our stream within the guest's credit. */
		if (c->st == HS_OPEN && c->tx_total < c->send_target) {
			uint64_t budget = 256 * 1024;
			while (c->tx_total < c->send_target && budget) {
				uint64_t k = c->send_target - c->tx_total;
				uint32_t cr = guest_credit(c);
				if (k > cr)
					k = cr;
				if (k > VSOCK_MAX_PKT)
					k = VSOCK_MAX_PKT;
				if (k > budget)
					k = budget;
				if (!k) {
					if (hcfg.credit_requests && D.steps - c->last_creq > 20) {
						ob_push(c, VSOCK_OP_CREDIT_REQUEST, 0, NULL, 0);
						c->last_creq = D.steps;
					}
					break;
				}
				for (uint32_t j = 0; j < k; j++)
					chunk[j] = host_byte(c->seed, c->tx_total + j);
				ob_push(c, VSOCK_OP_RW, 0, chunk, (uint32_t)k);
				c->tx_cnt += (uint32_t)k;
				c->tx_total += k;
				budget -= k;
			}
		}
		if (c->st != HS_OPEN || c->tx_total < c->send_target)
			continue;
		bool rx_complete = (hcfg.rx_kind == HR_NONE || c->rx_total == hcfg.expect_rx) &&
				   c->fwd_cnt == c->rx_cnt;
		switch (hcfg.close_kind) {
		case HC_SHUT_BOTH:
			if (rx_complete) {
				ob_push(c, VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_BOTH, NULL, 0);
				c->st = HS_WAIT_RST;
			}
			break;
		case HC_SHUT_SEND:
			ob_push(c, VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_SEND, NULL, 0);
			c->st = HS_WAIT_SHUT;
			break;
		case HC_RST:
			if (rx_complete) {
				ob_push(c, VSOCK_OP_RST, 0, NULL, 0);
				c->host_rst_sent = true;
				c->st = HS_DONE;
			}
			break;
		case HC_WAIT_GUEST:
			break;
		}
	}
}

/* ---- the device's work ---- */

static void process_tx(void)
{
	struct fq *q = &D.q[1];
	static uint8_t buf[sizeof(struct vsock_hdr) + VSOCK_MAX_PKT];
	uint16_t head;
	while (avail_pop(q, &head)) {
		size_t total = 0;
		uint16_t i = head;
		for (uint32_t n = 0;; n++) {
			struct virtq_desc *d = qdesc(q, i);
			if (n >= q->num)
				host_fail("tx chain loops");
			if (d->flags & VIRTQ_DESC_F_WRITE)
				host_fail("tx descriptor %u is device-writable", i);
			if (d->len > sizeof(buf) - total)
				host_fail("tx chain longer than header + 64 KiB");
			memcpy(buf + total, (void *)(uintptr_t)d->addr, d->len);
			total += d->len;
			if (!(d->flags & VIRTQ_DESC_F_NEXT))
				break;
			i = d->next;
			if (i >= q->num)
				host_fail("tx next %u out of range", i);
		}
		if (total < sizeof(struct vsock_hdr))
			host_fail("tx chain of %zu bytes", total);
		struct vsock_hdr h;
		memcpy(&h, buf, sizeof(h));
		if (h.len != total - sizeof(h))
			host_fail("tx header len %u, chain carries %zu", h.len, total - sizeof(h));
		D.tx_seen++;
		host_rx(&h, buf + sizeof(h));
		if (hcfg.fault == F_TX_BAD_ID && D.tx_seen > hcfg.fault_after && !D.fault_done) {
			D.fault_done = true;
			head++; /* odd: the payload descriptor, never a chain head */
		}
		used_push(q, head, 0);
	}
}

static void deliver_rx(void)
{
	struct fq *q = &D.q[0];
	if (q->starved && !q->kicked)
		return;
	q->kicked = false;
	q->starved = false;
	while (ob_head) {
		uint16_t head;
		if (!avail_pop(q, &head)) {
			q->starved = true;
			break;
		}
		struct virtq_desc *d = qdesc(q, head);
		if (!(d->flags & VIRTQ_DESC_F_WRITE) || (d->flags & VIRTQ_DESC_F_NEXT))
			host_fail("rx descriptor %u flags 0x%x", head, d->flags);
		if (d->len < sizeof(struct vsock_hdr))
			host_fail("rx buffer of %u bytes", d->len);
		struct opkt *p = ob_head;
		uint32_t n = p->len - p->off;
		if (n > d->len - sizeof(struct vsock_hdr))
			n = d->len - (uint32_t)sizeof(struct vsock_hdr);
		struct vsock_hdr h = p->h;
		h.len = n;
		uint8_t *b = (uint8_t *)(uintptr_t)d->addr;
		memcpy(b, &h, sizeof(h));
		if (n)
			memcpy(b + sizeof(h), p->data + p->off, n);
		uint32_t used_len = (uint32_t)sizeof(h) + n;
		uint32_t id = head;
		D.delivered++;
		if (D.delivered > hcfg.fault_after && !D.fault_done) {
			if (hcfg.fault == F_RX_BAD_ID) {
				id = q->num + 3;
				D.fault_done = true;
			} else if (hcfg.fault == F_RX_BAD_LEN) {
				used_len = d->len + 1;
				D.fault_done = true;
			} else if (hcfg.fault == F_RX_HDR_LEN && n) {
				used_len = (uint32_t)sizeof(h) + n - 1;
				D.fault_done = true;
			} else if (hcfg.fault == F_USED_IDX_JUMP) {
				q->used_idx = (uint16_t)(q->used_idx + q->num + 1);
				D.fault_done = true;
			}
		}
		used_push(q, id, used_len);
		p->off += n;
		if (p->off == p->len) {
			ob_head = p->next;
			if (!ob_head)
				ob_tail = NULL;
			ob_bytes -= p->len;
			free(p->data);
			free(p);
		}
	}
}

static void inject_event(uint32_t ev)
{
	struct fq *q = &D.q[2];
	uint16_t head;
	if (!avail_pop(q, &head))
		host_fail("no event buffer posted");
	struct virtq_desc *d = qdesc(q, head);
	if (!(d->flags & VIRTQ_DESC_F_WRITE) || d->len < 4)
		host_fail("bad event buffer");
	memcpy((void *)(uintptr_t)d->addr, &ev, 4);
	used_push(q, head, 4);
}

static void step(void)
{
	if (!(D.status & S_DRIVER_OK))
		return;
	if (++D.steps > 20000000)
		host_fail("runaway: %llu device steps", (unsigned long long)D.steps);
	if (D.q[1].kicked) {
		D.q[1].kicked = false;
		process_tx();
	}
	D.q[2].kicked = false;
	if (hcfg.fault == F_TRANSPORT_RESET && D.delivered > hcfg.fault_after && !D.fault_done) {
		D.fault_done = true;
		hcfg.cid = 7;
		inject_event(0);
	}
	host_tick();
	deliver_rx();
	for (int i = 0; i < 3; i++)
		arm_notify(&D.q[i]);
}

void fake_wait(uint32_t us)
{
	if (tg_irq_armed)
		host_fail("irq mode: the guest slept on the wait port");
	if (D.raised) {
		D.raised = false;
		return;
	}
	fake_tsc += (uint64_t)(us ? us : 1000) * (FAKE_TSC_HZ / 1000000);
	step();
	D.raised = false;
}

void fake_idle(uint32_t us)
{
	fake_tsc += (uint64_t)us * (FAKE_TSC_HZ / 1000000);
	step();
}

int fake_final_check(char *why, size_t n)
{
	if (hcfg.nconns) {
		if (opened != hcfg.nconns) {
			snprintf(why, n, "opened %d of %d connections", opened, hcfg.nconns);
			return -1;
		}
		for (int i = 0; i < nh; i++) {
			struct hconn *c = &H[i];
			if (!c->initiated)
				continue;
			if (c->st != HS_DONE) {
				snprintf(why, n, "conn %u still in state %d", c->hport, c->st);
				return -1;
			}
			if (c->tx_total != c->send_target ||
			    (hcfg.rx_kind != HR_NONE && c->rx_total != hcfg.expect_rx)) {
				snprintf(why, n, "conn %u: sent %llu/%llu, got %llu/%llu", c->hport,
					 (unsigned long long)c->tx_total,
					 (unsigned long long)c->send_target,
					 (unsigned long long)c->rx_total,
					 (unsigned long long)hcfg.expect_rx);
				return -1;
			}
			if (c->reset_by_guest && hcfg.close_kind != HC_SHUT_BOTH) {
				snprintf(why, n, "conn %u reset by the guest", c->hport);
				return -1;
			}
		}
	}
	if (hcfg.listen && !hcfg.refuse && !hcfg.silent) {
		int seen = 0;
		for (int i = 0; i < nh; i++) {
			if (H[i].initiated)
				continue;
			seen++;
			if (H[i].rx_total != hcfg.expect_rx || H[i].tx_total != hcfg.expect_rx) {
				snprintf(why, n, "listener conn got %llu, echoed %llu of %llu",
					 (unsigned long long)H[i].rx_total,
					 (unsigned long long)H[i].tx_total,
					 (unsigned long long)hcfg.expect_rx);
				return -1;
			}
		}
		if (seen != 1) {
			snprintf(why, n, "%d guest connections, want 1", seen);
			return -1;
		}
	}
	return 0;
}
