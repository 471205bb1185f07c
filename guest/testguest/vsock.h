/*
 * vsock.h - a virtio-vsock driver: stream connections, credit flow
 * control, and an event loop that mode code (modes.c) plugs into.
 *
 * Data path (virtio 1.2, 5.10 "Socket Device"):
 *   host -> RX queue 0: one posted buffer per descriptor (44-byte header +
 *     bufsize); rx_poll() copies the header out once, checks it against the
 *     used length, hands the payload to the mode, reposts the buffer.
 *   mode -> TX queue 1: tx slot s owns descriptors 2s (header, in the slot)
 *     and 2s+1 (payload, pointing straight into the mode's memory, no copy).
 *     The payload memory must stay put until the slot completes; each
 *     connection keeps its in-flight packets in send order and reports them
 *     done oldest-first (mode->tx_done), even if the device completes out of
 *     order.
 *   event queue 2: TRANSPORT_RESET drops every connection.
 * When a pass finds nothing to do the loop acknowledges the interrupt status
 * and sleeps on the paravirtual wait port (0x600), interrupts off; with
 * testguest.irq=1 it waits for a device interrupt instead (irq.h).
 *
 * Credit (5.10.6.3): we advertise buf_alloc and fwd_cnt in every packet and
 * never send more than peer_buf_alloc - (tx_cnt - peer_fwd_cnt), all u32
 * counters with wrapping arithmetic.
 */
#ifndef TG_VSOCK_H
#define TG_VSOCK_H

#include "cmdline.h"
#include <stdbool.h>
#include <stdint.h>

#define VSOCK_HOST_CID 2
#define VSOCK_TYPE_STREAM 1

enum vsock_op {
	VSOCK_OP_REQUEST = 1,
	VSOCK_OP_RESPONSE = 2,
	VSOCK_OP_RST = 3,
	VSOCK_OP_SHUTDOWN = 4,
	VSOCK_OP_RW = 5,
	VSOCK_OP_CREDIT_UPDATE = 6,
	VSOCK_OP_CREDIT_REQUEST = 7,
};

#define VSOCK_SHUTDOWN_RCV 1  /* sender will receive no more data */
#define VSOCK_SHUTDOWN_SEND 2 /* sender will send no more data */
#define VSOCK_SHUTDOWN_BOTH 3

/* Our receive window per connection; a power of two (echo rings use it). */
#define VSOCK_BUF_ALLOC (256u * 1024)
/* Largest payload per packet (Linux vhost drops bigger ones). */
#define VSOCK_MAX_PKT (64u * 1024)
/* Connection table size: open, closing and draining connections. */
#define VSOCK_MAX_CONNS 128
/* TX slots (two descriptors each): half of the largest queue we set up. */
#define VSOCK_MAX_TX_SLOTS 128

/* The wire header, little-endian (x86 is too). */
struct vsock_hdr {
	uint64_t src_cid;
	uint64_t dst_cid;
	uint32_t src_port;
	uint32_t dst_port;
	uint32_t len;
	uint16_t type;
	uint16_t op;
	uint32_t flags;
	uint32_t buf_alloc;
	uint32_t fwd_cnt;
} __attribute__((packed));
_Static_assert(sizeof(struct vsock_hdr) == 44, "virtio_vsock_hdr is 44 bytes");

enum conn_state {
	CONN_FREE,	 /* table slot unused */
	CONN_CONNECTING, /* we sent (or owe) REQUEST; waiting for RESPONSE */
	CONN_OPEN,	 /* established; peer_shut says which directions the peer closed */
	CONN_CLOSING,	 /* we sent SHUTDOWN(both); waiting for the peer's RST */
	CONN_RESETTING,	 /* we owe the peer an RST; nothing else is sent or accepted */
	CONN_CLOSED,	 /* protocol over; TX packets still in flight hold it */
};

enum close_reason {
	CLOSE_PEER_RST,	       /* the peer sent RST */
	CLOSE_OUR_RST,	       /* we sent RST (answer to SHUTDOWN, error, close timeout) */
	CLOSE_REFUSED,	       /* RST in answer to our REQUEST */
	CLOSE_TRANSPORT_RESET, /* the device reset the transport */
};

#define PEND_REQUEST 0x01
#define PEND_RESPONSE 0x02
#define PEND_CREDIT_UPDATE 0x04

struct conn {
	enum conn_state state;
	enum close_reason why; /* valid once RESETTING/CLOSED */
	uint16_t id;	       /* index in the table */
	uint8_t pend;	       /* PEND_* control packets still to send */
	uint8_t peer_shut;     /* VSOCK_SHUTDOWN_* flags the peer sent */
	bool credit_req_sent;  /* CREDIT_REQUEST sent since the last peer credit change */
	uint64_t peer_cid;
	uint32_t peer_port, local_port;

	/* Receive side: our window. */
	uint32_t buf_alloc; /* advertised */
	uint32_t rx_cnt;    /* payload bytes received */
	uint32_t fwd_cnt;   /* payload bytes consumed (freed), mode-advanced */
	uint32_t fwd_told;  /* fwd_cnt in the last packet we sent */

	/* Send side: the peer's window. */
	uint32_t tx_cnt; /* payload bytes queued to the device */
	uint32_t peer_buf_alloc, peer_fwd_cnt;

	uint64_t rx_total, tx_total; /* 64-bit stream offsets */
	uint64_t close_deadline, credit_req_tsc;

	/* In-flight TX: count of slots, and data packets in send order
	 * (length | FIFO_DONE once the device completed it). */
	uint16_t inflight;
	uint16_t fifo_head, fifo_tail;
	uint32_t fifo[VSOCK_MAX_TX_SLOTS];

	uint8_t *buf; /* mode-owned (echo ring) */
};

/* What a mode does with connections. Hooks may be NULL where noted. */
struct vsock_mode {
	const char *name;
	/* A connection was accepted or created; false refuses it (RST). */
	bool (*open)(struct conn *c);
	/* In-order payload at stream offset c->rx_total; the engine already
	 * checked it fits our window. The hook advances c->fwd_cnt for what it
	 * consumed. */
	void (*rx)(struct conn *c, const uint8_t *data, uint32_t len);
	/* Contiguous bytes ready to send at offset c->tx_total (0: none). NULL:
	 * never sends. */
	uint32_t (*tx_ready)(struct conn *c, const uint8_t **data);
	/* len payload bytes were consumed by the device, oldest first. */
	void (*tx_done)(struct conn *c, uint32_t len);
	/* The peer sent SHUTDOWN with only some bits (c->peer_shut). */
	void (*peer_shutdown)(struct conn *c);
	/* Time to send our SHUTDOWN(both)? */
	bool (*want_shutdown)(struct conn *c);
	/* The connection is over (counted in vsock_closed()). */
	void (*closed)(struct conn *c);
	/* The slot is about to be reused: free c->buf. May be NULL. */
	void (*release)(struct conn *c);
	/* All done: the engine drains TX and calls finish. */
	bool (*done)(void);
	__attribute__((noreturn)) void (*finish)(void);
	/* Counts as waiting for the host even with no connection open. */
	bool always_waiting;
};

/* Find and initialise the device, post RX buffers. Exits 5 if there is no
 * usable device. */
void vsock_start(const struct tg_config *cfg, const struct vsock_mode *mode);
void vsock_listen(uint32_t port);
/* Open a connection to the host's port; the REQUEST goes out from the loop. */
struct conn *vsock_connect(uint32_t port);
/* Schedule an RST and close (CLOSE_OUR_RST). */
void vsock_reset(struct conn *c);
/* Run the event loop; exits through mode->finish or a failure. */
__attribute__((noreturn)) void vsock_run(void);

uint64_t vsock_closed(void);
uint64_t vsock_guest_cid(void);
/* Print device and loop counters. */
void vsock_log_stats(void);

/* Pure helpers (host-tested). */
uint32_t vsock_peer_credit(const struct conn *c);
bool vsock_need_credit_update(const struct conn *c);

#endif
