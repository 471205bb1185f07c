// Package vhostuser serves a virtio device model to a vhost-user front-end
// (QEMU's vhost-user-vsock-device) over a Unix socket, following QEMU's
// docs/interop/vhost-user.rst. The front-end owns the machine and guest
// memory; the back-end owns the rings it is handed and runs the same device
// code as microvm's own virtio-mmio transport (package vsock). microvm
// vhost-user-vsock is the command around it: internal/vhostuservsock
// (Serve) makes the device, listens with Listen and runs Serve, and
// cmd/microvm-full reads its flags; docs/vhost-user.md has the protocol
// subset, the flags and the conformance suite.
//
// Data flow: the front-end negotiates features (GET/SET_FEATURES, the
// protocol features MQ, REPLY_ACK and CONFIG), hands over guest RAM with
// SET_MEM_TABLE (file descriptors, each a memfd sealed with F_SEAL_SHRINK,
// each region checked to lie inside its file, no two regions overlapping in
// guest or front-end addresses, mapped shared through guestmem.MapFiles),
// and configures
// each ring it drives (SET_VRING_NUM, _ADDR, _BASE, _KICK, _CALL, _ERR and,
// with protocol features, _ENABLE). Once every such ring is configured,
// started and enabled and memory is mapped, the device is activated
// (virtio.Activation) with queues whose addresses are translated from the
// front-end's virtual addresses to guest-physical ones. From then on guest
// kicks arrive on the kick eventfds the device's workers poll, and the
// workers interrupt the guest by signalling the call eventfds: no message
// passes through the back-end per packet. GET_VRING_BASE, RESET_OWNER,
// RESET_DEVICE, disabling a ring, a new memory table or kick, and a
// disconnect stop the device (Device.Reset) and record where each ring
// stopped; a new memory table or kick restarts it. The config space is
// read and written through GET_CONFIG and SET_CONFIG.
//
// Errors: vhost-user has no DEVICE_NEEDS_RESET. A guest error the device
// reports through Activation.Fail is logged, counted and signalled on the
// rings' error eventfds; the device stays stopped until the front-end
// restarts the rings. A malformed or out-of-order message (errProtocol) is
// logged and drops the connection: the device is reset and Serve waits for
// the next front-end. Nothing a front-end sends stops the back-end: every
// message is bounded and checked before it is acted on, and the one thing a
// front-end could do behind the back-end's back that would kill it, shrinking
// a memory file under the mapping (SIGBUS on the next touch), is ruled out
// by accepting only memory the kernel guarantees cannot shrink: a region
// whose descriptor is not a memfd carrying F_SEAL_SHRINK is refused with a
// logged error and the front-end dropped. QEMU's memory-backend-memfd seals
// so by default (seal=on); memory-backend-file and unsealed memfds are not
// served. Overlapping regions (guest or front-end addresses) are refused
// the same way, since an address in two regions translates two ways.
//
// Goroutines and locks: Serve runs the accept loop and serves one front-end
// at a time on its own goroutine, which owns all connection and ring state
// except each ring's call and error eventfds: device workers signal those
// under the ring's sigMu read lock and the serving goroutine replaces them
// under its write lock, so a replaced descriptor is closed at once. sigMu is
// a leaf taken under the device's own locks (vsock's rxMu), never the other
// way. Backend.mu, also a leaf, guards the current connection and the closed
// flag so that Close, from any goroutine, can disconnect the front-end. The
// device's workers run from activation until Device.Reset returns.
package vhostuser
