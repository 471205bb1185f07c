// Package blk is microvm's block device, virtio-blk (virtio 1.2, 5.2), over
// a raw image file: reads and writes go straight between guest memory and
// the file with preadv/pwritev (no bounce buffers), flushes are fdatasync,
// discard and write-zeroes are fallocate (punch hole, zero range).
//
// Offered features: SEG_MAX, BLK_SIZE (512), FLUSH, RO for a read-only
// image, DISCARD and WRITE_ZEROES for a writable one; the transport adds
// VERSION_1, INDIRECT_DESC and EVENT_IDX. GET_ID returns Config.Serial.
//
// # Data path
//
// The driver puts a request on the request queue (5.2.6): a readable
// 16-byte header (type, sector), the data (readable for OUT, writable for
// IN), and a writable status byte last. It kicks the queue; under KVM that
// is an ioeventfd and wakes the dispatcher goroutine, which waits for a
// free slot (there are Config.InFlight of them), pops the chain into it
// (virtio.Queue.Pop: the walker bounds every descriptor), copies the header
// out once and checks it (parseRequest: chain shape, type, feature, read-
// only, length a multiple of 512, sector range without overflow), and hands
// the slot to a worker. The worker takes views of the data with the
// virtio.Reader/Writer cursors and runs one preadv/pwritev on them (at most
// 1024 buffers a call, resuming after short transfers), or fdatasync, or
// fallocate per segment, writes the status byte, and under the queue lock
// pushes the used entry and asks the queue whether the guest wants an
// interrupt (used_event with EVENT_IDX); if so it signals the irqfd. Up to
// InFlight requests run at once, so a slow read does not hold back the
// others; the guest completes them in any order, as the spec allows.
// Once the ring is empty the dispatcher re-enables kicks (which with
// EVENT_IDX writes avail_event) and re-checks the ring before sleeping.
//
// # Untrusted guest
//
// A chain without room for the header or the status byte, a read with
// readable data or a write with writable data is malformed: the device
// cannot answer it, so it reports it through Activation.Fail (the
// transport sets DEVICE_NEEDS_RESET), counts it in Stats.GuestErrorsByKind
// (virtio.GuestErrHeader: no room for the header or status; virtio.GuestErrLayout: data
// buffers in the wrong direction) and stops taking requests until the
// driver resets it; broken rings are handled the same way
// (virtio.GuestErrQueue). A well-formed request the device will not do is
// answered: IOERR for sectors beyond the capacity (sector+count checked
// without overflow), lengths that are not whole sectors, writes to a
// read-only disk, bad segment counts or lengths; UNSUPP for unknown types,
// a type whose feature was not negotiated, and reserved segment flags.
// Those count in Stats.Refused. Discard and write-zeroes segments are
// copied out of guest memory once and all checked before any is acted on.
// Nothing on the guest's side panics the device.
//
// # The image
//
// Open takes flock(LOCK_EX|LOCK_NB) on the image (LOCK_SH when read-only),
// so a second microvm on the same image is refused with a clear error
// instead of corrupting it, and refuses images that are empty or whose
// size is not a multiple of 512. The lock goes with Close.
//
// # Copy-on-write
//
// With Config.CopyOnWrite (overlay.go) the image is a base opened
// read-only under LOCK_SH, so many devices (clones of one snapshot, warm
// jobs) share it, and is never written; the guest sees a writable disk.
// Its writes go to an overlay: an unlinked sparse file of the image's size
// (O_TMPFILE in Config.OverlayDir, or created and unlinked at once where
// the file system lacks it), thrown away with the device, and a bitmap of
// the 4 KiB blocks (CopyOnWriteBlockSize) the overlay holds, 1 bit per
// block, sized at Open and never grown. A read is split into runs of
// blocks from one layer, one preadv each into the guest's buffers. A
// write first makes the overlay hold each block it touches: one it covers
// in part is copied up from the base whole (read-modify-write, so the
// overlay only ever holds whole blocks), one it covers whole is claimed;
// then one pwritev puts the data into the overlay. Write-zeroes does the
// same and zeroes the range in the overlay; discard claims the blocks its
// range covers whole and punches them out of the overlay (they read as
// zeros), leaving blocks it covers in part alone (discard is a hint).
// Flush does nothing: the base is not written and the overlay is not
// kept. Every range was bounded by parseRequest; the overlay checks it
// again and answers IOERR rather than index its bitmap out of range. A
// snapshot of a disk whose overlay holds blocks saves them (state.go):
//
//	Quiesce -> SaveDeviceState ({"OverlayBlocks": n})
//	-> SaveDeviceData: the bitmap copied, then a reader of header, bitmap
//	   and each set block, read from the overlay as the snapshot writer
//	   reaches it (overlay_save.go)
//
// and a restore, on a new device before it is activated, reads that part
// into its fresh overlay (RestoreDeviceData; zero blocks stay holes, the
// bitmap is set last) and then checks the state's count against it.
//
// # Goroutines and locks
//
// Per activation: one dispatcher (owns popping and the kick eventfd) and
// InFlight workers (own the slot they hold). A slot moves dispatcher ->
// work channel -> worker -> free channel, so one goroutine at a time
// touches its chain. Session.qmu guards the queue: the dispatcher holds it
// to pop and to re-enable kicks, a worker to push and decide on an
// interrupt; nothing else is taken under it except the transport's
// interrupt lock inside ActiveQueue.Interrupt, which is called after
// qmu is released. The device's virtio.Lifecycle guards the active session;
// its lock is taken only by Activate, Reset, Quiesce and Close, and not
// while a session stops (the MMIO transport calls the first three with its
// mu held: MMIO.mu -> Lifecycle.mu -> nothing). Reset sets the session's
// abandon flag, closes the quit channel and signals the stop eventfd: the
// dispatcher stops popping and closes the work channel, the workers finish
// the I/O of the requests they hold (as QEMU drains in-flight requests on
// reset) but publish nothing, since the driver is tearing its rings down,
// and return; Reset waits for all of them, so no goroutine touches guest
// memory after it returns. Counters are atomics.
//
// A CopyOnWrite disk's overlay adds its stripe locks (overlay.stripes):
// stripe b%64 guards setting block b's bit in the bitmap, and is held
// across a block's copy-up (a 4 KiB pread from the base and pwrite into
// the overlay: the one lock held across I/O, so that two requests writing
// parts of one block cannot both copy it and undo each other's bytes;
// overlay's comment says why claims take it too). A worker holds at most
// one stripe, never with qmu, and takes nothing under it. Bits are read
// with atomic loads and never cleared.
//
// Lock order: MMIO.mu -> Lifecycle.mu -> nothing; qmu -> nothing (the
// interrupt lock is taken after qmu is released); overlay stripe ->
// nothing.
//
// # Pause (snapshots)
//
// Device.Quiesce (quiesce.go; virtio.Quiescer) stops the session the same
// way but through session.Drain (virtio.Drainer), which leaves the abandon
// flag clear: the workers finish the I/O of every request the dispatcher
// popped and complete each as usual, status byte, Queue.Push (published)
// and the interrupt if the driver's suppression asks for one. Since only
// the dispatcher pops, and it hands each chain it popped to a worker
// before it looks at quit again, nothing is popped and not returned when
// Drain returns, and the used index in guest memory is the queue's; a
// failed session, which returns nothing more, has set DEVICE_NEEDS_RESET
// first. No lock is held across the I/O (qmu only around each push), and
// Drain takes none. The image, the flock and the counters stay; the next
// Activate (MMIO.Resume, or a restore) starts a session at the saved
// positions whose dispatcher pops what is in the ring before it waits for
// a kick.
package blk
