package virtio

import (
	"fmt"
	"sync/atomic"

	"github.com/sirupsen/logrus"
)

// GuestErrorKind says which rule a guest driver broke. One list serves the
// transport and every device; each says which kinds it reports (its
// GuestErrorKinds), and its metrics label only those.
type GuestErrorKind uint8

// Kinds of guest errors.
const (
	// GuestErrRegister (transport): an access of the wrong width or
	// alignment, a write to a read-only or reserved register, a notify of
	// a queue that does not exist (4.2.2).
	GuestErrRegister GuestErrorKind = iota
	// GuestErrFeatures (transport): features written outside negotiation,
	// a feature word that does not exist, bits not offered, no
	// VIRTIO_F_VERSION_1.
	GuestErrFeatures
	// GuestErrQueue: a broken ring, descriptor chain or buffer (an index
	// out of range, a loop, a buffer outside guest memory), found by the
	// virtqueue code; for the transport, queue configuration out of order
	// or rings outside guest memory (4.2.3.2). A device that sees one
	// stops until the driver resets it.
	GuestErrQueue
	// GuestErrStatus (transport): a device status move the table forbids
	// (2.1.1).
	GuestErrStatus
	// GuestErrDevice (transport): the device failed (Activation.Fail) or
	// refused activation; the transport set DEVICE_NEEDS_RESET.
	GuestErrDevice
	// GuestErrHeader: a request or packet chain too short for its header
	// (or, for a block request, without a writable status byte).
	GuestErrHeader
	// GuestErrLayout: buffers in the wrong direction for the request
	// (readable where the device writes, or the reverse).
	GuestErrLayout
	// GuestErrAddress (vsock): CIDs other than the guest's and the host's,
	// or a datagram port of VMADDR_PORT_ANY.
	GuestErrAddress
	// GuestErrType (vsock): a socket type not negotiated, other than the
	// connection's, or not a datagram RW on the datagram queue.
	GuestErrType
	// GuestErrLength (vsock): a payload length beyond the chain or the
	// maximum.
	GuestErrLength
	// GuestErrOp (vsock): an operation the connection's state does not
	// allow, or an unknown one.
	GuestErrOp
	// GuestErrCredit (vsock): data past the credit the device granted.
	GuestErrCredit
	// NumGuestErrorKinds is the number of kinds.
	NumGuestErrorKinds
)

var guestErrorNames = [NumGuestErrorKinds]string{
	GuestErrRegister: "register",
	GuestErrFeatures: "features",
	GuestErrQueue:    "queue",
	GuestErrStatus:   "status",
	GuestErrDevice:   "device",
	GuestErrHeader:   "header",
	GuestErrLayout:   "layout",
	GuestErrAddress:  "address",
	GuestErrType:     "type",
	GuestErrLength:   "length",
	GuestErrOp:       "op",
	GuestErrCredit:   "credit",
}

// String is the kind's name as metrics label it.
func (k GuestErrorKind) String() string {
	if k < NumGuestErrorKinds {
		return guestErrorNames[k]
	}
	return fmt.Sprintf("kind-%d", int(k))
}

// GuestErrorCounts are guest errors by kind, as a device's or the
// transport's Stats report them.
type GuestErrorCounts [NumGuestErrorKinds]uint64

// Total is the sum over all kinds.
func (c GuestErrorCounts) Total() uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}

// GuestErrors counts guest errors by kind: one atomic per kind, bumped by
// whichever goroutine sees the error, no lock. The zero value is ready.
type GuestErrors struct {
	n [NumGuestErrorKinds]atomic.Uint64
}

// Add counts one error of kind (the caller logs it, or reports it
// through Activation.Fail, which logs).
func (g *GuestErrors) Add(kind GuestErrorKind) { g.n[kind].Add(1) }

// Report counts one error of kind and logs it as a warning on log,
// prefixed with prefix ("vsock: guest error: ").
func (g *GuestErrors) Report(log logrus.FieldLogger, kind GuestErrorKind, prefix, format string, args ...any) {
	g.n[kind].Add(1)
	log.Warnf(prefix+format, args...)
}

// Counts returns the counters; each is read atomically.
func (g *GuestErrors) Counts() GuestErrorCounts {
	var c GuestErrorCounts
	for k := range c {
		c[k] = g.n[k].Load()
	}
	return c
}
