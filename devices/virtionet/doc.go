// Package virtionet is microvm's virtio-net device (virtio 1.2, 5.1) on a
// host TAP interface or a socket of plain frames: one receive/transmit
// queue pair, no control queue.
//
// On a socket (NewSocket: AF_UNIX SOCK_SEQPACKET or SOCK_DGRAM, one
// Ethernet frame per record, as user-mode network stacks such as package
// usernet speak it)
// there is no virtio-net header on the wire and no kernel to finish an
// offload, so the device offers none (OfferedPlain): TX writes the frame
// without the header the driver wrote (CheckTX has refused any offload
// request in it), RX reads the frame after room for a header it fills
// with zeroes and num_buffers. Everything below holds for both.
//
// The TAP is opened with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR and its header size
// set to 12 bytes (TUNSETVNETHDRSZ), the VERSION_1 struct virtio_net_hdr
// (5.1.6), so frames pass between the TAP and guest buffers with the
// header as the guest reads and writes it: checksum offload (CSUM,
// GUEST_CSUM) and segmentation offload (HOST_ and GUEST_ TSO4, TSO6, UFO)
// are the kernel's work on the TAP, not the device's. TUNSETOFFLOAD is set
// at activation to exactly the GUEST_ offloads the driver accepted, so the
// TAP never hands the guest a frame it did not ask for. The device also
// offers MAC (Config.MAC, or a random locally administered address),
// MRG_RXBUF, STATUS (the link is always up) and, from the transport,
// EVENT_IDX and INDIRECT_DESC.
//
// # Goroutines and what they own
//
//   - TX worker (tx.go, one per activation): owns the transmit queue and
//     writes to the TAP. Woken by the TX kick eventfd, it drains the ring
//     with kicks disabled, up to 64 chains between used-index publishes.
//   - RX worker (rx.go, one per activation): owns the receive queue and
//     reads the TAP, a per-activation 64 KiB frame buffer and the RX chains
//     it has popped but not used. Woken by POLLIN on the TAP or by the RX
//     kick eventfd.
//
// The two share only the TAP descriptor (one reads, one writes), the
// negotiated features (read-only), the counters (atomics) and failDevice
// (an atomic flag, then Activation.Fail). Neither ever waits for the
// other: a full TAP stalls only TX, a guest without RX buffers stalls only
// RX.
//
// The device's virtio.Lifecycle guards the active session and the closed
// flag; its lock is held by Activate, Reset and Close only (the MMIO
// transport calls the first two with its own mu held: MMIO.mu ->
// Lifecycle.mu). Reset signals each
// worker's stop eventfd and waits for both. Device.mu, innermost, guards
// the MAC (which a restore may set) and what a quiesced session leaves
// the next; it is held to copy a field, never across a system call.
//
// # Pause and snapshot
//
// The device is a virtio.Quiescer and its session a virtio.Drainer
// (quiesce.go). Drain stops both workers as Reset does, then puts back
// with Queue.Undo every chain they popped and did not return: the RX
// chains held for a frame or for the next one (pushing them empty would
// hand the driver empty frames) and the TX chain whose frame the TAP
// refused (EAGAIN: nothing of it was sent). Every other chain was served
// and published before the workers slept, so each queue's next available
// entry equals its published used index. A frame read from the TAP and
// waiting for guest buffers stays in the Device, with the frames still
// queued in the TAP, for the next session of the same driver (Resume),
// which delivers it first; a Reset drops both. The MAC is the device's
// saved state (state.go): a random one must survive a restore in a new
// process, where the guest's driver still uses it.
//
// # A frame's path
//
// Guest to host: the driver puts header and frame in a TX chain and kicks
// -> ioeventfd -> TX worker pops the chain, copies the 12-byte header out
// once and checks it (Header.CheckTX: flags, GSO type against the
// negotiated HOST_ features, segment size, checksum offsets and hdr_len
// inside the frame, frame length 14..65550) -> one writev to the TAP of
// [the checked copy of the header, the frame's views of guest memory]
// -> the chain is returned (length 0), and the driver interrupted once per
// batch. A bad header or chain is counted (TxErrors), its chain returned,
// and the next frame goes on. EAGAIN from the TAP keeps the frame pending
// (TxStalls): the worker publishes what it sent, waits for POLLOUT on the
// TAP instead of kicks, and retries the same frame; nothing is dropped.
// Other write errors drop the frame and count it (TxDropped).
//
// Host to guest: the RX worker reads the TAP only when it has somewhere to
// put a frame: a held chain or one available in the ring. One read is one
// frame, header first, into the worker's buffer. Without MRG_RXBUF the
// frame goes into one chain (a frame larger than it is dropped, counted in
// RxDropped, and the chain kept for the next frame); with MRG_RXBUF it
// pops chains until their room covers the frame and writes it across
// them, num_buffers in the first header (5.1.6.4). Without GUEST_CSUM the
// header's flags are cleared (5.1.6.4.1). Used entries are published and
// the driver interrupted once per batch of up to 64 frames or when the TAP
// is empty. When the ring runs dry, the chains popped so far stay held
// with the frame, the worker enables RX kicks (with a re-check of the ring)
// and sleeps on the kick alone: frames wait in the TAP's queue, whose
// length the kernel bounds (and drops beyond), and TX is untouched.
//
// # Untrusted guest
//
// Ring and descriptor errors (from the virtio walker) and an RX chain with
// less room than a header stop the device: Activation.Fail, then
// DEVICE_NEEDS_RESET; the workers then touch no ring until Reset. Header
// errors are counted per frame. Memory is bounded per activation: one
// frame buffer and at most a queue's worth of held chains for RX, one
// pending frame (a chain in guest memory) for TX.
package virtionet
