/* vsock.c - virtio-vsock connections, credit and the event loop. */
#include "vsock.h"
#include "console.h"
#include "irq.h"
#include "lib.h"
#include "mem.h"
#include "platform.h"
#include "timer.h"
#include "virtio.h"

_Static_assert(VSOCK_MAX_TX_SLOTS * 2 == VIRTQ_MAX_SIZE, "a TX slot is two descriptors");
_Static_assert((VSOCK_BUF_ALLOC & (VSOCK_BUF_ALLOC - 1)) == 0, "buf_alloc is a power of two");

#define HDR_LEN ((uint32_t)sizeof(struct vsock_hdr))
#define FIFO_DONE 0x80000000u
#define RSTQ_LEN 32
#define EVQ_BUFS 4
#define VIRTIO_VSOCK_EVENT_TRANSPORT_RESET 0
#define WAIT_US 1000
/* irq mode: the longest wait for an interrupt before the loop runs its
 * timers (credit retry, close deadlines, the progress timeout) anyway. */
#define IRQ_TICK_MS 100
#define CREDIT_RETRY_MS 1000
#define DRAIN_MS 1000

struct txslot {
	struct vsock_hdr hdr; /* read by the device: stays put until used */
	int16_t conn;	      /* owning connection, -1 for table-less RSTs */
	bool busy;
	uint16_t fifo_pos;
	uint32_t len; /* payload bytes */
};

/* An RST owed to a packet that matched no connection. */
struct rst_owed {
	uint64_t cid;
	uint32_t src_port, dst_port; /* ours, theirs */
};

static struct {
	const struct tg_config *cfg;
	const struct vsock_mode *mode;
	struct virtio_dev dev;
	struct virtq rxq, txq, evq;
	uint64_t cid;

	/* RX: descriptor i <-> buffer i, one descriptor per buffer. */
	uint8_t *rxbuf;
	uint32_t rx_stride, rx_len;
	bool rx_posted[VIRTQ_MAX_SIZE];

	uint32_t *evbuf; /* EVQ_BUFS buffers, 8 bytes apart */
	bool ev_posted[EVQ_BUFS];

	struct txslot *slots;
	uint16_t nslots, nfree;
	uint16_t freelist[VSOCK_MAX_TX_SLOTS];

	struct conn conns[VSOCK_MAX_CONNS];
	struct rst_owed rstq[RSTQ_LEN];
	int nrst;

	bool listening;
	uint32_t listen_port;
	uint64_t closed;
	uint32_t rr;

	uint64_t last_progress, timeout_tsc, close_wait_tsc, credit_retry_tsc;
	/* irq mode: irq_count() before the current pass; the last wait ended
	 * without an interrupt. */
	uint64_t irq_seen, irq_tick_tsc;
	bool irq_timed_out;
	struct {
		uint64_t rx_pkts, tx_pkts, rx_bytes, tx_bytes, waits, dropped, rst_sent;
		/* irq mode: waits that ended by IRQ_TICK_MS, and of those the
		 * ones after which the rings held work no interrupt announced. */
		uint64_t irq_timeouts, unsignalled;
	} st;
} E;

uint64_t vsock_closed(void)
{
	return E.closed;
}

uint64_t vsock_guest_cid(void)
{
	return E.cid;
}

/* ---- credit ---- */

uint32_t vsock_peer_credit(const struct conn *c)
{
	/* Bytes the peer has not yet consumed; more than it allows (or a
	 * fwd_cnt ahead of what we sent) leaves no credit. */
	uint32_t unacked = c->tx_cnt - c->peer_fwd_cnt;
	if (unacked > c->peer_buf_alloc)
		return 0;
	return c->peer_buf_alloc - unacked;
}

bool vsock_need_credit_update(const struct conn *c)
{
	if (c->fwd_cnt == c->fwd_told || (c->peer_shut & VSOCK_SHUTDOWN_SEND))
		return false;
	/* Space the peer believes we have left; tell it more once that is
	 * below half the window. */
	uint32_t peer_view_used = c->rx_cnt - c->fwd_told;
	uint32_t peer_view_free = peer_view_used >= c->buf_alloc ? 0 : c->buf_alloc - peer_view_used;
	return peer_view_free < c->buf_alloc / 2;
}

static void update_peer_credit(struct conn *c, const struct vsock_hdr *h)
{
	if (h->buf_alloc != c->peer_buf_alloc || h->fwd_cnt != c->peer_fwd_cnt)
		c->credit_req_sent = false;
	c->peer_buf_alloc = h->buf_alloc;
	c->peer_fwd_cnt = h->fwd_cnt;
}

/* ---- connection table ---- */

static struct conn *conn_find(uint64_t cid, uint32_t peer_port, uint32_t local_port)
{
	for (int i = 0; i < VSOCK_MAX_CONNS; i++) {
		struct conn *c = &E.conns[i];
		if (c->state != CONN_FREE && c->state != CONN_CLOSED && c->peer_cid == cid &&
		    c->peer_port == peer_port && c->local_port == local_port)
			return c;
	}
	return NULL;
}

static void conn_free(struct conn *c);

static struct conn *conn_alloc(void)
{
	struct conn *c = NULL;
	for (int i = 0; i < VSOCK_MAX_CONNS && !c; i++)
		if (E.conns[i].state == CONN_FREE)
			c = &E.conns[i];
	/* A closed connection whose packets all completed is free in all but
	 * name (the loop frees it on its next pass): take it now. */
	for (int i = 0; i < VSOCK_MAX_CONNS && !c; i++)
		if (E.conns[i].state == CONN_CLOSED && E.conns[i].inflight == 0) {
			c = &E.conns[i];
			conn_free(c);
		}
	if (!c)
		return NULL;
	/* The fifo array needs no clearing: head == tail. */
	memset(c, 0, offsetof(struct conn, fifo));
	c->buf = NULL;
	c->id = (uint16_t)(c - E.conns);
	c->buf_alloc = VSOCK_BUF_ALLOC;
	return c;
}

static void conn_close(struct conn *c, enum close_reason why)
{
	c->state = CONN_CLOSED;
	c->why = why;
	E.closed++;
	E.mode->closed(c);
}

static void conn_free(struct conn *c)
{
	if (E.mode->release)
		E.mode->release(c);
	c->state = CONN_FREE;
}

void vsock_reset(struct conn *c)
{
	if (c->state == CONN_FREE || c->state == CONN_CLOSED || c->state == CONN_RESETTING)
		return;
	c->state = CONN_RESETTING;
	c->why = CLOSE_OUR_RST;
}

static void protocol_reset(struct conn *c, const char *what)
{
	tg_log("port %u<->%u: %s: resetting", c->local_port, c->peer_port, what);
	vsock_reset(c);
}

/* ---- TX ---- */

static bool tx_raw(struct conn *c, uint64_t dst_cid, uint32_t src_port, uint32_t dst_port,
		   uint16_t op, uint32_t flags, const void *data, uint32_t len)
{
	if (E.nfree == 0)
		return false;
	uint16_t s = E.freelist[--E.nfree];
	struct txslot *t = &E.slots[s];
	struct vsock_hdr *h = &t->hdr;
	h->src_cid = E.cid;
	h->dst_cid = dst_cid;
	h->src_port = src_port;
	h->dst_port = dst_port;
	h->len = len;
	h->type = VSOCK_TYPE_STREAM;
	h->op = op;
	h->flags = flags;
	h->buf_alloc = c ? c->buf_alloc : 0;
	h->fwd_cnt = c ? c->fwd_cnt : 0;
	t->conn = c ? (int16_t)c->id : -1;
	t->busy = true;
	t->len = len;

	uint16_t d = (uint16_t)(2 * s);
	if (len) {
		virtq_set_desc(&E.txq, d, virt_to_phys(h), HDR_LEN, VIRTQ_DESC_F_NEXT, d + 1);
		virtq_set_desc(&E.txq, d + 1, virt_to_phys(data), len, 0, 0);
	} else {
		virtq_set_desc(&E.txq, d, virt_to_phys(h), HDR_LEN, 0, 0);
	}
	if (c) {
		c->fwd_told = c->fwd_cnt;
		c->inflight++;
		if (len) {
			t->fifo_pos = c->fifo_tail;
			c->fifo[c->fifo_tail % VSOCK_MAX_TX_SLOTS] = len;
			c->fifo_tail++;
		}
	}
	virtq_add(&E.txq, d);
	E.st.tx_pkts++;
	E.st.tx_bytes += len;
	if (op == VSOCK_OP_RST)
		E.st.rst_sent++;
	return true;
}

static bool tx_conn(struct conn *c, uint16_t op, uint32_t flags, const void *data, uint32_t len)
{
	return tx_raw(c, c->peer_cid, c->local_port, c->peer_port, op, flags, data, len);
}

/* Answer a packet that matched no connection with an RST (never an RST). */
static void rst_owed(const struct vsock_hdr *h)
{
	if (h->op == VSOCK_OP_RST)
		return;
	if (E.nrst == RSTQ_LEN) {
		E.st.dropped++;
		return;
	}
	E.rstq[E.nrst].cid = h->src_cid;
	E.rstq[E.nrst].src_port = h->dst_port;
	E.rstq[E.nrst].dst_port = h->src_port;
	E.nrst++;
}

static void tx_data(struct conn *c, uint64_t now)
{
	if (!E.mode->tx_ready)
		return;
	while (E.nfree) {
		const uint8_t *p;
		uint32_t n = E.mode->tx_ready(c, &p);
		if (n == 0)
			return;
		uint32_t credit = vsock_peer_credit(c);
		if (credit == 0) {
			/* Stalled on the peer: ask once, again after a while. */
			if ((!c->credit_req_sent || now - c->credit_req_tsc > E.credit_retry_tsc) &&
			    tx_conn(c, VSOCK_OP_CREDIT_REQUEST, 0, NULL, 0)) {
				c->credit_req_sent = true;
				c->credit_req_tsc = now;
			}
			return;
		}
		n = MIN(n, credit);
		n = MIN(n, VSOCK_MAX_PKT);
		if (!tx_conn(c, VSOCK_OP_RW, 0, p, n))
			return;
		c->tx_cnt += n;
		c->tx_total += n;
	}
}

static void conn_pump(struct conn *c, uint64_t now)
{
	switch (c->state) {
	case CONN_FREE:
		return;
	case CONN_CLOSED:
		if (c->inflight == 0)
			conn_free(c);
		return;
	case CONN_RESETTING:
		if (tx_conn(c, VSOCK_OP_RST, 0, NULL, 0))
			conn_close(c, c->why);
		return;
	case CONN_CONNECTING:
		if ((c->pend & PEND_REQUEST) && tx_conn(c, VSOCK_OP_REQUEST, 0, NULL, 0))
			c->pend &= (uint8_t)~PEND_REQUEST;
		return;
	case CONN_CLOSING:
		if ((int64_t)(now - c->close_deadline) > 0) {
			tg_log("port %u<->%u: no RST after our SHUTDOWN: resetting", c->local_port,
			       c->peer_port);
			vsock_reset(c);
			conn_pump(c, now);
			return;
		}
		break;
	case CONN_OPEN:
		break;
	}
	if (c->pend & PEND_RESPONSE) {
		if (!tx_conn(c, VSOCK_OP_RESPONSE, 0, NULL, 0))
			return;
		c->pend &= (uint8_t)~PEND_RESPONSE;
	}
	if (c->state == CONN_OPEN && !(c->peer_shut & VSOCK_SHUTDOWN_RCV))
		tx_data(c, now);
	if (((c->pend & PEND_CREDIT_UPDATE) || vsock_need_credit_update(c)) &&
	    tx_conn(c, VSOCK_OP_CREDIT_UPDATE, 0, NULL, 0))
		c->pend &= (uint8_t)~PEND_CREDIT_UPDATE;
	if (c->state == CONN_OPEN && E.mode->want_shutdown(c) &&
	    tx_conn(c, VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_BOTH, NULL, 0)) {
		c->state = CONN_CLOSING;
		c->close_deadline = now + E.close_wait_tsc;
	}
}

static void tx_pump(uint64_t now)
{
	while (E.nrst && E.nfree) {
		struct rst_owed *r = &E.rstq[--E.nrst];
		tx_raw(NULL, r->cid, r->src_port, r->dst_port, VSOCK_OP_RST, 0, NULL, 0);
	}
	/* Round robin, so one busy connection cannot starve the rest. */
	for (uint32_t k = 0; k < VSOCK_MAX_CONNS; k++)
		conn_pump(&E.conns[(E.rr + k) % VSOCK_MAX_CONNS], now);
	E.rr++;
	virtq_publish(&E.txq);
}

static int tx_reap(void)
{
	int n = 0;
	uint32_t id, len;
	while (virtq_get_used(&E.txq, &id, &len)) {
		uint32_t s = id / 2;
		if ((id & 1) || s >= E.nslots || !E.slots[s].busy)
			tg_die(EXIT_MISMATCH, "vsock: tx used id %u is not a packet in flight", id);
		struct txslot *t = &E.slots[s];
		if (len > HDR_LEN + t->len)
			tg_die(EXIT_MISMATCH, "vsock: tx used len %u > packet size %u", len,
			       HDR_LEN + t->len);
		t->busy = false;
		E.freelist[E.nfree++] = (uint16_t)s;
		if (t->conn >= 0) {
			struct conn *c = &E.conns[t->conn];
			c->inflight--;
			if (t->len) {
				c->fifo[t->fifo_pos % VSOCK_MAX_TX_SLOTS] |= FIFO_DONE;
				while (c->fifo_head != c->fifo_tail &&
				       (c->fifo[c->fifo_head % VSOCK_MAX_TX_SLOTS] & FIFO_DONE)) {
					uint32_t plen =
						c->fifo[c->fifo_head % VSOCK_MAX_TX_SLOTS] & ~FIFO_DONE;
					c->fifo_head++;
					if (E.mode->tx_done)
						E.mode->tx_done(c, plen);
				}
			}
		}
		n++;
	}
	return n;
}

/* ---- RX ---- */

static void rx_post(uint16_t i)
{
	virtq_set_desc(&E.rxq, i, virt_to_phys(E.rxbuf + (size_t)i * E.rx_stride), E.rx_len,
		       VIRTQ_DESC_F_WRITE, 0);
	virtq_add(&E.rxq, i);
	E.rx_posted[i] = true;
}

static void accept_conn(const struct vsock_hdr *h)
{
	struct conn *c = conn_alloc();
	if (!c) {
		/* Closed connections may only wait for completions that are
		 * already in the used ring. */
		tx_reap();
		c = conn_alloc();
	}
	if (!c) {
		tg_log("connection table full (%d): refusing port %u", VSOCK_MAX_CONNS, h->src_port);
		rst_owed(h);
		return;
	}
	c->peer_cid = h->src_cid;
	c->peer_port = h->src_port;
	c->local_port = h->dst_port;
	c->peer_buf_alloc = h->buf_alloc;
	c->peer_fwd_cnt = h->fwd_cnt;
	c->state = CONN_OPEN;
	c->pend = PEND_RESPONSE;
	if (!E.mode->open(c)) {
		c->state = CONN_FREE;
		rst_owed(h);
	}
}

static void rx_packet(const struct vsock_hdr *h, const uint8_t *payload)
{
	if (h->dst_cid != E.cid) {
		E.st.dropped++;
		return;
	}
	if (h->type != VSOCK_TYPE_STREAM) {
		rst_owed(h);
		return;
	}
	struct conn *c = conn_find(h->src_cid, h->src_port, h->dst_port);
	if (!c) {
		if (h->op == VSOCK_OP_REQUEST && E.listening && h->dst_port == E.listen_port)
			accept_conn(h);
		else
			rst_owed(h);
		return;
	}
	if (c->state == CONN_RESETTING) {
		/* Our RST is on its way; if the peer reset first, do not send it. */
		if (h->op == VSOCK_OP_RST)
			conn_close(c, CLOSE_PEER_RST);
		return;
	}
	update_peer_credit(c, h);

	switch (h->op) {
	case VSOCK_OP_REQUEST:
		protocol_reset(c, "REQUEST on an open connection");
		break;
	case VSOCK_OP_RESPONSE:
		if (c->state != CONN_CONNECTING)
			protocol_reset(c, "unexpected RESPONSE");
		else
			c->state = CONN_OPEN;
		break;
	case VSOCK_OP_RST:
		conn_close(c, c->state == CONN_CONNECTING ? CLOSE_REFUSED : CLOSE_PEER_RST);
		break;
	case VSOCK_OP_SHUTDOWN:
		if (c->state == CONN_CONNECTING) {
			protocol_reset(c, "SHUTDOWN before RESPONSE");
			break;
		}
		c->peer_shut |= (uint8_t)(h->flags & VSOCK_SHUTDOWN_BOTH);
		if (c->peer_shut == VSOCK_SHUTDOWN_BOTH)
			vsock_reset(c); /* 5.10.6.5: the peer waits for our RST */
		else if (E.mode->peer_shutdown)
			E.mode->peer_shutdown(c);
		break;
	case VSOCK_OP_RW: {
		if (c->state == CONN_CONNECTING) {
			protocol_reset(c, "data before RESPONSE");
			break;
		}
		if (c->peer_shut & VSOCK_SHUTDOWN_SEND)
			tg_die(EXIT_MISMATCH, "port %u<->%u: %u bytes after the peer's SHUTDOWN(SEND)",
			       c->local_port, c->peer_port, h->len);
		uint32_t used = c->rx_cnt - c->fwd_cnt;
		if (h->len > c->buf_alloc - used)
			tg_die(EXIT_MISMATCH,
			       "port %u<->%u: peer overran our credit: %u bytes, %u free of %u",
			       c->local_port, c->peer_port, h->len, c->buf_alloc - used, c->buf_alloc);
		if (h->len) {
			E.mode->rx(c, payload, h->len);
			c->rx_cnt += h->len;
			c->rx_total += h->len;
			E.st.rx_bytes += h->len;
		}
		break;
	}
	case VSOCK_OP_CREDIT_UPDATE:
		break; /* the credit fields were taken above */
	case VSOCK_OP_CREDIT_REQUEST:
		c->pend |= PEND_CREDIT_UPDATE;
		break;
	default:
		protocol_reset(c, "unknown op");
		break;
	}
}

static int rx_poll(void)
{
	int n = 0;
	uint32_t id, len;
	while (virtq_get_used(&E.rxq, &id, &len)) {
		if (!E.rx_posted[id])
			tg_die(EXIT_MISMATCH, "vsock: rx used id %u was not posted", id);
		if (len > E.rx_len || len < HDR_LEN)
			tg_die(EXIT_MISMATCH, "vsock: rx used len %u outside [%u, %u]", len, HDR_LEN,
			       E.rx_len);
		E.rx_posted[id] = false;
		const uint8_t *b = E.rxbuf + (size_t)id * E.rx_stride;
		struct vsock_hdr h;
		memcpy(&h, b, HDR_LEN); /* read the header once */
		barrier();
		if (h.len > len - HDR_LEN)
			tg_die(EXIT_MISMATCH, "vsock: rx header len %u > used len %u - %u (op %u)", h.len,
			       len, HDR_LEN, h.op);
		E.st.rx_pkts++;
		rx_packet(&h, b + HDR_LEN);
		rx_post((uint16_t)id);
		n++;
	}
	if (n)
		virtq_publish(&E.rxq);
	return n;
}

/* ---- events ---- */

static void ev_post(uint16_t i)
{
	virtq_set_desc(&E.evq, i, virt_to_phys(&E.evbuf[2 * i]), 8, VIRTQ_DESC_F_WRITE, 0);
	virtq_add(&E.evq, i);
	E.ev_posted[i] = true;
}

static int ev_poll(void)
{
	int n = 0;
	uint32_t id, len;
	while (virtq_get_used(&E.evq, &id, &len)) {
		if (id >= EVQ_BUFS || !E.ev_posted[id])
			tg_die(EXIT_MISMATCH, "vsock: event used id %u was not posted", id);
		if (len < 4 || len > 8)
			tg_die(EXIT_MISMATCH, "vsock: event used len %u", len);
		E.ev_posted[id] = false;
		uint32_t ev = E.evbuf[2 * id];
		if (ev == VIRTIO_VSOCK_EVENT_TRANSPORT_RESET) {
			E.cid = virtio_config_read64(&E.dev, 0);
			tg_log("vsock: transport reset, guest cid now %lu", E.cid);
			for (int i = 0; i < VSOCK_MAX_CONNS; i++) {
				struct conn *c = &E.conns[i];
				if (c->state != CONN_FREE && c->state != CONN_CLOSED)
					conn_close(c, CLOSE_TRANSPORT_RESET);
			}
			E.nrst = 0;
		} else {
			tg_log("vsock: unknown event %u ignored", ev);
		}
		ev_post((uint16_t)id);
		n++;
	}
	if (n)
		virtq_publish(&E.evq);
	return n;
}

/* ---- setup ---- */

void vsock_start(const struct tg_config *cfg, const struct vsock_mode *mode)
{
	E.cfg = cfg;
	E.mode = mode;
	if (virtio_find(cfg, VIRTIO_ID_VSOCK, &E.dev) != 0)
		tg_die(EXIT_NO_DEVICE, "no virtio-vsock device (%d virtio_mmio.device entries)",
		       cfg->ndevs);
	if (cfg->irq)
		irq_start(&E.dev); /* before the reset: no interrupt of the new session is missed */
	if (virtio_negotiate(&E.dev, 1ull << VIRTIO_F_VERSION_1, 1ull << VIRTIO_F_EVENT_IDX) != 0 ||
	    virtq_setup(&E.dev, &E.rxq, 0, VIRTQ_MAX_SIZE) != 0 ||
	    virtq_setup(&E.dev, &E.txq, 1, VIRTQ_MAX_SIZE) != 0 ||
	    virtq_setup(&E.dev, &E.evq, 2, EVQ_BUFS) != 0)
		tg_die(EXIT_NO_DEVICE, "virtio-vsock at 0x%lx unusable", E.dev.base);
	if (E.txq.size < 2)
		tg_die(EXIT_NO_DEVICE, "virtio-vsock tx queue too small (%u)", E.txq.size);

	E.cid = virtio_config_read64(&E.dev, 0);
	if (E.cid <= VSOCK_HOST_CID || E.cid >= 0xffffffffu)
		tg_die(EXIT_NO_DEVICE, "virtio-vsock guest_cid %lu is not a guest cid", E.cid);

	E.rx_len = HDR_LEN + cfg->bufsize;
	E.rx_stride = (E.rx_len + 63) & ~63u;
	E.rxbuf = heap_alloc((size_t)E.rx_stride * E.rxq.size, 4096);
	E.evbuf = heap_alloc(8 * EVQ_BUFS, 64);
	E.nslots = E.txq.size / 2;
	E.slots = heap_alloc(sizeof(struct txslot) * E.nslots, 64);
	if (!E.rxbuf || !E.evbuf || !E.slots)
		tg_die(EXIT_INTERNAL, "out of memory for vsock buffers (%lu bytes free)",
		       heap_free_bytes());
	for (uint16_t s = 0; s < E.nslots; s++)
		E.freelist[E.nfree++] = (uint16_t)(E.nslots - 1 - s);
	for (uint16_t i = 0; i < E.rxq.size; i++)
		rx_post(i);
	for (uint16_t i = 0; i < MIN(E.evq.size, EVQ_BUFS); i++)
		ev_post(i);

	virtio_driver_ok(&E.dev);
	virtq_publish(&E.rxq);
	virtq_publish(&E.evq);

	uint64_t timeout_ms = cfg->timeout_s * 1000;
	E.timeout_tsc = ms_to_tsc(timeout_ms);
	/* How long we wait for the RST that answers our SHUTDOWN: half the
	 * timeout (15 s if there is none), at least a second. */
	E.close_wait_tsc = ms_to_tsc(timeout_ms ? MAX(timeout_ms / 2, 1000) : 15000);
	E.credit_retry_tsc = ms_to_tsc(CREDIT_RETRY_MS);
	E.irq_tick_tsc = ms_to_tsc(IRQ_TICK_MS);
	E.last_progress = rdtsc();
	tg_log("vsock: device at 0x%lx irq %u, guest cid %lu, features 0x%lx, queues %u/%u/%u, "
	       "tsc %lu MHz (%s)",
	       E.dev.base, E.dev.irq, E.cid, E.dev.features, E.rxq.size, E.txq.size, E.evq.size,
	       tsc_hz() / 1000000, tsc_source_name());
}

void vsock_listen(uint32_t port)
{
	E.listening = true;
	E.listen_port = port;
	tg_log("listening %u", port);
}

struct conn *vsock_connect(uint32_t port)
{
	struct conn *c = conn_alloc();
	c->peer_cid = VSOCK_HOST_CID;
	c->peer_port = port;
	/* Any local port >= 1024 below the host's [2^30, 2^31) range. */
	c->local_port = 1024 + (uint32_t)((rdtsc() >> 4) % 64512);
	c->state = CONN_CONNECTING;
	c->pend = PEND_REQUEST;
	if (!E.mode->open(c))
		tg_die(EXIT_INTERNAL, "cannot open a connection");
	tg_log("connecting to %u:%u from port %u", VSOCK_HOST_CID, port, c->local_port);
	return c;
}

void vsock_log_stats(void)
{
	char irqs[160] = "";
	if (E.cfg->irq)
		tg_snprintf(irqs, sizeof(irqs),
			    ", irqs %lu (no status %lu), irq waits timed out %lu, unsignalled %lu",
			    irq_count(), irq_empty_count(), E.st.irq_timeouts, E.st.unsignalled);
	tg_log("stats: rx %lu pkts %lu bytes, tx %lu pkts %lu bytes, kicks rx %lu tx %lu, waits %lu, "
	       "rst sent %lu, dropped %lu%s",
	       E.st.rx_pkts, E.st.rx_bytes, E.st.tx_pkts, E.st.tx_bytes, E.rxq.kicks, E.txq.kicks,
	       E.st.waits, E.st.rst_sent, E.st.dropped, irqs);
}

/* ---- loop ---- */

/* Is something expected from the host, so that silence is a timeout? */
static bool waiting_for_host(void)
{
	if (E.mode->always_waiting || E.cfg->has_conns)
		return true;
	for (int i = 0; i < VSOCK_MAX_CONNS; i++) {
		struct conn *c = &E.conns[i];
		if (c->state == CONN_FREE)
			continue;
		if (c->state != CONN_OPEN || c->inflight || c->pend)
			return true;
		const uint8_t *p;
		if (E.mode->tx_ready && E.mode->tx_ready(c, &p))
			return true;
	}
	return false;
}

/* Polled mode: acknowledge, then sleep on the wait port. */
static void idle_poll(void)
{
	uint32_t isr = virtio_ack_interrupt(&E.dev);
	if (isr & 2) { /* configuration change: NEEDS_RESET? */
		if (virtio_status(&E.dev) & 64)
			tg_die(EXIT_MISMATCH, "vsock: device needs reset");
	}
	if (isr)
		return; /* something happened since the last pass: look first */
	if (E.cfg->nowait)
		return; /* pure polling (testguest.wait=0), for comparison */
	outl(PORT_PV_WAIT, WAIT_US);
	E.st.waits++;
}

/*
 * irq mode: the handler owns InterruptStatus (irq.h). Wait for the
 * interrupt count to move past its value before the pass that found
 * nothing, unless the rings the caller takes from (only TX when draining)
 * hold something after all.
 */
static void idle_irq(bool tx_only)
{
	uint32_t isr = irq_take_status();
	if ((isr & 2) && (virtio_status(&E.dev) & 64))
		tg_die(EXIT_MISMATCH, "vsock: device needs reset");
	if (irq_count() != E.irq_seen)
		return; /* interrupted during the pass: look first */
	/* used_event (written as entries were taken) before the used index. */
	mfence();
	if (virtq_used_pending(&E.txq) ||
	    (!tx_only && (virtq_used_pending(&E.rxq) || virtq_used_pending(&E.evq))))
		return;
	E.st.waits++;
	if (!irq_wait(E.irq_seen, E.irq_tick_tsc)) {
		E.st.irq_timeouts++;
		E.irq_timed_out = true;
	}
}

static void idle(bool tx_only)
{
	if (E.cfg->irq)
		idle_irq(tx_only);
	else
		idle_poll();
}

/* irq mode: after a wait that timed out, did the rings hold work that no
 * interrupt announced (before or during this pass)? Call after the pass. */
static void note_unsignalled(int ring_work)
{
	if (E.irq_timed_out && ring_work && irq_count() == E.irq_seen)
		E.st.unsignalled++;
	E.irq_timed_out = false;
}

void vsock_run(void)
{
	for (;;) {
		uint64_t now = rdtsc();
		E.irq_seen = irq_count();
		int work = rx_poll();
		work += tx_reap();
		work += ev_poll();
		note_unsignalled(work);
		tx_pump(now);
		if (work)
			E.last_progress = now;
		if (E.mode->done())
			break;
		if (work)
			continue;
		if (E.timeout_tsc && now - E.last_progress > E.timeout_tsc) {
			if (waiting_for_host()) {
				vsock_log_stats();
				tg_die(EXIT_TIMEOUT, "timeout: nothing from the device for %lu s",
				       E.cfg->timeout_s);
			}
			E.last_progress = now;
		}
		idle(false);
	}
	/* Let the last packets (RSTs, SHUTDOWNs) reach the device. */
	uint64_t end = rdtsc() + ms_to_tsc(DRAIN_MS);
	while (E.nfree != E.nslots && (int64_t)(rdtsc() - end) < 0) {
		E.irq_seen = irq_count();
		note_unsignalled(tx_reap());
		tx_pump(rdtsc());
		if (E.nfree != E.nslots)
			idle(true);
	}
	E.mode->finish();
}
