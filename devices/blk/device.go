package blk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// Feature bits (virtio 1.2, 5.2.3).
const (
	FeatureSegMax      = 1 << 2  // VIRTIO_BLK_F_SEG_MAX
	FeatureRO          = 1 << 5  // VIRTIO_BLK_F_RO
	FeatureBlkSize     = 1 << 6  // VIRTIO_BLK_F_BLK_SIZE
	FeatureFlush       = 1 << 9  // VIRTIO_BLK_F_FLUSH
	FeatureDiscard     = 1 << 13 // VIRTIO_BLK_F_DISCARD
	FeatureWriteZeroes = 1 << 14 // VIRTIO_BLK_F_WRITE_ZEROES
)

// Defaults for Config.
const (
	// DefaultQueueSize is the size offered for the request queue.
	DefaultQueueSize = 256
	// DefaultInFlight is how many requests are served at once.
	DefaultInFlight = 4
	// MaxInFlight bounds Config.InFlight.
	MaxInFlight = 64
	// MaxSerial is the longest serial (VIRTIO_BLK_ID_BYTES).
	MaxSerial = idLen
)

// Config configures a virtio-blk device.
type Config struct {
	// Path is the raw image: a regular file (or block device) whose size
	// is a multiple of 512 bytes.
	Path string
	// ReadOnly opens the image read-only, takes a shared lock on it, and
	// offers VIRTIO_BLK_F_RO.
	ReadOnly bool
	// Serial is what GET_ID returns (at most 20 bytes).
	Serial string
	// QueueSize is the request queue's maximum size (default
	// DefaultQueueSize).
	QueueSize uint16
	// InFlight is how many requests the device serves at once (default
	// DefaultInFlight, at most MaxInFlight).
	InFlight int
	// CopyOnWrite opens the image read-only (and takes a shared lock on
	// it, so that many devices may share one base) and keeps the guest's
	// writes in a private overlay that goes away with the device: the
	// image is never written. The guest sees a writable disk (DISCARD
	// and WRITE_ZEROES included). It cannot be combined with ReadOnly.
	// A snapshot saves the overlay (SaveDeviceData) and a restore fills
	// the new device's own overlay from it. See overlay.go and
	// overlay_save.go.
	CopyOnWrite bool
	// OverlayDir is the directory in which a CopyOnWrite device creates
	// its overlay, an unlinked sparse file of the image's size that holds
	// the blocks the guest wrote (default os.TempDir(); on a tmpfs those
	// take memory).
	OverlayDir string
	// Log receives guest and host errors (nil: logrus.StandardLogger()).
	Log logrus.FieldLogger
}

// Stats are the device's counters.
type Stats struct {
	Reads, Writes, Flushes  uint64 // requests completed OK, by type
	Discards, WriteZeroes   uint64
	GetIDs                  uint64
	BytesRead, BytesWritten uint64
	Refused                 uint64 // requests answered IOERR or UNSUPP because of what the guest asked
	HostErrors              uint64 // requests answered IOERR because the host file failed
	GuestErrors             uint64 // malformed chains and queue errors (the device then needs a reset): the sum of GuestErrorsByKind
	GuestErrorsByKind       virtio.GuestErrorCounts
	Kicks                   uint64 // queue notifications observed
	Interrupts              uint64 // used-buffer notifications sent
	MaxInFlight             uint64 // most requests seen in flight at once
}

// GuestErrorKinds are the kinds the device reports
// (Stats.GuestErrorsByKind). Each stops the device until the driver resets
// it. virtio.GuestErrHeader: a request chain too short for the 16-byte header, or
// without a writable status byte. virtio.GuestErrLayout: data buffers in the wrong
// direction for the request type (readable data on a read or GET_ID,
// writable data on a write, discard or write-zeroes). virtio.GuestErrQueue: a
// broken ring or descriptor chain, found by the virtqueue code when taking
// or returning a chain.
var GuestErrorKinds = []virtio.GuestErrorKind{virtio.GuestErrHeader, virtio.GuestErrLayout, virtio.GuestErrQueue}

// guestErr is a malformed request, with its kind for the counters. It
// unwraps to the error, which wraps virtio.ErrGuest.
type guestErr struct {
	kind virtio.GuestErrorKind
	err  error
}

func (e *guestErr) Error() string { return e.err.Error() }
func (e *guestErr) Unwrap() error { return e.err }

type counters struct {
	reads, writes, flushes, discards, writeZeroes, getIDs, bytesRead, bytesWritten,
	refused, hostErrors, kicks, interrupts, maxInFlight atomic.Uint64
	guestErrors virtio.GuestErrors
}

// Device is a virtio-blk device (virtio 1.2, 5.2) over a raw image.
type Device struct {
	cfg     Config
	log     logrus.FieldLogger
	file    *os.File
	fd      int
	sectors uint64
	cow     *overlay // Config.CopyOnWrite's overlay, else nil
	config  [configSize]byte
	id      [idLen]byte
	ctr     counters

	life virtio.Lifecycle[*session] // the current activation
}

// Configuration space layout (5.2.4), as far as the offered features use it.
const (
	cfgCapacity            = 0  // le64
	cfgSegMax              = 12 // le32
	cfgBlkSize             = 20 // le32
	cfgMaxDiscardSectors   = 36 // le32
	cfgMaxDiscardSeg       = 40 // le32
	cfgDiscardAlignment    = 44 // le32
	cfgMaxWriteZeroSectors = 48 // le32
	cfgMaxWriteZeroSeg     = 52 // le32
	cfgWriteZeroesMayUnmap = 56 // u8
	configSize             = 60
)

// Open opens and locks the image and returns a device for it. The image is
// locked (flock: exclusive, or shared when read-only) until Close, so a
// second microvm, or anything else that honours flock, cannot write it at
// the same time. With Config.CopyOnWrite the image is opened read-only
// under a shared lock, as for ReadOnly, and the overlay is created.
func Open(cfg Config) (*Device, error) {
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.QueueSize < 4 || cfg.QueueSize&(cfg.QueueSize-1) != 0 {
		return nil, fmt.Errorf("blk: queue size %d is not a power of two of at least 4", cfg.QueueSize)
	}
	if cfg.InFlight == 0 {
		cfg.InFlight = DefaultInFlight
	}
	if cfg.InFlight < 1 || cfg.InFlight > MaxInFlight {
		return nil, fmt.Errorf("blk: %d requests in flight; want 1..%d", cfg.InFlight, MaxInFlight)
	}
	if len(cfg.Serial) > MaxSerial {
		return nil, fmt.Errorf("disk %s: serial %q is longer than %d bytes", cfg.Path, cfg.Serial, MaxSerial)
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if cfg.CopyOnWrite && cfg.ReadOnly {
		return nil, fmt.Errorf("disk %s: read-only and copy-on-write together: a read-only disk has no writes to keep", cfg.Path)
	}
	f, sectors, err := openImage(cfg.Path, cfg.ReadOnly || cfg.CopyOnWrite)
	if err != nil {
		return nil, err
	}
	d := &Device{cfg: cfg, log: cfg.Log, file: f, fd: int(f.Fd()), sectors: sectors,
		life: virtio.Lifecycle[*session]{Name: "blk"}}
	if cfg.CopyOnWrite {
		if d.cow, err = newOverlay(d.fd, sectors*SectorSize, cfg.OverlayDir); err != nil {
			f.Close()
			return nil, fmt.Errorf("disk %s: %w", cfg.Path, err)
		}
	}
	copy(d.id[:], cfg.Serial)
	c := d.config[:]
	binary.LittleEndian.PutUint64(c[cfgCapacity:], sectors)
	// Two descriptors of each chain are the header and the status.
	binary.LittleEndian.PutUint32(c[cfgSegMax:], uint32(cfg.QueueSize)-2)
	binary.LittleEndian.PutUint32(c[cfgBlkSize:], SectorSize)
	binary.LittleEndian.PutUint32(c[cfgMaxDiscardSectors:], maxSegSectors)
	binary.LittleEndian.PutUint32(c[cfgMaxDiscardSeg:], maxSegments)
	binary.LittleEndian.PutUint32(c[cfgDiscardAlignment:], 4096/SectorSize)
	binary.LittleEndian.PutUint32(c[cfgMaxWriteZeroSectors:], maxSegSectors)
	binary.LittleEndian.PutUint32(c[cfgMaxWriteZeroSeg:], maxSegments)
	c[cfgWriteZeroesMayUnmap] = 1
	return d, nil
}

// openImage opens path, checks its size and locks it.
func openImage(path string, readOnly bool) (*os.File, uint64, error) {
	flag, lock, mode := os.O_RDWR, unix.LOCK_EX, "read-write"
	if readOnly {
		flag, lock, mode = os.O_RDONLY, unix.LOCK_SH, "read-only"
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("disk %s: %w", path, unwrapPath(err))
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("disk %s: size: %w", path, err)
	}
	switch {
	case size == 0:
		f.Close()
		return nil, 0, fmt.Errorf("disk %s is empty", path)
	case size%SectorSize != 0:
		f.Close()
		return nil, 0, fmt.Errorf("disk %s: its size, %d bytes, is not a multiple of %d (pad it, e.g. truncate -s %%%d %s)",
			path, size, SectorSize, SectorSize, path)
	}
	for {
		err = unix.Flock(int(f.Fd()), lock|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EWOULDBLOCK {
		f.Close()
		return nil, 0, fmt.Errorf("disk %s is locked by another process (a microvm using it?); cannot open it %s", path, mode)
	}
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("disk %s: lock: %w", path, err)
	}
	return f, uint64(size) / SectorSize, nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Sectors is the capacity in 512-byte sectors.
func (d *Device) Sectors() uint64 { return d.sectors }

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceBlock }

// Features implements virtio.Device: SEG_MAX, BLK_SIZE and FLUSH always; RO
// for a read-only image, DISCARD and WRITE_ZEROES for a writable one.
func (d *Device) Features() uint64 {
	f := uint64(FeatureSegMax | FeatureBlkSize | FeatureFlush)
	if d.cfg.ReadOnly {
		return f | FeatureRO
	}
	return f | FeatureDiscard | FeatureWriteZeroes
}

// QueueSizes implements virtio.Device: one request queue.
func (d *Device) QueueSizes() []uint16 { return []uint16{d.cfg.QueueSize} }

// ReadConfig implements virtio.Device.
func (d *Device) ReadConfig(offset uint64, p []byte) {
	clear(p)
	if offset < configSize {
		copy(p, d.config[offset:])
	}
}

// WriteConfig implements virtio.Device: nothing is writable (no
// VIRTIO_BLK_F_CONFIG_WCE).
func (d *Device) WriteConfig(uint64, []byte) {}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	c := &d.ctr
	s := Stats{
		Reads: c.reads.Load(), Writes: c.writes.Load(), Flushes: c.flushes.Load(),
		Discards: c.discards.Load(), WriteZeroes: c.writeZeroes.Load(), GetIDs: c.getIDs.Load(),
		BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(),
		Refused: c.refused.Load(), HostErrors: c.hostErrors.Load(),
		Kicks: c.kicks.Load(), Interrupts: c.interrupts.Load(), MaxInFlight: c.maxInFlight.Load(),
	}
	s.GuestErrorsByKind = c.guestErrors.Counts()
	s.GuestErrors = s.GuestErrorsByKind.Total()
	return s
}

// Activate implements virtio.Device: it starts the dispatcher and the
// request workers on the request queue.
func (d *Device) Activate(a virtio.Activation) error {
	if len(a.Queues) < 1 || a.Queues[0] == nil {
		return fmt.Errorf("%w: virtio-blk needs its request queue", virtio.ErrGuest)
	}
	return d.life.Activate(func() (*session, error) {
		s, err := newSession(d, a)
		if err != nil {
			return nil, err
		}
		s.start()
		return s, nil
	})
}

// Reset implements virtio.Device: it stops taking requests, waits for those
// in flight to finish (their I/O completes, as QEMU drains on reset, but
// they are not returned: the driver is tearing its rings down), and
// forgets the queue. Quiesce (quiesce.go) is the pause that returns them.
func (d *Device) Reset() { d.life.Reset() }

// Close resets the device, then unlocks and closes the image, and closes a
// CopyOnWrite device's overlay (which frees it: it has no name).
func (d *Device) Close() error {
	if !d.life.Close() {
		return nil
	}
	var cowErr error
	if d.cow != nil {
		cowErr = d.cow.close()
	}
	return errors.Join(d.file.Close(), cowErr) // releases the flock
}
