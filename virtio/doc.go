// Package virtio is the device side of virtio 1.2 (OASIS virtio v1.2,
// cs01): split virtqueues, the descriptor-chain walker, and the virtio-mmio
// transport (the vhost-user transport is virtio/vhostuser). Devices
// (package vsock, devices/blk, devices/rng, devices/virtionet) implement
// Device and receive activated queues; they never see descriptors or
// registers.
//
// Data flow, guest to device: the driver fills descriptors and the available
// ring (2.7.13), then writes QueueNotify (4.2.2). Under KVM that write is
// caught by an ioeventfd with a datamatch on the queue index, registered
// when the driver first started the device (MMIO.BindKicks), so the vCPU
// never leaves the kernel; the eventfd wakes the device worker that
// owns the queue. The worker calls Queue.Pop, which walks the chain once
// (Walker: bounds, loops, indirect tables, readable-before-writable) and
// returns a Chain of bounded guest-memory views. The worker consumes the
// chain and calls Queue.Push, which publishes the used element and the used
// index with release ordering (or PushNoPublish for each chain of a batch
// and one Publish at the end, as the vsock workers do). Device to guest: Queue.NeedsNotification
// applies the guest's suppression (VIRTQ_AVAIL_F_NO_INTERRUPT or, with
// VIRTIO_F_EVENT_IDX, used_event) and the worker calls the queue's Notify,
// which for virtio-mmio sets InterruptStatus and signals an irqfd (an edge on
// the device's GSI, as Firecracker does: no resample round trip per
// interrupt) and for vhost-user signals the frontend's call eventfd.
//
// Guest errors: anything the driver gets wrong in a ring or descriptor makes
// Pop/Push return an error wrapping ErrGuest; the device reports it through
// Activation.Fail, and the transport counts it, logs it, and sets
// DEVICE_NEEDS_RESET (2.1.2) with a configuration-change interrupt. Illegal
// status moves and register misuse are counted the same way. Nothing the guest
// writes is trusted as an index, length or address before it is checked.
//
// Guest errors are classified once for the transport and every device
// (GuestErrorKind; each lists the kinds it reports, TransportGuestErrorKinds
// here) and counted by one helper (GuestErrors: an atomic per kind, and
// Report, which counts and logs).
//
// A device's life (Lifecycle): Activate starts a Session (the device's
// workers for the driver's queues) unless one runs or the device is closed;
// Reset stops the session outside the lock and waits for its workers; Close
// refuses later activations and resets; Wait lets the host side wait for a
// driver (vsock's host connects). Every device holds one, so the rules are
// written once.
//
// Snapshots (state.go): with the vCPUs stopped, MMIO.Quiesce
// stops the device's session without a reset: the device (a Quiescer,
// usually Lifecycle.Quiesce over a Drainer session) finishes or puts back
// every chain it popped, so each queue's next available entry equals the
// used index it published, and that index is in guest memory. Status,
// features and queue registers stay. MMIO.SaveState then returns an
// MMIOState: the registers the driver set, the pending interrupt bits,
// each live queue's position (refused while anything is in flight) and,
// for a StatefulDevice, the device's own state as raw JSON, which only
// the device can decode and check. Either MMIO.Resume restarts the session
// in place, or a new process maps the same guest memory, makes a fresh
// transport (NewMMIO, BindKicks) and calls RestoreState: it checks every
// field against the device (type, features offered, queue maxima) and
// guest memory (ring addresses through the bounds-checked guestmem, each
// used index against the ring's), refusing with ErrBadState and changing
// nothing; restores the device's state; and, at DRIVER_OK without
// DEVICE_NEEDS_RESET, activates the device with queues positioned by
// Queue.SetIndices, binds the kicks as the first DRIVER_OK did, kicks each
// queue once (the driver may have posted buffers with notifications
// suppressed), and raises the interrupt again if one was pending. A device
// saved under DEVICE_NEEDS_RESET comes back marked so, with no session,
// until the driver resets it.
//
// Inspection (inspect.go): MMIO.Inspect reads, from any goroutine and
// without stopping anything, the status, the interrupt bits the driver has
// not acknowledged and each ready ring's indices and EVENT_IDX fields from
// guest memory, with the workers' own atomic loads: what an operator needs
// to tell a lost kick from a lost interrupt (microvm: SIGUSR1).
//
// Counters: MMIO.Stats counts guest errors by kind (register, features,
// queue, status, device), the interrupts raised
// (used-buffer and configuration-change), activations and driver resets.
// They are atomics bumped next to work that already takes a lock or makes
// a system call (an irqfd signal), so they cost nothing measurable; any
// goroutine may read them. Kicks are counted by the devices, whose
// workers are the ones that see them (the ioeventfd bypasses the
// transport).
//
// Concurrency: a Queue has one owner goroutine at a time (the device worker,
// or whoever holds the lock the device documents for it). The MMIO transport
// is called from vCPU goroutines and serialises register accesses with its
// mutex; it calls Device.Activate and Device.Reset (and Quiescer.Quiesce and
// the StatefulDevice methods) with that mutex held, so a
// device must not call back into the transport from those methods except
// through Activation.Fail, which only takes the transport's separate
// interrupt lock. Lock order: MMIO.mu, then a device's Lifecycle.mu, then
// MMIO.irqMu.
package virtio
