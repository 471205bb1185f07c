/*
 * dgram.h - testguest.mode=dgram: microvm's experimental virtio-vsock
 * datagrams (its own feature bit 23, not the RFC series' VIRTIO_VSOCK_F_DGRAM,
 * bit 3, whose datagrams share the stream queues; packet type 3, op RW, no
 * connection and no credit) on the device's datagram queue pair, queues 3
 * (device -> guest) and 4 (guest -> device).
 *
 * The mode sends testguest.count datagrams of testguest.bytes payload bytes
 * (default 64) from guest port testguest.port to host port testguest.port,
 * each filled with the stream pattern at offset i * bytes, then echoes
 * datagrams back to their sender (ports swapped) until it has echoed
 * testguest.count of them, and exits 0. No MICROVM_VSOCK_F_DGRAM offered: exit
 * 5; a malformed datagram from the device: exit 4.
 */
#ifndef TG_DGRAM_H
#define TG_DGRAM_H

#include "cmdline.h"

#define VSOCK_TYPE_DGRAM 3
#define MICROVM_VSOCK_F_DGRAM 23
#define VSOCK_QUEUE_DGRAM_RX 3
#define VSOCK_QUEUE_DGRAM_TX 4

__attribute__((noreturn)) void dgram_run(const struct tg_config *cfg);

#endif
