package virtionet

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// Feature bits (virtio 1.2, 5.1.3).
const (
	FeatureCsum      = 1 << 0  // VIRTIO_NET_F_CSUM: the driver may leave checksums to the device
	FeatureGuestCsum = 1 << 1  // VIRTIO_NET_F_GUEST_CSUM: the driver takes partial checksums
	FeatureMAC       = 1 << 5  // VIRTIO_NET_F_MAC: the config space holds the MAC
	FeatureGuestTSO4 = 1 << 7  // VIRTIO_NET_F_GUEST_TSO4
	FeatureGuestTSO6 = 1 << 8  // VIRTIO_NET_F_GUEST_TSO6
	FeatureGuestECN  = 1 << 9  // VIRTIO_NET_F_GUEST_ECN (not offered)
	FeatureGuestUFO  = 1 << 10 // VIRTIO_NET_F_GUEST_UFO
	FeatureHostTSO4  = 1 << 11 // VIRTIO_NET_F_HOST_TSO4
	FeatureHostTSO6  = 1 << 12 // VIRTIO_NET_F_HOST_TSO6
	FeatureHostECN   = 1 << 13 // VIRTIO_NET_F_HOST_ECN (not offered)
	FeatureHostUFO   = 1 << 14 // VIRTIO_NET_F_HOST_UFO
	FeatureMrgRxbuf  = 1 << 15 // VIRTIO_NET_F_MRG_RXBUF: a frame may span several RX chains
	FeatureStatus    = 1 << 16 // VIRTIO_NET_F_STATUS: the config space holds the link status

	// Offered is what the device offers on top of the queue features,
	// on a TAP.
	Offered = FeatureCsum | FeatureGuestCsum | FeatureMAC | FeatureGuestTSO4 | FeatureGuestTSO6 |
		FeatureGuestUFO | FeatureHostTSO4 | FeatureHostTSO6 | FeatureHostUFO | FeatureMrgRxbuf | FeatureStatus
	// OfferedPlain is what it offers on a socket of plain frames
	// (NewSocket): no checksum or segmentation offload, as nothing on
	// the other side would finish the work.
	OfferedPlain = FeatureMAC | FeatureMrgRxbuf | FeatureStatus
)

// Queue indices (5.1.2): one receive/transmit pair, no control queue.
const (
	QueueRX = 0
	QueueTX = 1
	// DefaultQueueSize is the size offered for each queue.
	DefaultQueueSize = 256
)

// statusLinkUp is VIRTIO_NET_S_LINK_UP (5.1.4).
const statusLinkUp = 1

// Config configures a virtio-net device.
type Config struct {
	// TAP is the host interface the device attaches to (created when it
	// does not exist and the VMM has CAP_NET_ADMIN).
	TAP string
	// NetNS is the network namespace the TAP is in (a path such as
	// /var/run/netns/NAME); "" is the VMM's own (OpenTAPIn).
	NetNS string
	// MAC is the guest's address; nil picks a random locally administered
	// unicast one.
	MAC net.HardwareAddr
	// NewMAC lets a restore (RestoreDeviceState) keep MAC although the
	// saved state says the guest's driver uses another: a clone's own
	// address, which the guest learns from its agent (SetMAC), not from
	// the device. Without it such a restore is refused.
	NewMAC bool
	// QueueSize is offered for both queues (default DefaultQueueSize).
	QueueSize uint16
	// Log receives diagnostics (nil: logrus.StandardLogger()).
	Log logrus.FieldLogger
}

// Stats are the device's counters.
type Stats struct {
	TxFrames, RxFrames uint64 // frames guest->TAP, TAP->guest
	TxBytes, RxBytes   uint64 // their bytes, headers excluded
	TxErrors           uint64 // guest TX chains with a bad header or length: dropped, chain returned
	TxDropped          uint64 // frames the TAP refused with an error other than EAGAIN
	TxStalls           uint64 // writes that found the TAP full (EAGAIN): retried on POLLOUT, not dropped
	RxDropped          uint64 // TAP frames no posted guest buffer could hold (too large for them)
	RxErrors           uint64 // TAP reads that failed or returned a runt
	RxStalls           uint64 // times the RX worker stopped reading the TAP for want of guest buffers
	TxKicks, RxKicks   uint64 // queue notifications observed by the workers
	Interrupts         uint64 // interrupts sent, both queues
}

type counters struct {
	txFrames, rxFrames, txBytes, rxBytes, txErrors, txDropped, txStalls,
	rxDropped, rxErrors, rxStalls, txKicks, rxKicks, interrupts atomic.Uint64
}

// Device is a virtio-net device (virtio 1.2, 5.1) on a TAP.
type Device struct {
	cfg Config
	be  backend
	log logrus.FieldLogger
	ctr counters

	life virtio.Lifecycle[*session] // the current activation

	// mu guards mac (which RestoreDeviceState may change) and paused
	// (quiesce.go). It is held to copy a field, never across a system
	// call; it nests inside Lifecycle.mu (Activate takes paused there).
	mu     sync.Mutex
	mac    [6]byte
	paused *paused // what a drained session left the next one; nil after a Reset
}

// New opens the TAP cfg.TAP (in cfg.NetNS) and returns a device on it. The
// device owns the descriptor until Close.
func New(cfg Config) (*Device, error) {
	t, err := OpenTAPIn(cfg.TAP, cfg.NetNS)
	if err != nil {
		return nil, err
	}
	d, err := newDevice(cfg, t)
	if err != nil {
		t.Close()
		return nil, err
	}
	return d, nil
}

// NewSocket returns a device on fd, a connected AF_UNIX socket where each
// record (SOCK_SEQPACKET) or datagram (SOCK_DGRAM) is one plain Ethernet
// frame, without a virtio-net header: what user-mode network stacks speak
// (gvisor-tap-vsock's bess and vfkit protocols, QEMU's dgram netdev).
// SOCK_SEQPACKET is the better of the two: Linux queues at most
// net.unix.max_dgram_qlen (10 by default) datagrams on a SOCK_DGRAM
// socket, which caps the frames in flight. cfg.TAP is ignored. The device
// owns fd from the call on, also when it fails.
func NewSocket(cfg Config, fd int) (*Device, error) {
	s, err := newSocket(fd)
	if err != nil {
		return nil, err
	}
	d, err := newDevice(cfg, s)
	if err != nil {
		s.Close()
		return nil, err
	}
	return d, nil
}

// newDevice returns a device on be (a TAP, a socket, or a test's socketpair).
func newDevice(cfg Config, be backend) (*Device, error) {
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.QueueSize&(cfg.QueueSize-1) != 0 || cfg.QueueSize > virtio.MaxQueueSize {
		return nil, fmt.Errorf("virtio-net: queue size %d is not a power of two up to %d", cfg.QueueSize, virtio.MaxQueueSize)
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	d := &Device{cfg: cfg, be: be, log: cfg.Log, life: virtio.Lifecycle[*session]{Name: "virtio-net"}}
	switch {
	case cfg.MAC == nil:
		m, err := RandomMAC()
		if err != nil {
			return nil, err
		}
		copy(d.mac[:], m)
	case len(cfg.MAC) != 6 || cfg.MAC[0]&0x01 != 0:
		return nil, fmt.Errorf("virtio-net: MAC %v: want a 6-byte unicast address", cfg.MAC)
	default:
		copy(d.mac[:], cfg.MAC)
	}
	return d, nil
}

// RandomMAC returns a random unicast, locally administered address.
func RandomMAC() (net.HardwareAddr, error) {
	m := make(net.HardwareAddr, 6)
	if _, err := unix.Getrandom(m, 0); err != nil {
		return nil, fmt.Errorf("virtio-net: random MAC: %w", err)
	}
	m[0] = m[0]&^0x01 | 0x02
	return m, nil
}

// ParseMAC parses a unicast Ethernet address (aa:bb:cc:dd:ee:ff).
func ParseMAC(s string) (net.HardwareAddr, error) {
	m, err := net.ParseMAC(s)
	if err != nil || len(m) != 6 {
		return nil, fmt.Errorf("MAC %q: want six hex bytes separated by colons", s)
	}
	if m[0]&0x01 != 0 {
		return nil, fmt.Errorf("MAC %q is a multicast address", s)
	}
	return m, nil
}

// MAC is the guest's address.
func (d *Device) MAC() net.HardwareAddr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append(net.HardwareAddr(nil), d.mac[:]...)
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceNet }

// Features implements virtio.Device: Offered on a TAP, OfferedPlain on a
// socket of plain frames.
func (d *Device) Features() uint64 {
	if d.be.VnetHeader() {
		return Offered
	}
	return OfferedPlain
}

// QueueSizes implements virtio.Device: receive and transmit.
func (d *Device) QueueSizes() []uint16 { return []uint16{d.cfg.QueueSize, d.cfg.QueueSize} }

// ReadConfig implements virtio.Device: mac[6], status (link up) and
// max_virtqueue_pairs (1) (5.1.4).
func (d *Device) ReadConfig(offset uint64, p []byte) {
	var cfg [10]byte
	d.mu.Lock()
	copy(cfg[:], d.mac[:])
	d.mu.Unlock()
	cfg[6] = statusLinkUp
	cfg[8] = 1
	clear(p)
	if offset < uint64(len(cfg)) {
		copy(p, cfg[offset:])
	}
}

// WriteConfig implements virtio.Device: the fields are read-only for a
// VERSION_1 driver without VIRTIO_NET_F_CTRL_MAC_ADDR (5.1.4.2).
func (d *Device) WriteConfig(uint64, []byte) {}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	c := &d.ctr
	return Stats{
		TxFrames: c.txFrames.Load(), RxFrames: c.rxFrames.Load(),
		TxBytes: c.txBytes.Load(), RxBytes: c.rxBytes.Load(),
		TxErrors: c.txErrors.Load(), TxDropped: c.txDropped.Load(), TxStalls: c.txStalls.Load(),
		RxDropped: c.rxDropped.Load(), RxErrors: c.rxErrors.Load(), RxStalls: c.rxStalls.Load(),
		TxKicks: c.txKicks.Load(), RxKicks: c.rxKicks.Load(), Interrupts: c.interrupts.Load(),
	}
}

// Activate implements virtio.Device: it sets the TAP's offloads to what the
// driver negotiated and starts the RX and TX workers.
func (d *Device) Activate(a virtio.Activation) error {
	if len(a.Queues) < 2 || a.Queues[QueueRX] == nil || a.Queues[QueueTX] == nil {
		return fmt.Errorf("%w: virtio-net needs its receive and transmit queues", virtio.ErrGuest)
	}
	return d.life.Activate(func() (*session, error) {
		p := d.takePaused(a.Features)
		if err := d.be.SetOffload(offloadFlags(a.Features)); err != nil {
			return nil, err
		}
		if p == nil {
			// Frames queued before this activation were offloaded for the
			// previous driver's features: drop them. Bounded, as the TAP's
			// queue. A resumed session keeps them: they are the same
			// driver's next frames (quiesce.go).
			var scratch [HeaderSize + MaxFrame]byte
			for i := 0; i < 4096; i++ {
				if _, err := unix.Read(d.be.FD(), scratch[:]); err != nil && err != unix.EINTR {
					break
				}
			}
		}
		s, err := newSession(d, a, p)
		if err != nil {
			return nil, err
		}
		s.start()
		return s, nil
	})
}

// Reset implements virtio.Device: it stops the workers; a frame read from
// the TAP but not yet delivered is dropped with the queues, also one a
// quiesced session left for the next (the next driver starts afresh).
func (d *Device) Reset() {
	d.life.Reset()
	d.mu.Lock()
	d.paused = nil
	d.mu.Unlock()
}

// Close resets the device, refuses later activations and closes the TAP.
func (d *Device) Close() error {
	if !d.life.Close() {
		return nil
	}
	return d.be.Close()
}

// session is one activation: the queues and the two workers.
type session struct {
	d        *Device
	features uint64
	rx, tx   *virtio.ActiveQueue
	fail     func(error)
	failed   atomic.Bool
	// stopRX and stopTX end the workers; each is read only by its worker.
	stopRX, stopTX *eventfd.EventFD
	wg             sync.WaitGroup
	// rxst and txst are the workers' state, each owned by its worker
	// while it runs and by Drain once wg.Wait has returned.
	rxst *rxState
	txst *txState
}

// newSession makes the session of activation a; p, when not nil, is what
// a drained session of the same driver left (a resume).
func newSession(d *Device, a virtio.Activation, p *paused) (*session, error) {
	s := &session{d: d, features: a.Features, rx: a.Queues[QueueRX], tx: a.Queues[QueueTX], fail: a.Fail}
	s.rxst = newRXState(s.rx.Size(), p)
	s.txst = &txState{}
	var err error
	if s.stopRX, err = eventfd.NewNonblocking(); err != nil {
		return nil, err
	}
	if s.stopTX, err = eventfd.NewNonblocking(); err != nil {
		s.stopRX.Close()
		return nil, err
	}
	return s, nil
}

func (s *session) start() {
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.rxLoop() }()
	go func() { defer s.wg.Done(); s.txLoop() }()
}

// Stop implements virtio.Session: it signals both workers, waits for them
// and closes their eventfds.
func (s *session) Stop() {
	_ = s.stopRX.Signal()
	_ = s.stopTX.Signal()
	s.wg.Wait()
	s.stopRX.Close()
	s.stopTX.Close()
}

// failDevice reports a ring error: the device stops using both queues and
// the transport sets DEVICE_NEEDS_RESET. Either worker may call it.
func (s *session) failDevice(err error) {
	if s.failed.Swap(true) {
		return
	}
	s.d.log.WithError(err).Warn("virtio-net: device failed")
	s.fail(err)
}

// notify interrupts the driver when q's suppression settings ask for it.
// Called by q's owner after Publish.
func (s *session) notify(q *virtio.ActiveQueue) error {
	need, err := q.NeedsNotification()
	if err != nil {
		return err
	}
	if need {
		q.Interrupt()
		s.d.ctr.interrupts.Add(1)
	}
	return nil
}

func virtioGuestErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{virtio.ErrGuest}, args...)...)
}
