// Package rng is microvm's entropy device, virtio-rng (virtio 1.2, 5.4): one
// request queue whose device-writable buffers the device fills with bytes
// from the host kernel's getrandom(2). Linux's virtio-rng driver registers it
// as a hardware RNG (/dev/hwrng), which seeds the guest's own pool.
//
// # Data path
//
// The guest driver makes a chain of writable buffers available on the
// request queue (5.4.6) and kicks it. Under KVM the kick is an ioeventfd;
// the worker wakes (poll on the kick and stop eventfds), pops the chain
// (virtio.Queue.Pop walks and bounds it), takes views of its writable
// buffers with a virtio.Writer and fills them with getrandom straight in
// guest memory (no bounce buffer), at most MaxRequest bytes per chain. It
// returns the chain with Queue.Push (the count it filled) and interrupts
// the guest when the queue's suppression (used_event with
// VIRTIO_F_EVENT_IDX) asks for it.
//
// # Rate limit
//
// With Config.Rate the worker draws from a token bucket: Rate bytes per
// second, at most Burst bytes saved up. A chain gets min(its room,
// MaxRequest, Burst) bytes once the bucket holds that many; until then it
// stays in the ring (Queue.Undo) and the worker sleeps until the tokens
// are due, still answering its
// stop eventfd. So a guest that asks for more than the rate only waits; it
// never makes the worker spin or queue host memory.
//
// # Untrusted guest
//
// A chain with device-readable buffers or no writable room is not a request
// the spec allows (5.4.6.1): the device reports it through
// Activation.Fail (the transport sets DEVICE_NEEDS_RESET), counts it in
// Stats.GuestErrorsByKind (virtio.GuestErrLayout) and stops serving the queue
// until the driver resets it. Errors from the queue itself (bad rings,
// descriptors) are handled the same way (virtio.GuestErrQueue). Nothing panics on guest input.
//
// # Goroutines and locks
//
// One worker per activation owns the request queue; Activate starts it,
// Reset signals its stop eventfd and waits for it. The device's
// virtio.Lifecycle guards the active worker; its lock is taken by Activate,
// Reset, Quiesce and Close only (the MMIO transport calls the first three
// with its own mu held: MMIO.mu -> Lifecycle.mu). Stats are atomics,
// readable from any goroutine.
//
// # Pause (snapshots)
//
// Device.Quiesce (virtio.Quiescer) stops the worker as Reset does, and
// that already leaves the queue's positions final, so the worker needs no
// Drain: it looks at its stop eventfd only between passes over the ring,
// and a pass pushes (and so publishes) every chain it filled, notifies
// before it ends, and puts back with Queue.Undo the chain the rate limit
// makes it wait for. A failed worker is the exception (it leaves the
// malformed chain popped), but it has set DEVICE_NEEDS_RESET first, and
// then the positions do not matter. The next Activate (MMIO.Resume, or a
// restore) starts a worker at the saved positions that serves the ring
// before it waits for a kick, with a full bucket.
package rng
