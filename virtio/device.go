package virtio

import (
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/kvm/guestmem"
)

// Device type ids (virtio 1.2, 5).
const (
	DeviceNet   = 1
	DeviceBlock = 2
	DeviceRNG   = 4
	Device9P    = 9
	DeviceVsock = 19
)

// Device is a virtio device model. The transport owns registers, status and
// queue configuration; the device sees only activated queues.
type Device interface {
	// Type is the virtio device id.
	Type() uint32
	// Features are the device-specific feature bits it offers; the queue
	// features (QueueFeatures) are added by the transport.
	Features() uint64
	// QueueSizes lists, per queue, the largest size the device accepts.
	QueueSizes() []uint16
	// ReadConfig reads the device configuration space at offset into p.
	// offset+len(p) may run past the space: such bytes read as zero.
	ReadConfig(offset uint64, p []byte)
	// WriteConfig writes p to the configuration space at offset; bytes
	// past the space are ignored.
	WriteConfig(offset uint64, p []byte)
	// Activate starts the device with the negotiated features and the
	// driver's queues. It is called once per driver initialisation.
	Activate(a Activation) error
	// Reset stops the device (its workers have returned when Reset does)
	// and drops all state tied to the previous activation.
	Reset()
}

// Activation is what a transport hands a device when the driver sets
// DRIVER_OK (virtio-mmio) or the frontend starts the rings (vhost-user).
type Activation struct {
	// Mem is the guest memory the queues' addresses refer to.
	Mem *guestmem.Memory
	// Features are the feature bits the driver accepted.
	Features uint64
	// Queues is indexed by queue number. An entry is nil when the driver
	// did not enable the queue (or, under vhost-user, when the frontend
	// keeps it: QEMU keeps vsock's event queue).
	Queues []*ActiveQueue
	// Fail reports a guest error that stops the device. The transport
	// counts and logs it and sets DEVICE_NEEDS_RESET. Safe from any
	// goroutine.
	Fail func(error)
	// SharedInterrupt says that every queue's Interrupt raises the same
	// interrupt and that the driver looks at every queue when it comes
	// (virtio-mmio: one line, one used-buffer status bit), so an
	// interrupt raised for one queue after another queue's used ring was
	// published serves both. Under vhost-user each queue has its own.
	SharedInterrupt bool
}

// ActiveQueue is a queue plus its two signals.
type ActiveQueue struct {
	*Queue
	// Kick is signalled when the driver notifies the queue.
	Kick *eventfd.EventFD
	// Interrupt tells the driver about new used buffers. Safe from any
	// goroutine.
	Interrupt func()
}

// Notify publishes nothing itself: it interrupts the driver if the queue's
// suppression settings ask for it. Call after Queue.Publish.
func (q *ActiveQueue) Notify() error {
	need, err := q.NeedsNotification()
	if err != nil {
		return err
	}
	if need {
		q.Interrupt()
	}
	return nil
}
