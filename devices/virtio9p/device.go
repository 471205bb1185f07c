package virtio9p

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hugelgupf/p9/p9"
	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/virtio"
)

const (
	// DefaultQueueSize is the size offered for the request queue.
	DefaultQueueSize = 64
	// MaxMessage bounds a 9P message either way: the device lowers the
	// msize a Tversion asks for to it, and a longer request is a guest
	// error. With the queue size it bounds the host memory the requests
	// in flight hold (64 x 256 KiB each way).
	MaxMessage = 256 << 10
	// MaxTagLen bounds Config.Tag (the guest's mount source).
	MaxTagLen = 64

	// featureMountTag is VIRTIO_9P_MOUNT_TAG (virtio 1.2, 5.17 is silent;
	// Linux's include/uapi/linux/virtio_9p.h): the configuration space
	// holds the tag.
	featureMountTag = 1 << 0
)

// Config configures a virtio-9p device.
type Config struct {
	// Tag is the name the guest mounts (mount -t 9p TAG DIR): 1 to
	// MaxTagLen bytes, no spaces, commas or NULs.
	Tag string
	// Root is the host directory shared; the guest sees nothing outside
	// it (dirFS).
	Root string
	// ReadOnly refuses every change (EROFS).
	ReadOnly bool
	// QueueSize is the request queue's maximum size (default
	// DefaultQueueSize).
	QueueSize uint16
	// Log receives guest errors (nil: logrus.StandardLogger()).
	Log logrus.FieldLogger
}

// Stats are the device's counters.
type Stats struct {
	Requests     uint64 // 9P requests passed to the server
	Replies      uint64 // replies written back to the guest
	RequestBytes uint64 // bytes of the requests
	ReplyBytes   uint64 // bytes of the replies written
	GuestErrors  uint64 // malformed chains and queue errors: the sum of GuestErrorsByKind
	Kicks        uint64 // queue notifications observed

	GuestErrorsByKind virtio.GuestErrorCounts
}

// GuestErrorKinds are the kinds the device reports. virtio.GuestErrLayout:
// a chain that is not one whole 9P request (its readable bytes are not the
// message its size field gives, or it is longer than MaxMessage, or
// reuses the tag of one in flight) or has no writable room for the reply.
// virtio.GuestErrQueue: a broken ring or descriptor chain. Each stops the
// device until the driver resets it.
var GuestErrorKinds = []virtio.GuestErrorKind{virtio.GuestErrLayout, virtio.GuestErrQueue}

// Device is a virtio-9p device sharing one host directory.
type Device struct {
	cfg    Config
	log    logrus.FieldLogger
	fs     *dirFS
	config []byte // the configuration space: tag_len (le16) and the tag

	requests, replies, requestBytes, replyBytes, kicks atomic.Uint64
	guestErrors                                        virtio.GuestErrors

	// attacher serves the share: fs, or what a test wraps around it
	// (export_test.go), set before the first activation.
	attacher p9.Attacher

	life      virtio.Lifecycle[*session]
	closeOnce sync.Once

	// connMu guards conn, the 9P connection sessions feed (conn.go): made
	// by the first activation, kept across Quiesce, ended by Reset and
	// Close. Lock order: Lifecycle.mu (Activate's start takes connMu
	// under it), then connMu, then session.mu; connMu is never held
	// while a connection ends.
	connMu sync.Mutex
	conn   *conn
}

// CheckTag says whether tag can name a share.
func CheckTag(tag string) error {
	if tag == "" || len(tag) > MaxTagLen {
		return fmt.Errorf("9p tag %q: want 1 to %d bytes", tag, MaxTagLen)
	}
	for _, c := range []byte(tag) {
		if c <= ' ' || c == ',' || c == '=' || c >= 0x7f {
			return fmt.Errorf("9p tag %q: only printable ASCII without spaces, commas or '='", tag)
		}
	}
	return nil
}

// New returns a device for cfg; the root must be a directory.
func New(cfg Config) (*Device, error) {
	if err := CheckTag(cfg.Tag); err != nil {
		return nil, err
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.QueueSize&(cfg.QueueSize-1) != 0 {
		return nil, fmt.Errorf("9p: queue size %d is not a power of two", cfg.QueueSize)
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	fs, err := openDirFS(cfg.Root, cfg.ReadOnly)
	if err != nil {
		return nil, fmt.Errorf("9p share %s: %w", cfg.Tag, err)
	}
	conf := make([]byte, 2+len(cfg.Tag))
	binary.LittleEndian.PutUint16(conf, uint16(len(cfg.Tag)))
	copy(conf[2:], cfg.Tag)
	return &Device{cfg: cfg, log: cfg.Log, fs: fs, attacher: fs,
		config: conf, life: virtio.Lifecycle[*session]{Name: "9p"}}, nil
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.Device9P }

// Features implements virtio.Device: the mount tag.
func (d *Device) Features() uint64 { return featureMountTag }

// QueueSizes implements virtio.Device: one request queue.
func (d *Device) QueueSizes() []uint16 { return []uint16{d.cfg.QueueSize} }

// ReadConfig implements virtio.Device.
func (d *Device) ReadConfig(off uint64, p []byte) {
	clear(p)
	if off < uint64(len(d.config)) {
		copy(p, d.config[off:])
	}
}

// WriteConfig implements virtio.Device: the space is read-only.
func (d *Device) WriteConfig(uint64, []byte) {}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	s := Stats{Requests: d.requests.Load(), Replies: d.replies.Load(),
		RequestBytes: d.requestBytes.Load(), ReplyBytes: d.replyBytes.Load(), Kicks: d.kicks.Load()}
	s.GuestErrorsByKind = d.guestErrors.Counts()
	s.GuestErrors = s.GuestErrorsByKind.Total()
	return s
}

// Activate implements virtio.Device: a session on the request queue,
// feeding the device's 9P connection (a new one after a reset; the one a
// Quiesce left, with the guest's fids, after MMIO.Resume).
func (d *Device) Activate(a virtio.Activation) error {
	if len(a.Queues) < 1 || a.Queues[0] == nil {
		return fmt.Errorf("%w: virtio-9p needs its request queue", virtio.ErrGuest)
	}
	return d.life.Activate(func() (*session, error) { return startSession(d, d.connection(), a.Queues[0], a.Fail) })
}

// connection returns the 9P connection for a new session: the current one
// unless there is none, or the server ended it, or a session failed on it
// (a reply may be owed to a request that session dropped, and would reach
// the new session under a tag it may reuse). The transport resets the
// device after a failure before it activates it again, so replacing one
// here happens only to a device driven without a transport.
func (d *Device) connection() *conn {
	d.connMu.Lock()
	old := d.conn
	if old != nil && !old.ended() && !old.broken.Load() {
		d.connMu.Unlock()
		return old
	}
	c := newConn(d)
	d.conn = c
	d.connMu.Unlock()
	if old != nil {
		old.end()
	}
	return c
}

// endConn ends the device's 9P connection, if it has one: the server
// closes every file the guest had open. Call with no session running.
func (d *Device) endConn() {
	d.connMu.Lock()
	c := d.conn
	d.conn = nil
	d.connMu.Unlock()
	if c != nil {
		c.end()
	}
}

// Reset implements virtio.Device: it ends the session, dropping what is
// in flight, and the 9P connection, whose server closes every file the
// guest had (also after a Quiesce: the driver is starting over).
func (d *Device) Reset() {
	d.life.Reset()
	d.endConn()
}

// Close resets the device, refuses later activations and closes the
// share's root.
func (d *Device) Close() {
	d.life.Close()
	d.endConn()
	d.closeOnce.Do(d.fs.close)
}
