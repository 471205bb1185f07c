// Package guestmem is the one door to guest memory.
//
// Every access the VMM makes to guest RAM goes through a *Memory: the vCPU
// exit handlers, the boot loaders, the virtqueue code and the vsock device all
// hold a *Memory and never the mapped bytes themselves. Each access is bounds
// checked with overflow-safe arithmetic against the regions the memory was built
// from, and returns ErrOutOfBounds instead of touching anything outside them.
//
// A Memory is a sorted set of regions. Under `microvm run` the regions are
// anonymous mappings that are also registered with KVM as memory slots (RAM
// below the MMIO gap at 3 GiB, and the rest above 4 GiB); HostAddr gives the
// VMM a region's host address for KVM_SET_USER_MEMORY_REGION and nothing
// else. Under the
// vhost-user backend each region is a file descriptor received from the frontend
// in SET_MEM_TABLE, mapped shared, and additionally carries the frontend's
// user-space address so that vring addresses (which the frontend gives in its own
// virtual address space) can be translated to guest-physical ones.
//
// Data flow: callers ask either for a copy (Read, Write, the fixed-width
// helpers) or for a bounded view (Slice), which stays inside one region and is
// used for scatter-gather I/O straight between guest buffers and host sockets.
// Views are valid until Close; the owner of a Memory closes it only after every
// device using it has stopped.
//
// Concurrency: a Memory is immutable after construction, so any goroutine may
// use it. The guest writes its memory concurrently with us; the
// Load16Acquire/Store16Release helpers give the ordering the virtio ring
// indices and event-suppression re-checks need (Store16Release is a full
// barrier on amd64; see the comments on them); everything else is plain
// copies.
package guestmem
