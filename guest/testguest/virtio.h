/*
 * virtio.h - virtio-mmio version 2 transport and split virtqueues, driver
 * side (virtio 1.2: 4.2.2 MMIO device register layout, 2.7 split virtqueues,
 * 3.1.1 driver initialization). Completions are polled, or, with
 * testguest.irq=1, signalled by interrupt (irq.h).
 *
 * Ring memory ordering: the device runs on another CPU (the VMM). x86 is
 * TSO, so stores are seen in program order and loads are not reordered with
 * other loads; the only orderings that need code are
 *  - compiler barriers between filling descriptors/ring slots and
 *    publishing avail->idx, and between reading used->idx and its entries;
 *  - mfence between publishing avail->idx and reading the device's
 *    notification suppression (avail_event or used->flags): store->load;
 *  - in irq mode, mfence between writing used_event and the last look at
 *    used->idx before waiting (virtq_used_pending): store->load.
 */
#ifndef TG_VIRTIO_H
#define TG_VIRTIO_H

#include "cmdline.h"
#include <stdbool.h>
#include <stdint.h>

#define VIRTIO_MMIO_MAGIC 0x74726976u /* "virt" */

#define VIRTIO_ID_VSOCK 19
#define VIRTIO_ID_RNG 4

#define VIRTIO_F_EVENT_IDX 29
#define VIRTIO_F_VERSION_1 32

#define VIRTQ_DESC_F_NEXT 1
#define VIRTQ_DESC_F_WRITE 2

#define VIRTQ_MAX_SIZE 256

struct virtq_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

struct virtq_used_elem {
	uint32_t id;
	uint32_t len;
};

struct virtio_dev {
	uint64_t base, size;
	uint32_t irq;
	uint32_t device_id;
	uint64_t features; /* negotiated */
};

struct virtq {
	struct virtio_dev *dev;
	uint16_t index; /* queue number */
	uint16_t size;	/* power of two */
	volatile struct virtq_desc *desc;
	volatile uint16_t *avail;		/* flags, idx, ring[size], used_event */
	volatile uint16_t *used;		/* flags, idx, then the elements */
	volatile struct virtq_used_elem *used_ring;
	bool event_idx;
	uint16_t avail_idx;	 /* next avail slot (ours, not yet published) */
	uint16_t notified_idx;	 /* avail idx the device was last told about */
	uint16_t last_used;	 /* next used entry to consume */
	uint64_t kicks;		 /* notifications written */
};

/*
 * Look through the virtio_mmio.device= entries for a version-2 device with
 * this id. Returns 0 and fills dev, or -1.
 */
int virtio_find(const struct tg_config *cfg, uint32_t device_id, struct virtio_dev *dev);

/*
 * Reset, ACKNOWLEDGE, DRIVER, negotiate features (all of required, plus any
 * of optional the device offers), FEATURES_OK and check it stuck. Returns 0,
 * or -1 with a message logged.
 */
int virtio_negotiate(struct virtio_dev *dev, uint64_t required, uint64_t optional);

/* Set up queue index with at most max_size entries (rounded down to a power
 * of two the device accepts). Memory comes from the heap. Returns 0 or -1. */
int virtq_setup(struct virtio_dev *dev, struct virtq *q, uint16_t index, uint16_t max_size);

/* DRIVER_OK: the device may now use the queues. */
void virtio_driver_ok(struct virtio_dev *dev);

/* Reset the device (status 0): it stops touching our memory. */
void virtio_reset(struct virtio_dev *dev);

/* Device status register (NEEDS_RESET is bit 6). */
uint32_t virtio_status(struct virtio_dev *dev);

/* Read and acknowledge the interrupt status; returns what was pending. */
uint32_t virtio_ack_interrupt(struct virtio_dev *dev);

/* Read a little-endian u64 at config offset off, consistently (generation). */
uint64_t virtio_config_read64(struct virtio_dev *dev, uint32_t off);

/* Fill descriptor i. */
static inline void virtq_set_desc(struct virtq *q, uint16_t i, uint64_t addr, uint32_t len,
				  uint16_t flags, uint16_t next)
{
	q->desc[i].addr = addr;
	q->desc[i].len = len;
	q->desc[i].flags = flags;
	q->desc[i].next = next;
}

/* Put a chain head in the next avail slot; not visible until virtq_publish. */
static inline void virtq_add(struct virtq *q, uint16_t head)
{
	q->avail[2 + (q->avail_idx & (q->size - 1))] = head;
	q->avail_idx++;
}

/* Publish added heads and notify the device if it wants to be told.
 * Returns true when something was published. */
bool virtq_publish(struct virtq *q);

/*
 * Take the next used element. Returns 1 and fills id/len, or 0 when there is
 * none. A device that claims more used entries than the queue holds, or an
 * id out of range, is a violation: logged, exit 4.
 */
int virtq_get_used(struct virtq *q, uint32_t *id, uint32_t *len);

/*
 * Has the device used entries we have not taken? For the last look before
 * waiting for an interrupt: call after an mfence(), so that the used_event
 * virtq_get_used() wrote is visible to the device before this load of the
 * used index (either the device sees our used_event and interrupts, or we see
 * its entry here; virtio 1.2, 2.7.10).
 */
static inline bool virtq_used_pending(const struct virtq *q)
{
	return q->used && q->used[1] != q->last_used;
}

#endif
