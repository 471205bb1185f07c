package virtio

import (
	"errors"
	"fmt"

	"github.com/microvm/microvm/kvm/guestmem"
)

// ErrGuest marks an error caused by what the guest driver wrote. A device that
// gets one from a queue stops using the queue and reports it; the transport
// then sets DEVICE_NEEDS_RESET.
var ErrGuest = errors.New("guest driver error")

func guestErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrGuest}, args...)...)
}

// Feature bits the queue implementation provides to every device (virtio
// 1.2, 6: reserved feature bits).
const (
	FeatureIndirectDesc = 1 << 28 // VIRTIO_F_INDIRECT_DESC
	FeatureEventIdx     = 1 << 29 // VIRTIO_F_EVENT_IDX
	FeatureVersion1     = 1 << 32 // VIRTIO_F_VERSION_1
	// QueueFeatures are offered on top of a device's own features.
	QueueFeatures = FeatureIndirectDesc | FeatureEventIdx | FeatureVersion1
)

// Split virtqueue layout (virtio 1.2, 2.7).
const (
	descSize        = 16
	availFlagNoIntr = 1 // VIRTQ_AVAIL_F_NO_INTERRUPT
	usedFlagNoNotif = 1 // VIRTQ_USED_F_NO_NOTIFY
	usedElemSize    = 8

	// MaxQueueSize is the largest queue size the spec allows (2.7).
	MaxQueueSize = 32768
)

// QueueConfig is what the driver tells the device about a queue: its size
// and the guest-physical addresses of its three parts.
type QueueConfig struct {
	Size  uint16 // entries: a power of two, at most the device's maximum
	Desc  uint64 // descriptor table
	Avail uint64 // driver area (available ring)
	Used  uint64 // device area (used ring)
}

// Validate checks the configuration against the spec's alignment rules and
// checks that every part lies inside guest memory.
func (c QueueConfig) Validate(mem *guestmem.Memory, maxSize uint16) error {
	if c.Size == 0 || c.Size&(c.Size-1) != 0 || c.Size > maxSize {
		return guestErr("queue size %d is not a power of two in 1..%d", c.Size, maxSize)
	}
	if c.Desc%16 != 0 || c.Avail%2 != 0 || c.Used%4 != 0 {
		return guestErr("queue addresses desc=%#x avail=%#x used=%#x are misaligned", c.Desc, c.Avail, c.Used)
	}
	n := uint64(c.Size)
	for _, part := range []struct {
		name      string
		gpa, size uint64
	}{
		{"descriptor table", c.Desc, descSize * n},
		{"available ring", c.Avail, 6 + 2*n},
		{"used ring", c.Used, 6 + usedElemSize*n},
	} {
		if err := mem.Check(part.gpa, part.size); err != nil {
			return guestErr("%s at %#x+%#x: %v", part.name, part.gpa, part.size, err)
		}
	}
	return nil
}

// Queue is the device side of one split virtqueue.
//
// Owner: one goroutine at a time (see the package doc). Nothing here is safe
// for concurrent use.
type Queue struct {
	mem      *guestmem.Memory
	cfg      QueueConfig
	eventIdx bool
	walker   Walker

	lastAvail uint16 // next available-ring entry to consume
	nextUsed  uint16 // next used-ring entry to fill (our copy of used->idx)
	// signalled is the used index at the last notification decision, for
	// VIRTIO_F_EVENT_IDX (2.7.10).
	signalled uint16
	// notifying reports whether the guest was last told to notify us.
	notifying bool

	pops, pushes, notifies uint64
}

// NewQueue returns a queue over validated configuration cfg. eventIdx says
// whether VIRTIO_F_EVENT_IDX was negotiated, indirect whether
// VIRTIO_F_INDIRECT_DESC was.
func NewQueue(mem *guestmem.Memory, cfg QueueConfig, eventIdx, indirect bool) *Queue {
	return &Queue{
		mem:       mem,
		cfg:       cfg,
		eventIdx:  eventIdx,
		walker:    Walker{mem: mem, desc: cfg.Desc, size: cfg.Size, indirect: indirect},
		notifying: true,
	}
}

// Size is the queue size.
func (q *Queue) Size() uint16 { return q.cfg.Size }

// Config returns the queue's configuration.
func (q *Queue) Config() QueueConfig { return q.cfg }

// LastAvail is the index of the next available entry the device will
// consume (vhost-user GET_VRING_BASE).
func (q *Queue) LastAvail() uint16 { return q.lastAvail }

// NextUsed is the index of the next used entry the device will fill
// (pushed, published or not): LastAvail less NextUsed is how many chains
// the device has popped and not returned.
func (q *Queue) NextUsed() uint16 { return q.nextUsed }

// SetIndices restores the device's ring positions (vhost-user
// SET_VRING_BASE): the next available entry to consume; the used index is
// read back from the ring, which the previous owner left consistent.
func (q *Queue) SetIndices(lastAvail uint16) error {
	q.lastAvail = lastAvail
	used, err := q.mem.Load16Acquire(q.cfg.Used + 2)
	if err != nil {
		return guestErr("used ring index: %v", err)
	}
	q.nextUsed = used
	q.signalled = used
	return nil
}

func (q *Queue) availIdx() (uint16, error) {
	v, err := q.mem.Load16Acquire(q.cfg.Avail + 2)
	if err != nil {
		return 0, guestErr("available ring index: %v", err)
	}
	return v, nil
}

// AvailIdx reads the driver's available index: how many buffers it has
// made available in all (modulo 2^16).
func (q *Queue) AvailIdx() (uint16, error) { return q.availIdx() }

// NotifyAfter asks the driver to kick as soon as it makes a buffer available
// past available index idx (with EVENT_IDX, avail_event = idx; without, the
// NO_NOTIFY flag cleared): for a device that waits for the driver to post
// more, whatever it has not consumed yet. Read the index again after it
// returns: a buffer posted just before may not have kicked.
func (q *Queue) NotifyAfter(idx uint16) error {
	q.notifying = true
	if q.eventIdx {
		if err := q.mem.Store16Release(q.cfg.Used+4+usedElemSize*uint64(q.cfg.Size), idx); err != nil {
			return guestErr("avail_event: %v", err)
		}
		return nil
	}
	return q.setUsedFlags(0)
}

// HasAvailable reports whether the driver has made buffers available that
// the device has not consumed yet.
func (q *Queue) HasAvailable() (bool, error) {
	idx, err := q.availIdx()
	if err != nil {
		return false, err
	}
	if uint16(idx-q.lastAvail) > q.cfg.Size {
		return false, guestErr("available index %d is %d entries ahead of %d (queue size %d)",
			idx, uint16(idx-q.lastAvail), q.lastAvail, q.cfg.Size)
	}
	return idx != q.lastAvail, nil
}

// Pop takes the next available chain into c (reusing its storage) and
// reports whether there was one. The chain stays valid until the next Pop on
// c. An error wraps ErrGuest.
func (q *Queue) Pop(c *Chain) (bool, error) {
	ok, err := q.HasAvailable()
	if err != nil || !ok {
		return false, err
	}
	slot := uint64(q.lastAvail % q.cfg.Size)
	head, err := q.mem.Read16(q.cfg.Avail + 4 + 2*slot)
	if err != nil {
		return false, guestErr("available ring entry %d: %v", slot, err)
	}
	if err := q.walker.Walk(head, c); err != nil {
		return false, err
	}
	q.lastAvail++
	q.pops++
	return true, nil
}

// Undo returns the most recently popped chain to the available ring, for a
// device that popped a buffer it cannot use yet.
func (q *Queue) Undo() { q.lastAvail-- }

// Push returns chain head to the driver with written bytes written into its
// device-writable part, and publishes the new used index.
func (q *Queue) Push(head uint16, written uint32) error {
	if err := q.PushNoPublish(head, written); err != nil {
		return err
	}
	return q.Publish()
}

// PushNoPublish fills a used-ring entry without publishing it; Publish makes
// all entries filled so far visible at once.
func (q *Queue) PushNoPublish(head uint16, written uint32) error {
	if head >= q.cfg.Size {
		// The device only pushes heads it popped, so this is our bug.
		panic(fmt.Sprintf("virtio: push of head %d on a queue of size %d", head, q.cfg.Size))
	}
	slot := uint64(q.nextUsed % q.cfg.Size)
	var e [usedElemSize]byte
	putLE32(e[0:], uint32(head))
	putLE32(e[4:], written)
	if err := q.mem.Write(q.cfg.Used+4+usedElemSize*slot, e[:]); err != nil {
		return guestErr("used ring entry %d: %v", slot, err)
	}
	q.nextUsed++
	q.pushes++
	return nil
}

// Publish stores the used index with release ordering, after the entries.
func (q *Queue) Publish() error {
	if err := q.mem.Store16Release(q.cfg.Used+2, q.nextUsed); err != nil {
		return guestErr("used ring index: %v", err)
	}
	return nil
}

// NeedsNotification reports whether the driver wants an interrupt for the
// used entries published since the last call that returned true (2.7.7 and
// 2.7.10). Call it after Publish.
func (q *Queue) NeedsNotification() (bool, error) {
	if q.eventIdx {
		// The store of used->idx in Publish is a full barrier, so this
		// read of used_event is not reordered before it.
		ev, err := q.mem.Load16Acquire(q.cfg.Avail + 4 + 2*uint64(q.cfg.Size))
		if err != nil {
			return false, guestErr("used_event: %v", err)
		}
		old := q.signalled
		q.signalled = q.nextUsed
		if q.nextUsed-ev-1 < q.nextUsed-old {
			q.notifies++
			return true, nil
		}
		return false, nil
	}
	flags, err := q.mem.Load16Acquire(q.cfg.Avail)
	if err != nil {
		return false, guestErr("available ring flags: %v", err)
	}
	if flags&availFlagNoIntr != 0 {
		return false, nil
	}
	if q.signalled == q.nextUsed {
		return false, nil // nothing new since the last notification
	}
	q.signalled = q.nextUsed
	q.notifies++
	return true, nil
}

// DisableNotification asks the driver not to kick this queue: the device is
// going to look at the ring anyway. With EVENT_IDX nothing needs writing: the
// driver kicks only when it passes avail_event, which stays where it was.
func (q *Queue) DisableNotification() error {
	if !q.notifying {
		return nil
	}
	q.notifying = false
	if q.eventIdx {
		return nil
	}
	return q.setUsedFlags(usedFlagNoNotif)
}

// EnableNotification asks the driver to kick again and reports whether
// buffers became available meanwhile (then the caller must keep processing:
// the driver may have checked the old setting and skipped its kick).
func (q *Queue) EnableNotification() (bool, error) {
	q.notifying = true
	if q.eventIdx {
		if err := q.mem.Store16Release(q.cfg.Used+4+usedElemSize*uint64(q.cfg.Size), q.lastAvail); err != nil {
			return false, guestErr("avail_event: %v", err)
		}
	} else if err := q.setUsedFlags(0); err != nil {
		return false, err
	}
	// The release store above is a full barrier before this re-read.
	return q.HasAvailable()
}

func (q *Queue) setUsedFlags(v uint16) error {
	if err := q.mem.Store16Release(q.cfg.Used, v); err != nil {
		return guestErr("used ring flags: %v", err)
	}
	return nil
}

// Stats returns counters: chains popped, entries pushed, notifications sent.
func (q *Queue) Stats() (pops, pushes, notifies uint64) { return q.pops, q.pushes, q.notifies }

func putLE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
