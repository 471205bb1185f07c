package rng

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

const (
	// DefaultQueueSize is the size offered for the request queue.
	DefaultQueueSize = 64
	// MaxRequest bounds the bytes one chain gets, so one large buffer
	// cannot hold the worker (Linux asks for at most a page at a time).
	MaxRequest = 64 << 10
	// minBurst is the smallest bucket: one request of Linux's usual size
	// must fit, or a low rate would only ever give short fills.
	minBurst = 64
	// MaxRate bounds Config.Rate and Config.Burst (1 GiB/s is more than
	// getrandom gives), which keeps the bucket's arithmetic in 64 bits.
	MaxRate = 1 << 30
)

// Config configures a virtio-rng device.
type Config struct {
	// Rate limits the bytes per second the guest gets (0: no limit).
	Rate uint64
	// Burst is how many bytes the bucket saves up while the guest does not
	// ask (default: one second's worth of Rate, at least 64).
	Burst uint64
	// QueueSize is the request queue's maximum size (default
	// DefaultQueueSize).
	QueueSize uint16
	// Log receives guest errors (nil: logrus.StandardLogger()).
	Log logrus.FieldLogger
}

// Stats are the device's counters.
type Stats struct {
	Requests    uint64 // chains returned to the guest
	Bytes       uint64 // random bytes written to guest memory
	Throttled   uint64 // times the worker waited for the rate limit
	GuestErrors uint64 // malformed chains and queue errors: the sum of GuestErrorsByKind
	Kicks       uint64 // queue notifications observed

	GuestErrorsByKind virtio.GuestErrorCounts
}

// GuestErrorKinds are the kinds the device reports
// (Stats.GuestErrorsByKind). Each stops the device until the driver resets
// it. virtio.GuestErrLayout: a request chain with readable buffers, or with no
// writable byte (a request is only writable buffers). virtio.GuestErrQueue: a
// broken ring or descriptor chain, found by the virtqueue code.
var GuestErrorKinds = []virtio.GuestErrorKind{virtio.GuestErrLayout, virtio.GuestErrQueue}

// Device is a virtio-rng device.
type Device struct {
	cfg Config
	log logrus.FieldLogger

	requests, bytes, throttled, kicks atomic.Uint64
	guestErrors                       virtio.GuestErrors

	life virtio.Lifecycle[*worker] // the worker of the current activation
}

// New returns a device for cfg.
func New(cfg Config) (*Device, error) {
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.QueueSize&(cfg.QueueSize-1) != 0 {
		return nil, fmt.Errorf("rng: queue size %d is not a power of two", cfg.QueueSize)
	}
	if cfg.Rate > MaxRate || cfg.Burst > MaxRate {
		return nil, fmt.Errorf("rng: rate %d B/s, burst %d B: at most %d each", cfg.Rate, cfg.Burst, uint64(MaxRate))
	}
	if cfg.Rate > 0 && cfg.Burst == 0 {
		cfg.Burst = cfg.Rate
	}
	if cfg.Rate > 0 && cfg.Burst < minBurst {
		cfg.Burst = minBurst
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	return &Device{cfg: cfg, log: cfg.Log, life: virtio.Lifecycle[*worker]{Name: "rng"}}, nil
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceRNG }

// Features implements virtio.Device: virtio-rng has no feature bits (5.4.3).
func (d *Device) Features() uint64 { return 0 }

// QueueSizes implements virtio.Device: one request queue (5.4.2).
func (d *Device) QueueSizes() []uint16 { return []uint16{d.cfg.QueueSize} }

// ReadConfig implements virtio.Device: there is no configuration space.
func (d *Device) ReadConfig(_ uint64, p []byte) { clear(p) }

// WriteConfig implements virtio.Device: there is no configuration space.
func (d *Device) WriteConfig(uint64, []byte) {}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	s := Stats{
		Requests: d.requests.Load(), Bytes: d.bytes.Load(), Throttled: d.throttled.Load(),
		Kicks: d.kicks.Load(),
	}
	s.GuestErrorsByKind = d.guestErrors.Counts()
	s.GuestErrors = s.GuestErrorsByKind.Total()
	return s
}

// Activate implements virtio.Device: it starts the worker on the request
// queue.
func (d *Device) Activate(a virtio.Activation) error {
	if len(a.Queues) < 1 || a.Queues[0] == nil {
		return fmt.Errorf("%w: virtio-rng needs its request queue", virtio.ErrGuest)
	}
	return d.life.Activate(func() (*worker, error) {
		stop, err := eventfd.NewNonblocking()
		if err != nil {
			return nil, err
		}
		w := &worker{d: d, q: a.Queues[0], fail: a.Fail, stop: stop, done: make(chan struct{})}
		if d.cfg.Rate > 0 {
			w.bucket = newBucket(d.cfg.Rate, d.cfg.Burst, time.Now())
		}
		go w.run()
		return w, nil
	})
}

// Reset implements virtio.Device: it stops the worker and forgets the queue.
func (d *Device) Reset() { d.life.Reset() }

// Quiesce implements virtio.Quiescer, for a pause or a snapshot: it stops
// the worker, leaving the queue's positions final (the worker's Stop
// already leaves no chain popped, so it needs no Drain). The next Activate
// (MMIO.Resume, or a restore) starts a worker at those positions, which
// serves the ring before it waits for a kick. That worker starts with a
// full bucket, as after a pause of Burst/Rate seconds or more: the bucket
// belongs to the session.
func (d *Device) Quiesce() { d.life.Quiesce() }

var _ virtio.Quiescer = (*Device)(nil)

// Close resets the device and refuses later activations.
func (d *Device) Close() { d.life.Close() }

// worker serves one activation's request queue; it owns the queue.
type worker struct {
	d      *Device
	q      *virtio.ActiveQueue
	fail   func(error)
	stop   *eventfd.EventFD
	done   chan struct{}
	bucket *bucket // nil without a rate limit
	failed bool
	chain  virtio.Chain
	views  [][]byte
}

// Stop implements virtio.Session: it ends the worker and waits for it.
//
// It is also what Quiesce uses: the worker is not a virtio.Drainer because
// it never stops with a chain popped and not returned. It looks at the
// stop eventfd only between calls to serve, and serve pushes (Queue.Push
// publishes the used index) every chain it popped and filled, puts back
// (Queue.Undo) the one the rate limit makes it wait for, and notifies
// before it returns. Only a failed worker (a malformed chain, a broken
// ring) leaves one popped, and it has called Fail first, so the transport
// has DEVICE_NEEDS_RESET set and the positions do not matter.
func (w *worker) Stop() {
	_ = w.stop.Signal()
	<-w.done
	w.stop.Close()
}

func (w *worker) run() {
	defer close(w.done)
	fds := []unix.PollFd{
		{Fd: int32(w.q.Kick.FD()), Events: unix.POLLIN},
		{Fd: int32(w.stop.FD()), Events: unix.POLLIN},
	}
	for {
		timeout := -1
		if !w.failed {
			wait := w.serve()
			if wait > 0 {
				// Round up: waking early would only find the bucket
				// still empty.
				timeout = int((wait + time.Millisecond - 1) / time.Millisecond)
			}
		}
		stopped, err := eventfd.PollStop(fds, timeout)
		if err != nil {
			w.d.log.WithError(err).Error("rng: poll")
			return
		}
		if stopped {
			return
		}
		if n, _ := w.q.Kick.Wait(); n > 0 {
			w.d.kicks.Add(1)
		}
	}
}

// serve fills available chains until the ring is empty (returning 0) or
// the rate limit runs dry (returning how long to wait for tokens).
func (w *worker) serve() time.Duration {
	pushed := false
	defer func() {
		if pushed && !w.failed {
			if err := w.q.Notify(); err != nil {
				w.guestError(virtio.GuestErrQueue, err)
			}
		}
	}()
	for {
		ok, err := w.q.Pop(&w.chain)
		if err != nil {
			w.guestError(virtio.GuestErrQueue, err)
			return 0
		}
		if !ok {
			more, err := w.q.EnableNotification()
			if err != nil {
				w.guestError(virtio.GuestErrQueue, err)
				return 0
			}
			if more {
				continue
			}
			return 0
		}
		if w.chain.ReadableLen() > 0 || w.chain.WritableLen() == 0 {
			w.guestError(virtio.GuestErrLayout, fmt.Errorf("%w: rng request chain %d has %d readable and %d writable bytes; want only writable ones",
				virtio.ErrGuest, w.chain.Head, w.chain.ReadableLen(), w.chain.WritableLen()))
			return 0
		}
		limit := min(uint64(MaxRequest), w.chain.WritableLen())
		if w.bucket != nil {
			// Fill whole requests (up to the burst) rather than trickle
			// a byte at a time: wait until the bucket holds that much.
			limit = min(limit, w.bucket.burst)
			w.bucket.refill(time.Now())
			if wait := w.bucket.wait(limit); wait > 0 {
				w.q.Undo()
				w.d.throttled.Add(1)
				return wait
			}
		}
		n, err := w.fill(limit)
		if err != nil {
			// getrandom does not fail on a modern kernel; if it does,
			// the guest gets nothing rather than predictable bytes.
			w.d.log.WithError(err).Error("rng: getrandom")
			n = 0
		}
		if w.bucket != nil {
			w.bucket.take(n)
		}
		if err := w.q.Push(w.chain.Head, uint32(n)); err != nil {
			w.guestError(virtio.GuestErrQueue, err)
			return 0
		}
		pushed = true
		w.d.requests.Add(1)
		w.d.bytes.Add(n)
	}
}

// fill writes up to limit random bytes into the chain's writable buffers
// and returns how many.
func (w *worker) fill(limit uint64) (uint64, error) {
	wr := w.chain.Writer()
	w.views = wr.Views(w.views[:0], min(limit, wr.Len()))
	var done uint64
	for _, v := range w.views {
		for len(v) > 0 {
			n, err := unix.Getrandom(v, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return done, fmt.Errorf("getrandom: %w", err)
			}
			v = v[n:]
			done += uint64(n)
		}
	}
	clear(w.views) // drop the references to guest memory
	return done, nil
}

// guestError reports a guest error of kind once: the worker stops serving
// the queue until the driver resets the device.
func (w *worker) guestError(kind virtio.GuestErrorKind, err error) {
	w.d.guestErrors.Add(kind)
	w.failed = true
	w.fail(err)
}
