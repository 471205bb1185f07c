package vsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/virtio"
)

// Queue indices (5.10.2).
const (
	QueueRX    = 0 // device -> guest packets
	QueueTX    = 1 // guest -> device packets
	QueueEvent = 2 // transport events (event.go)
	// DefaultQueueSize is the size offered for each queue.
	DefaultQueueSize = 256
)

// Defaults for Config.
const (
	DefaultMaxConns       = 1023      // Config.MaxConns
	DefaultConnBuffer     = 256 << 10 // Config.ConnBuffer: Linux's own default, Firecracker's buffer
	DefaultConnectTimeout = 2 * time.Second
	// DefaultMaxBuffered is Config.MaxBuffered: 256 connections' worth of
	// the default buffer (more when MaxConns needs it:
	// DefaultMaxBufferedFor).
	DefaultMaxBuffered = 64 << 20
	// MaxConnBuffer bounds Config.ConnBuffer.
	MaxConnBuffer = 1 << 30 // Config.ConnectTimeout
	// hostPortBase..hostPortLimit is where host-initiated connections get
	// their host-side port (Firecracker's range).
	hostPortBase  = 1 << 30
	hostPortLimit = 1 << 31
)

// ErrBufferTotal is wrapped by New's error when Config.MaxBuffered cannot
// give every one of MaxConns connections its minimum window.
var ErrBufferTotal = errors.New("raise the buffer total or lower the connection limit")

// Options switch the data-path optimisations, so each can be measured on
// and off (bench-vsock). The zero value is the plain design; DefaultOptions
// is what microvm runs with.
type Options struct {
	// KickSuppress keeps the guest's TX kicks disabled while the device
	// writes to host sockets, re-enabling them only with a final ring
	// re-check (seed 002).
	KickSuppress bool
	// DirectEnqueue lets the goroutine that produces a control packet put
	// it in the RX ring itself when nothing is queued ahead of it, instead
	// of waking the RX worker (seed 001).
	DirectEnqueue bool
	// BatchLock processes a run of TX packets for one connection under a
	// single lock acquisition and decides on a credit update once per run
	// (seed 000); the run's payloads go to the host socket in one writev
	// at its end, or before any packet of the run that may end the
	// connection (an RST, SHUTDOWN or reset), so that the host gets the
	// same bytes as without it.
	BatchLock bool
	// ShortReadDrains takes a read from a host stream socket that
	// returned less than it asked for as the socket drained, and waits
	// for epoll's next edge instead of reading again to see EAGAIN. Not
	// once a hang-up was reported, which no later edge repeats: then the
	// device reads on to the end of the stream.
	ShortReadDrains bool
	// SendBuffer asks for a send buffer (SO_SNDBUF) of the connection's
	// window (Config.ConnBuffer) on each host stream socket, so that what
	// the guest sends goes to the host socket rather than waiting in the
	// connection's byte queue for EPOLLOUT. Linux caps it at
	// net.core.wmem_max and doubles what it grants: with the defaults,
	// twice the default buffer.
	SendBuffer bool
	// ReadinessGate asks epoll only for the host-socket events the
	// device can act on (interest.go): no EPOLLIN while host data waits
	// that the guest has no credit for, EPOLLOUT only while guest bytes
	// wait in the connection's byte queue. Without it every host write
	// into a stalled connection, and every host read of what the device
	// wrote, wakes the RX worker for nothing.
	ReadinessGate bool
	// IRQCoalesce: on a transport with one interrupt for every queue
	// (virtio.Activation.SharedInterrupt: virtio-mmio), the RX interrupt
	// of the TX worker's direct enqueues waits for the end of its batch
	// and goes out with the batch's TX completions as one (txirq.go).
	IRQCoalesce bool
	//
	// There is no copybreak (seed 004): payloads always go to the host
	// socket straight from guest memory (writev); only what the socket
	// does not take is copied. Copying small payloads first was measured
	// and never won here (docs/notes/performance.md), because guest memory is
	// always mapped: scatter-gather has no per-buffer setup to amortise.
}

// DefaultOptions are the optimisations enabled by default.
var DefaultOptions = Options{KickSuppress: true, DirectEnqueue: true, BatchLock: true, ShortReadDrains: true, SendBuffer: true, ReadinessGate: true, IRQCoalesce: true}

// Dialer opens host-side connections for guest-initiated requests. Dial is
// called on its own goroutine and may block up to timeout; it returns a
// connected stream socket the device takes ownership of.
type Dialer interface {
	// Dial connects the guest's port guestPort to the host service for
	// port within timeout.
	Dial(guestPort, port uint32, timeout time.Duration) (fd int, err error)
}

// SeqpacketDialer is implemented by a Dialer that can also open host
// sockets for guest SEQPACKET connections. Without it the device answers a
// guest's SEQPACKET REQUEST with RST.
type SeqpacketDialer interface {
	// DialSeqpacket connects the guest's port guestPort to the host
	// service for port within timeout and returns a connected
	// SOCK_SEQPACKET socket: each record is one message.
	DialSeqpacket(guestPort, port uint32, timeout time.Duration) (fd int, err error)
}

// Config configures a vsock device.
type Config struct {
	CID        uint64 // the guest's context id (3 .. 2^32-2)
	MaxConns   int    // default DefaultMaxConns
	ConnBuffer uint32 // per-connection buffer, default DefaultConnBuffer
	// MaxBuffered bounds the guest->host bytes the whole device may have
	// to buffer (default DefaultMaxBufferedFor(MaxConns, ConnBuffer)):
	// the credit granted to all connections together. MaxConns times a
	// minimum window (4 KiB, at most ConnBuffer) of it is reserved, so
	// that every connection always has credit; a MaxBuffered below that
	// is refused (ErrBufferTotal). Above the reserve, windows grow as
	// connections use them; when the budget is spent the device grants
	// less credit (a smaller buf_alloc, a fwd_cnt held back) instead of
	// resetting anyone; see the package comment.
	MaxBuffered    uint64
	ConnectTimeout time.Duration      // connect and close timeouts, default DefaultConnectTimeout
	QueueSize      uint16             // default DefaultQueueSize
	Options        *Options           // nil: DefaultOptions
	Dialer         Dialer             // guest-initiated connections; nil refuses them (SEQPACKET ones need a SeqpacketDialer)
	Log            logrus.FieldLogger // nil: logrus.StandardLogger()

	// Dgram offers FeatureDgram, microvm's own datagram feature (bit 23;
	// not the RFC's VIRTIO_VSOCK_F_DGRAM; experimental, off by default):
	// the device gets a datagram queue pair (queues 3 and 4, 5 queues in
	// all) and New binds the host datagram socket DgramUDS+".dgram".
	Dgram bool
	// DgramUDS is the path prefix of the host datagram sockets (required
	// with Dgram; microvm uses the stream socket's path): host
	// applications send to "<DgramUDS>.dgram", guest datagrams to host
	// port P go to "<DgramUDS>_<P>.dgram". See the package comment.
	DgramUDS string
}

// Stats are the device's counters.
type Stats struct {
	TxPackets, RxPackets uint64 // guest->device, device->guest
	TxBytes, RxBytes     uint64 // payload bytes
	ConnsOpened          uint64 // connections ever added to the table
	ConnsOpen            int64  // connections not yet closed
	// ConnsEstablished counts connections that reached the established
	// state, either way. ConnsRefused counts connection attempts that
	// never did: guest REQUESTs the host side refused (no listener, a
	// dial error, a limit, a socket type it cannot serve), host CONNECTs
	// the guest refused (RST) or left unanswered past the connect
	// timeout, and host CONNECTs the device could not start. ConnsReset
	// counts established connections that ended by an RST rather than
	// the orderly SHUTDOWN(BOTH) then RST: the guest's, or the device's
	// (a guest error on the connection, a host socket error, a guest that
	// did not finish closing in time).
	ConnsEstablished, ConnsRefused, ConnsReset uint64
	RstSent                                    uint64 // RSTs sent to the guest (resets, and packets for no connection)
	// GuestErrors counts malformed packets and protocol violations (the
	// sum of GuestErrorsByKind).
	GuestErrors       uint64
	GuestErrorsByKind virtio.GuestErrorCounts
	DroppedRsts       uint64 // RSTs dropped because the queue was full
	// RxQueueFull counts the RX worker's passes that stopped with packets
	// still to send because the guest had no free RX buffer (the worker
	// then waits for an RX kick).
	RxQueueFull    uint64
	DirectEnqueues uint64 // connection work (control packets; host data the TX worker unblocked) a producer put in the RX ring itself
	// RxHandoffs counts connection work another goroutine (the TX worker,
	// a dial goroutine, a host connect) handed to the RX worker, through
	// the ready list and a wake-up, instead of putting it in the RX ring
	// itself: the hop DirectEnqueue removes. Host data the RX worker
	// learns of by its own epoll is no hand-off.
	RxHandoffs       uint64
	TxKicks, RxKicks uint64 // queue notifications observed by the workers
	Interrupts       uint64 // RX interrupts sent
	TxInterrupts     uint64 // TX-completion interrupts sent
	// TxInterruptsCovered counts TX-completion interrupts not sent
	// because the RX interrupt held to the end of the batch announced
	// them on the shared line (IRQCoalesce).
	TxInterruptsCovered uint64
	HostWriteStalls     uint64 // host writes the socket took only in part (writev or buffer flush)
	HostReadsEmpty      uint64 // host socket reads that found nothing (EAGAIN): the syscalls ShortReadDrains saves
	InterestChanges     uint64 // epoll_ctl calls changing what a host socket's registration asks for (ReadinessGate)
	HostEvents          uint64 // epoll events of host sockets the RX worker handled: each one a look at the connection, often a wake-up
	CreditUpdatesSent   uint64 // CREDIT_UPDATE packets sent
	LateRWDropped       uint64 // RW packets the guest sent before it saw the device's SHUTDOWN(BOTH): the host had gone
	SeqToHost           uint64 // SEQPACKET messages written to host sockets, one record each
	SeqToGuest          uint64 // SEQPACKET records from host sockets sent to the guest, one message each
	// BufferGranted is the guest->host buffer space granted to open
	// connections now (at most Config.MaxBuffered); CreditStalls counts
	// the grants Config.MaxBuffered cut short.
	BufferGranted uint64
	CreditStalls  uint64

	// TransportResets counts ResetTransport calls on an active device;
	// EventsSent the TRANSPORT_RESET events written to the event queue
	// (fewer when resets came faster than the driver posted buffers, or
	// without an event queue).
	TransportResets uint64
	EventsSent      uint64

	// One counter per optimisation switch, zero when it is off, so a
	// switch that is silently ignored shows.
	KickSuppressions uint64 // TX passes run with the guest's kicks disabled across host writes (KickSuppress)
	BatchedPackets   uint64 // TX packets that joined a run already holding their connection's lock (BatchLock)

	// Datagrams (Config.Dgram). Malformed guest datagrams count in
	// GuestErrors.
	DgramTx, DgramRx           uint64 // datagrams delivered guest->host socket, host socket->guest
	DgramTxBytes, DgramRxBytes uint64 // their payload bytes
	DgramTxDropped             uint64 // guest datagrams no host socket took (no socket at the path, or its queue full)
	DgramRxDropped             uint64 // host datagrams dropped because the guest's datagram RX queue had no buffer
	DgramRxRejected            uint64 // host datagrams shorter than the address prefix or larger than the guest's buffer
	DgramKicks                 uint64 // datagram TX queue notifications observed

	// Passes cut at their budget with the ring possibly not empty (a
	// guest that keeps posting): the worker looked at its stop eventfd,
	// and the datagram worker served its RX queue, before going on.
	TxPassesCut, DgramPassesCut uint64
}

// GuestErrorKinds are the kinds the device reports
// (Stats.GuestErrorsByKind). All but virtio.GuestErrQueue reset the connection
// involved (or drop the datagram); virtio.GuestErrQueue (a broken ring,
// descriptor chain or RX buffer) stops the device until the driver resets
// it (the transport sets DEVICE_NEEDS_RESET).
var GuestErrorKinds = []virtio.GuestErrorKind{virtio.GuestErrHeader, virtio.GuestErrAddress, virtio.GuestErrType,
	virtio.GuestErrLength, virtio.GuestErrOp, virtio.GuestErrCredit, virtio.GuestErrQueue}

// counters are the device's Stats, each an atomic bumped by the goroutine
// that sees the event: no lock, no map on the data path.
type counters struct {
	txPackets, rxPackets, txBytes, rxBytes, connsOpened, rstSent, droppedRsts,
	directEnqueues, rxHandoffs, txKicks, rxKicks, interrupts, txInterrupts, txIRQCovered, hostWriteStalls, hostReadsEmpty, interestChanges, hostEvents, creditUpdates, lateRW,
	kickSuppressions, batchedPackets, seqToHost, seqToGuest, creditStalls,
	dgramTx, dgramRx, dgramTxBytes, dgramRxBytes, dgramTxDropped, dgramRxDropped, dgramRxRejected,
	dgramKicks, txPassesCut, dgramPassesCut, connsEstablished, connsRefused, connsReset, rxQueueFull, transportResets, eventsSent atomic.Uint64
	guestErrors virtio.GuestErrors
	connsOpen   atomic.Int64
}

// Device is a virtio-vsock device (virtio 1.2, 5.10) with stream sockets
// bridged to host Unix sockets.
type Device struct {
	cfg  Config
	opts Options
	log  logrus.FieldLogger
	ctr  counters
	// dgram is the host datagram socket (Config.Dgram), nil without; its
	// descriptor is used only by the active session's datagram worker.
	dgram *dgramHost
	// resetOwed: the guest driver may hold connections no session has,
	// and the next session must tell it so with a TRANSPORT_RESET first
	// (quiesce.go). Set by Drain and RestoreDeviceState, taken by the
	// activation that starts the next session, cleared by Reset (the
	// driver's connections go with it).
	resetOwed atomic.Bool
	// portSeq numbers host-initiated connections' host ports across
	// sessions (allocHostPortLocked), from a random start: a session after
	// a transport reset, in this process or in a restored one, must not
	// hand the guest the port of a connection it may still be closing
	// (a new CONNECT then met a reset: seen after live snapshots).
	portSeq atomic.Uint32

	life virtio.Lifecycle[*session] // the current activation

	// Tests only (export_test.go): called by the TX worker after each
	// batch it published, and by the datagram worker after each batch of
	// guest datagrams, on the worker's goroutine; nil: none.
	afterTXBatch, afterDgramBatch atomic.Pointer[func()]
}

// New returns a device for cfg.
func New(cfg Config) (*Device, error) {
	if cfg.CID < 3 || cfg.CID >= 0xffffffff {
		return nil, fmt.Errorf("vsock: guest CID %d is reserved or out of range", cfg.CID)
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ConnBuffer == 0 {
		cfg.ConnBuffer = DefaultConnBuffer
	}
	if cfg.ConnBuffer > MaxConnBuffer {
		// The credit arithmetic is u32: a window near 2^32 would let the
		// buffered-bytes check wrap.
		return nil, fmt.Errorf("vsock: per-connection buffer of %d bytes; at most %d", cfg.ConnBuffer, MaxConnBuffer)
	}
	if cfg.MaxBuffered == 0 {
		cfg.MaxBuffered = DefaultMaxBufferedFor(cfg.MaxConns, cfg.ConnBuffer)
	}
	if r := MinMaxBuffered(cfg.MaxConns, cfg.ConnBuffer); cfg.MaxBuffered < r {
		// Every connection is sure of its minimum window only if all of
		// them fit (budget.go): below that, idle connections could
		// leave a new one without any credit.
		return nil, fmt.Errorf("vsock: buffer total of %d bytes is below %d connections x their %d-byte minimum window (%d bytes): %w",
			cfg.MaxBuffered, cfg.MaxConns, r/uint64(cfg.MaxConns), r, ErrBufferTotal)
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	opts := DefaultOptions
	if cfg.Options != nil {
		opts = *cfg.Options
	}
	d := &Device{cfg: cfg, opts: opts, log: cfg.Log, life: virtio.Lifecycle[*session]{Name: "vsock"}}
	d.portSeq.Store(rand.Uint32())
	if cfg.Dgram {
		h, err := openDgramHost(cfg.DgramUDS)
		if err != nil {
			return nil, err
		}
		d.dgram = h
	}
	return d, nil
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceVsock }

// Features implements virtio.Device: SEQPACKET sockets on top of stream
// sockets (which need no feature bit), and FeatureDgram (microvm's
// datagrams) with Config.Dgram.
func (d *Device) Features() uint64 {
	if d.cfg.Dgram {
		return FeatureSeqpacket | FeatureDgram
	}
	return FeatureSeqpacket
}

// QueueSizes implements virtio.Device: rx, tx and event, plus the datagram
// rx and tx queues with Config.Dgram. A driver that does not negotiate
// datagrams leaves those two unconfigured.
func (d *Device) QueueSizes() []uint16 {
	n := 3
	if d.cfg.Dgram {
		n = 5
	}
	sizes := make([]uint16, n)
	for i := range sizes {
		sizes[i] = d.cfg.QueueSize
	}
	return sizes
}

// BackendQueues lists the queues a vhost-user front-end hands the back-end
// for the negotiated features, in ring order: rx and tx, then the datagram
// rx and tx queues when features include FeatureDgram. The event queue stays
// with the front-end (QEMU keeps it). For vhostuser.Config.Rings.
func (d *Device) BackendQueues(features uint64) []int {
	if d.cfg.Dgram && features&FeatureDgram != 0 {
		return []int{QueueRX, QueueTX, QueueDgramRX, QueueDgramTX}
	}
	return []int{QueueRX, QueueTX}
}

// DgramPath is the host datagram socket host applications send to, or ""
// without Config.Dgram.
func (d *Device) DgramPath() string {
	if d.dgram == nil {
		return ""
	}
	return d.dgram.path
}

// ReadConfig implements virtio.Device: the config space is the 64-bit guest
// CID (5.10.4).
func (d *Device) ReadConfig(offset uint64, p []byte) {
	var cfg [8]byte
	binary.LittleEndian.PutUint64(cfg[:], d.cfg.CID)
	clear(p)
	if offset < uint64(len(cfg)) {
		copy(p, cfg[offset:])
	}
}

// WriteConfig implements virtio.Device: the config space is read-only.
func (d *Device) WriteConfig(uint64, []byte) {}

// CID is the guest's context id.
func (d *Device) CID() uint64 { return d.cfg.CID }

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	c := &d.ctr
	st := Stats{
		TxPackets: c.txPackets.Load(), RxPackets: c.rxPackets.Load(),
		TxBytes: c.txBytes.Load(), RxBytes: c.rxBytes.Load(),
		ConnsOpened: c.connsOpened.Load(), ConnsOpen: c.connsOpen.Load(),
		ConnsEstablished: c.connsEstablished.Load(), ConnsRefused: c.connsRefused.Load(),
		ConnsReset: c.connsReset.Load(), RxQueueFull: c.rxQueueFull.Load(),
		RstSent: c.rstSent.Load(), DroppedRsts: c.droppedRsts.Load(),
		DirectEnqueues: c.directEnqueues.Load(), RxHandoffs: c.rxHandoffs.Load(), TxKicks: c.txKicks.Load(), RxKicks: c.rxKicks.Load(),
		Interrupts: c.interrupts.Load(), TxInterrupts: c.txInterrupts.Load(),
		TxInterruptsCovered: c.txIRQCovered.Load(), HostWriteStalls: c.hostWriteStalls.Load(), HostReadsEmpty: c.hostReadsEmpty.Load(), InterestChanges: c.interestChanges.Load(), HostEvents: c.hostEvents.Load(),
		CreditUpdatesSent: c.creditUpdates.Load(), LateRWDropped: c.lateRW.Load(),
		KickSuppressions: c.kickSuppressions.Load(), BatchedPackets: c.batchedPackets.Load(),
		DgramTx: c.dgramTx.Load(), DgramRx: c.dgramRx.Load(),
		DgramTxBytes: c.dgramTxBytes.Load(), DgramRxBytes: c.dgramRxBytes.Load(),
		DgramTxDropped: c.dgramTxDropped.Load(), DgramRxDropped: c.dgramRxDropped.Load(),
		DgramRxRejected: c.dgramRxRejected.Load(), DgramKicks: c.dgramKicks.Load(),
		TxPassesCut: c.txPassesCut.Load(), DgramPassesCut: c.dgramPassesCut.Load(),
		SeqToHost: c.seqToHost.Load(), SeqToGuest: c.seqToGuest.Load(),
		CreditStalls:    c.creditStalls.Load(),
		TransportResets: c.transportResets.Load(), EventsSent: c.eventsSent.Load(),
	}
	st.GuestErrorsByKind = c.guestErrors.Counts()
	st.GuestErrors = st.GuestErrorsByKind.Total()
	if s, ok := d.life.Current(); ok {
		st.BufferGranted = s.budget.used.Load()
	}
	return st
}

// Activate implements virtio.Device: it starts the TX and RX workers on the
// driver's queues. The event queue may be absent (vhost-user).
func (d *Device) Activate(a virtio.Activation) error {
	if len(a.Queues) < 2 || a.Queues[QueueRX] == nil || a.Queues[QueueTX] == nil {
		return fmt.Errorf("%w: vsock needs its rx and tx queues", virtio.ErrGuest)
	}
	if a.Features&FeatureDgram != 0 && (len(a.Queues) <= QueueDgramTX || a.Queues[QueueDgramRX] == nil || a.Queues[QueueDgramTX] == nil) {
		return fmt.Errorf("%w: vsock datagrams negotiated without the datagram rx and tx queues", virtio.ErrGuest)
	}
	return d.life.Activate(func() (*session, error) {
		s, err := newSession(d, a)
		if err != nil {
			return nil, err
		}
		if d.resetOwed.Swap(false) {
			s.resetAfterQuiesce()
		}
		s.start()
		return s, nil
	})
}

// Reset implements virtio.Device: it stops the workers, closes every host
// connection and forgets the queues. The guest's queues are gone, so nothing
// is sent to it, and a TRANSPORT_RESET a quiesce or a restore left owed is
// dropped: the driver's sockets go with the reset.
func (d *Device) Reset() {
	d.resetOwed.Store(false)
	d.life.Reset()
}

// Close resets the device and refuses later activations; host clients
// waiting for the guest are released.
func (d *Device) Close() {
	if d.life.Close() && d.dgram != nil {
		d.dgram.close() // no session runs, nor will: Close waited for its workers
	}
}

// session waits until the device is active, or the deadline passes, and
// returns the active session.
func (d *Device) session(deadline time.Time) (*session, error) { return d.life.Wait(deadline) }

// ConnectFromHost starts a host-initiated connection to guest port port over
// the connected host socket fd (the device takes ownership of fd, closing it
// on failure). prefix holds host bytes already read past the CONNECT line.
// It waits (until deadline) for the guest driver to be ready (through a
// pause too: a quiesce leaves it waiting for the next session), then sends
// the guest a REQUEST; the reply "OK <host port>\n" is written to fd when the
// guest accepts, and fd is closed if it refuses or does not answer in time.
func (d *Device) ConnectFromHost(fd int, port uint32, prefix []byte, deadline time.Time) error {
	return d.connectFromHost(fd, TypeStream, port, prefix, deadline)
}

// ConnectSeqpacketFromHost is ConnectFromHost for a SEQPACKET connection:
// fd is a connected SOCK_SEQPACKET socket, each of whose records becomes
// one message to the guest (and each guest message one record). The
// guest's REQUEST is of type SEQPACKET, so only a guest socket listening
// with SOCK_SEQPACKET accepts it; a driver that did not negotiate
// FeatureSeqpacket is not asked (fd is closed). The reply "OK <host
// port>\n" is one record.
func (d *Device) ConnectSeqpacketFromHost(fd int, port uint32, deadline time.Time) error {
	return d.connectFromHost(fd, TypeSeqpacket, port, nil, deadline)
}

// connectFromHost implements ConnectFromHost and ConnectSeqpacketFromHost:
// it waits for a session and starts the connection on it. A session
// quiesced under it (a pause: errQuiesced) hands fd back, and the
// connection waits for the next session, within deadline, as one that
// came during the pause does.
func (d *Device) connectFromHost(fd int, typ uint16, port uint32, prefix []byte, deadline time.Time) error {
	for {
		s, err := d.session(deadline)
		if err != nil {
			closeFD(fd)
			d.ctr.connsRefused.Add(1)
			return err
		}
		err = s.connectFromHost(fd, typ, port, prefix, deadline)
		if !errors.Is(err, errQuiesced) {
			return err
		}
	}
}
