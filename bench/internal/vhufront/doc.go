// Package vhufront is the front-end and guest side of a vhost-user-vsock
// device, for driving any vhost-user-vsock back-end without QEMU or a guest
// kernel: the load generator bench/vhostuser is built on it, and its tests
// run microvm's back-end in-process.
//
// # Pieces
//
//   - Memory (memory.go): guest RAM as one memfd, sealed against shrinking
//     and growing, mapped shared and split into one or two regions (the
//     second at guest-physical 4 GiB and a non-zero file offset).
//   - Client (client.go): the vhost-user front-end (QEMU
//     docs/interop/vhost-user.rst): features, protocol features (REPLY_ACK
//     turns every message into a checked one), the memory table, and each
//     ring's size, base, addresses, call and kick eventfds and enable.
//     Encoded independently of package vhostuser.
//   - Ring (ring.go): the driver side of a split virtqueue (virtio 1.2,
//     2.7), with EVENT_IDX: descriptors, the available ring, kick decisions
//     (avail_event or NO_NOTIFY), interrupt requests (used_event or
//     NO_INTERRUPT) and a checked walk of the used ring.
//   - Guest (guest.go): a virtio-vsock driver (5.10): RX buffers kept
//     posted, TX slots of a header and a payload descriptor, stream
//     connections with credit accounting, and the turn loop Run.
//   - Workloads (workload.go) on the guest side (Sink, Source, Echo, Ping)
//     and host.go's on the host side (HostSink, HostSource, HostEcho,
//     HostPing, and the CONNECT handshake), over a stream pattern every
//     receiver checks (pattern.go).
//   - Peer (peer.go): the host side as a separate process, driven by JSON
//     lines.
//
// # A packet's path
//
// Guest to host: Conn.Send copies a payload into a free TX slot, writes
// the header (carrying our buf_alloc and fwd_cnt) and offers the chain;
// at the end of the turn Run publishes the available index and kicks the
// TX eventfd if avail_event asks -> the back-end writes the payload to the
// host socket and returns the slot through the used ring -> the next turn
// reaps it.
//
// Host to guest: the back-end fills a posted RX buffer and signals the call
// eventfd if used_event asks -> Run (woken from poll(2) in ModeEvent, or
// spinning in ModePoll) reaps the entry, checks the header against the used
// length, the CIDs, the connection's state and our credit, hands the
// payload to Conn.OnData, advances fwd_cnt (sending CREDIT_UPDATE when
// less than one maximum packet of the window is left) and offers the buffer
// again.
//
// # Goroutines
//
// A Guest and its Conns belong to one goroutine: the one that calls Run
// and the workloads; callbacks (OnData, Listen's accept) run inside Run.
// Nothing in the package starts goroutines except Peer, whose reader
// goroutine ends when the peer process's output does. Every wait is
// bounded: Run by its deadline, vhost-user requests by Config.Timeout,
// host sockets by their deadlines.
//
// The generator is a trusted tool, but it trusts the back-end no more than
// a guest trusts a device: anything the device writes that breaks the
// rules stops the run with an error saying what.
package vhufront
