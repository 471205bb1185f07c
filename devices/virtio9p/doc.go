// Package virtio9p is microvm's shared-directory device, virtio-9p (device
// type 9; Linux's net/9p/trans_virtio.c is the driver): one request queue
// carrying 9P2000.L, served by hugelgupf/p9's server over a host directory
// the guest cannot leave (docs/share.md).
//
// # Data path
//
// The guest's 9p client makes a chain available per request: the request
// message in readable buffers (its size field covering them exactly; with
// zero-copy I/O the payload pages follow the header), room for the reply
// in writable ones. The request loop (session.requests) wakes on the kick
// eventfd, pops the chain (virtio.Queue.Pop walks and bounds it), checks
// it is one whole message of at most MaxMessage bytes with a tag not in
// flight, copies it out of guest memory, notes the chain's head and
// writable buffers under the tag, and writes the message into the
// server's request pipe (lowering a Tversion's msize to MaxMessage on the
// way). The p9 server (Server.Handle on the two pipes) reads requests and
// answers each on a goroutine of its own, in any order, calling the
// dirFile methods of dirfs.go: the host file system work. The reply loop
// (session.replies) reads the replies one at a time from the reply pipe,
// finds the chain by tag, copies the reply into its writable buffers,
// pushes the chain to the used ring and interrupts the guest when the
// queue's suppression asks for it.
//
// # Confinement (dirfs.go)
//
// Each file the server holds is an O_PATH descriptor reached from the
// share's root one name at a time with openat(O_NOFOLLOW); "..", "." and
// names with "/" are refused; regular files and directories are reopened
// for I/O through /proc/self/fd; nothing else is ever opened, and no
// device, FIFO or socket is made. So no symlink or name the guest controls
// makes the host touch a file outside the share.
//
// # Untrusted guest
//
// A chain that is not one whole request (size field and readable bytes
// disagree, shorter than a 9P header, longer than MaxMessage), has no room
// for a header-sized reply, or reuses the tag of a request in flight is
// reported through Activation.Fail (DEVICE_NEEDS_RESET), counted by kind
// in Stats.GuestErrorsByKind (virtio.GuestErrLayout), and ends the
// session's serving until the driver resets the device; queue errors
// likewise (virtio.GuestErrQueue). Host memory is bounded: at most queue
// size requests in flight (a chain is not popped twice before it is
// pushed), each at most MaxMessage bytes, and replies no longer than the
// negotiated msize.
//
// # Goroutines and locks
//
// Per activation (session): the request loop, the reply loop and the
// server's goroutine (Handle, plus one per request in flight, which it
// owns). Stop signals the stop eventfd, closes the request pipe (the
// server then finishes its handlers, closes the reply pipe and every file
// the guest had open), and waits for all three. session.mu guards the
// queue (popped by the request loop, pushed by the reply loop), the
// in-flight table and the failed flag; it is never held across a pipe
// read or write, the transport's Fail, or the interrupt. The device's
// virtio.Lifecycle lock is taken by Activate, Reset and Close only
// (MMIO.mu -> Lifecycle.mu -> session.mu). Stats are atomics.
package virtio9p
