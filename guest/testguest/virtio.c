/* virtio.c - virtio-mmio v2 transport and split virtqueues (driver side). */
#include "virtio.h"
#include "console.h"
#include "lib.h"
#include "mem.h"
#include "platform.h"

/* Register offsets (virtio 1.2, 4.2.2). */
#define R_MAGIC 0x000
#define R_VERSION 0x004
#define R_DEVICE_ID 0x008
#define R_DEVICE_FEATURES 0x010
#define R_DEVICE_FEATURES_SEL 0x014
#define R_DRIVER_FEATURES 0x020
#define R_DRIVER_FEATURES_SEL 0x024
#define R_QUEUE_SEL 0x030
#define R_QUEUE_NUM_MAX 0x034
#define R_QUEUE_NUM 0x038
#define R_QUEUE_READY 0x044
#define R_QUEUE_NOTIFY 0x050
#define R_INTERRUPT_STATUS 0x060
#define R_INTERRUPT_ACK 0x064
#define R_STATUS 0x070
#define R_QUEUE_DESC_LOW 0x080
#define R_QUEUE_DESC_HIGH 0x084
#define R_QUEUE_DRIVER_LOW 0x090
#define R_QUEUE_DRIVER_HIGH 0x094
#define R_QUEUE_DEVICE_LOW 0x0a0
#define R_QUEUE_DEVICE_HIGH 0x0a4
#define R_CONFIG_GENERATION 0x0fc
#define R_CONFIG 0x100

#define S_ACKNOWLEDGE 1
#define S_DRIVER 2
#define S_DRIVER_OK 4
#define S_FEATURES_OK 8
#define S_NEEDS_RESET 64
#define S_FAILED 128

#define VRING_USED_F_NO_NOTIFY 1

static uint32_t rd(struct virtio_dev *d, uint32_t off)
{
	return mmio_read32(d->base + off);
}

static void wr(struct virtio_dev *d, uint32_t off, uint32_t v)
{
	mmio_write32(d->base + off, v);
}

int virtio_find(const struct tg_config *cfg, uint32_t device_id, struct virtio_dev *dev)
{
	for (int i = 0; i < cfg->ndevs; i++) {
		struct virtio_dev d = { .base = cfg->devs[i].base,
					.size = cfg->devs[i].size,
					.irq = cfg->devs[i].irq };
		if (rd(&d, R_MAGIC) != VIRTIO_MMIO_MAGIC)
			continue;
		uint32_t version = rd(&d, R_VERSION);
		uint32_t id = rd(&d, R_DEVICE_ID);
		if (id != device_id)
			continue;
		if (version != 2) {
			tg_log("virtio-mmio at 0x%lx: device %u has version %u, need 2", d.base, id,
			       version);
			continue;
		}
		d.device_id = id;
		*dev = d;
		return 0;
	}
	return -1;
}

void virtio_reset(struct virtio_dev *dev)
{
	wr(dev, R_STATUS, 0);
	/* 4.2.3.1: wait until the device reads back 0. Bounded. */
	for (int i = 0; i < 1000000 && rd(dev, R_STATUS) != 0; i++)
		cpu_relax();
}

uint32_t virtio_status(struct virtio_dev *dev)
{
	return rd(dev, R_STATUS);
}

int virtio_negotiate(struct virtio_dev *dev, uint64_t required, uint64_t optional)
{
	virtio_reset(dev);
	if (rd(dev, R_STATUS) != 0) {
		tg_log("virtio-mmio at 0x%lx: reset did not complete", dev->base);
		return -1;
	}
	wr(dev, R_STATUS, S_ACKNOWLEDGE);
	wr(dev, R_STATUS, S_ACKNOWLEDGE | S_DRIVER);

	wr(dev, R_DEVICE_FEATURES_SEL, 0);
	uint64_t offered = rd(dev, R_DEVICE_FEATURES);
	wr(dev, R_DEVICE_FEATURES_SEL, 1);
	offered |= (uint64_t)rd(dev, R_DEVICE_FEATURES) << 32;

	if ((offered & required) != required) {
		tg_log("virtio-mmio at 0x%lx: device features 0x%lx lack required 0x%lx", dev->base,
		       offered, required);
		wr(dev, R_STATUS, rd(dev, R_STATUS) | S_FAILED);
		return -1;
	}
	uint64_t want = required | (offered & optional);
	wr(dev, R_DRIVER_FEATURES_SEL, 0);
	wr(dev, R_DRIVER_FEATURES, (uint32_t)want);
	wr(dev, R_DRIVER_FEATURES_SEL, 1);
	wr(dev, R_DRIVER_FEATURES, (uint32_t)(want >> 32));

	wr(dev, R_STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK);
	if (!(rd(dev, R_STATUS) & S_FEATURES_OK)) {
		tg_log("virtio-mmio at 0x%lx: device refused features 0x%lx", dev->base, want);
		wr(dev, R_STATUS, rd(dev, R_STATUS) | S_FAILED);
		return -1;
	}
	dev->features = want;
	return 0;
}

int virtq_setup(struct virtio_dev *dev, struct virtq *q, uint16_t index, uint16_t max_size)
{
	memset(q, 0, sizeof(*q));
	wr(dev, R_QUEUE_SEL, index);
	if (rd(dev, R_QUEUE_READY) != 0) {
		tg_log("virtio: queue %u already ready after reset", index);
		return -1;
	}
	uint32_t dmax = rd(dev, R_QUEUE_NUM_MAX);
	if (dmax == 0) {
		tg_log("virtio: queue %u not available", index);
		return -1;
	}
	uint32_t want = MIN(dmax, (uint32_t)MIN(max_size, VIRTQ_MAX_SIZE));
	uint16_t size = 1;
	while ((uint32_t)size * 2 <= want)
		size *= 2;

	/* 2.7: descriptor table 16-aligned, avail ring 2-aligned, used ring
	 * 4-aligned. Give each its own page: simple and cache friendly. */
	size_t desc_bytes = 16u * size;
	size_t avail_bytes = 6u + 2u * size;
	size_t used_bytes = 6u + 8u * size;
	void *desc = heap_alloc(desc_bytes, 4096);
	void *avail = heap_alloc(avail_bytes, 4096);
	void *used = heap_alloc(used_bytes, 4096);
	if (!desc || !avail || !used) {
		tg_log("virtio: out of memory for queue %u", index);
		return -1;
	}
	q->dev = dev;
	q->index = index;
	q->size = size;
	q->desc = desc;
	q->avail = avail;
	q->used = used;
	q->used_ring = (volatile struct virtq_used_elem *)((uint8_t *)used + 4);
	q->event_idx = (dev->features >> VIRTIO_F_EVENT_IDX) & 1;

	uint64_t pd = virt_to_phys(desc), pa = virt_to_phys(avail), pu = virt_to_phys(used);
	wr(dev, R_QUEUE_NUM, size);
	wr(dev, R_QUEUE_DESC_LOW, (uint32_t)pd);
	wr(dev, R_QUEUE_DESC_HIGH, (uint32_t)(pd >> 32));
	wr(dev, R_QUEUE_DRIVER_LOW, (uint32_t)pa);
	wr(dev, R_QUEUE_DRIVER_HIGH, (uint32_t)(pa >> 32));
	wr(dev, R_QUEUE_DEVICE_LOW, (uint32_t)pu);
	wr(dev, R_QUEUE_DEVICE_HIGH, (uint32_t)(pu >> 32));
	wr(dev, R_QUEUE_READY, 1);
	return 0;
}

void virtio_driver_ok(struct virtio_dev *dev)
{
	wr(dev, R_STATUS, S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
}

uint32_t virtio_ack_interrupt(struct virtio_dev *dev)
{
	uint32_t isr = rd(dev, R_INTERRUPT_STATUS);
	if (isr)
		wr(dev, R_INTERRUPT_ACK, isr);
	return isr;
}

uint64_t virtio_config_read64(struct virtio_dev *dev, uint32_t off)
{
	/* 4.2.2.2: read the generation before and after; retry on change. */
	for (int tries = 0;; tries++) {
		uint32_t g0 = rd(dev, R_CONFIG_GENERATION);
		uint32_t lo = rd(dev, R_CONFIG + off);
		uint32_t hi = rd(dev, R_CONFIG + off + 4);
		uint32_t g1 = rd(dev, R_CONFIG_GENERATION);
		if (g0 == g1 || tries > 100)
			return (uint64_t)hi << 32 | lo;
	}
}

/* 2.7.10: should the device be notified of avail entries [old, new)? */
static bool need_event(uint16_t event, uint16_t new_idx, uint16_t old)
{
	return (uint16_t)(new_idx - event - 1) < (uint16_t)(new_idx - old);
}

bool virtq_publish(struct virtq *q)
{
	uint16_t old = q->notified_idx, new_idx = q->avail_idx;
	if (old == new_idx)
		return false;
	barrier(); /* ring slots and descriptors before the index */
	q->avail[1] = new_idx;
	mfence(); /* the index store before the suppression load */
	bool kick;
	if (q->event_idx)
		kick = need_event(q->used[2 + 4 * q->size], new_idx, old);
	else
		kick = !(q->used[0] & VRING_USED_F_NO_NOTIFY);
	q->notified_idx = new_idx;
	if (kick) {
		mmio_write32(q->dev->base + R_QUEUE_NOTIFY, q->index);
		q->kicks++;
	}
	return true;
}

int virtq_get_used(struct virtq *q, uint32_t *id, uint32_t *len)
{
	uint16_t used_idx = q->used[1];
	if (used_idx == q->last_used)
		return 0;
	if ((uint16_t)(used_idx - q->last_used) > q->size)
		tg_die(EXIT_MISMATCH, "virtio: queue %u used idx %u runs %u ahead of %u (size %u)",
		       q->index, used_idx, (uint16_t)(used_idx - q->last_used), q->last_used,
		       q->size);
	barrier(); /* the index before the element it covers */
	volatile struct virtq_used_elem *e = &q->used_ring[q->last_used & (q->size - 1)];
	uint32_t eid = e->id, elen = e->len;
	if (eid >= q->size)
		tg_die(EXIT_MISMATCH, "virtio: queue %u used id %u out of range (size %u)", q->index,
		       eid, q->size);
	q->last_used++;
	if (q->event_idx) {
		/* Ask for an interrupt at the next used entry: the paravirtual
		 * wait port wakes on device interrupts, and irq mode waits for
		 * them. */
		q->avail[2 + q->size] = q->last_used;
	}
	*id = eid;
	*len = elen;
	return 1;
}
