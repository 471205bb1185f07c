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
// server's request pipe (lowering a Tversion's msize to MaxMessage, and a
// Treaddir's count to what fits it, on the way: the server sizes an
// Rreaddir by the count alone). The p9 server (Server.Handle on the two pipes) reads requests and
// answers each on a goroutine of its own, in any order, calling the
// dirFile methods of dirfs.go: the host file system work. The
// connection's reader (conn.read) takes the replies one at a time off the
// reply pipe and hands each to the reply loop (session.replies), which
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
// # Pause and snapshots (quiesce.go)
//
// The device is a virtio.Quiescer. Quiesce stops the session without
// dropping work: the request loop pops nothing more, and the reply loop
// returns every request already popped (reply written, chain pushed,
// used index published, guest interrupted as usual) before the session
// ends, so the queue's positions are final. The wait is the server's:
// no request here waits for ever (Tlock is granted at once, no FIFO or
// socket is opened, a Tflush only waits for the ordinary request it
// names), so only host file I/O that hangs (a dead NFS server under the
// share) can hold a pause up. The 9P connection (conn.go), which holds
// the guest's fids and open files, outlives the session: MMIO.Resume
// starts a session on it and the guest carries on with its fids. A
// driver reset or Close ends it, and the server closes every file.
//
// Fids do not survive a restore into another process: the server's state
// is not saved (the device has no state of its own to snapshot), so the
// restored device serves the same share from a fresh connection with no
// fids, and every request on an old one gets a 9P error (EBADF) rather
// than a guest error or a hang. The guest's mount sees I/O errors on
// every file, its root included, until it is mounted again (a new
// Tversion and Tattach, which work).
//
// # Goroutines and locks
//
// Per activation (session): the request loop and the reply loop. Per
// connection (conn, from the first activation after a reset until the
// next reset or Close, across Quiesce): the reader and the server's
// goroutine (Handle, plus one per request in flight, which it owns);
// while quiesced they wait on their pipes, touching neither the queue
// nor guest memory. Stop (a reset) signals the stop eventfd, ends both
// loops and drops what is in flight; the device then ends the connection
// (conn.end: closes the request pipe, after a bounded wait for the
// server's answers; the server then finishes its handlers, closes the
// reply pipe and every file the guest had open) and waits for its
// goroutines. Drain (a quiesce) ends the request loop, lets the reply
// loop return what is in flight, then ends it. session.mu guards the
// queue (popped by the request loop, pushed by the reply loop), the
// in-flight table and the session's flags; it is never held across a
// pipe read or write, a channel operation, the transport's Fail, or the
// interrupt. Device.connMu guards the device's connection and is never
// held while one ends. The device's virtio.Lifecycle lock is taken by
// Activate, Reset, Quiesce and Close only (MMIO.mu -> Lifecycle.mu ->
// connMu -> session.mu). Stats are atomics.
package virtio9p
