package vhostuser

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/jail"
	"github.com/microvm/microvm/internal/unixsock"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/virtio"
)

// Config configures a Backend.
type Config struct {
	// Device is the device model served; the same code microvm run uses.
	Device virtio.Device
	// Queues is how many of the device's queues the front-end drives (2 for
	// vsock: QEMU keeps the event queue). Zero means all of them.
	Queues int
	// Rings, when set, overrides Queues: for the features the front-end
	// negotiated it lists the device queue each vhost-user ring drives, in
	// ring order (ring i is device queue Rings(features)[i]). The device
	// starts once those rings are ready; rings past them are not needed.
	// Asked with every offered feature, it gives the most rings a
	// front-end may set up. vsock with datagrams: rings 0-1 are rx and tx,
	// 2-3 the datagram queues 3-4 (vsock.Device.BackendQueues).
	Rings func(features uint64) []int
	// Log receives diagnostics (nil: logrus.StandardLogger()).
	Log logrus.FieldLogger
}

// Backend serves a virtio device to vhost-user front-ends (QEMU), one
// connection at a time: when a front-end disconnects, the device is reset and
// the backend waits for the next one.
//
// Goroutines: Serve runs the accept loop and serves each front-end on the
// calling goroutine (messages are handled strictly in order). The device's
// own workers run while the rings are started.
type Backend struct {
	cfg    Config
	log    logrus.FieldLogger
	ln     *net.UnixListener
	path   string
	queues int

	mu     sync.Mutex // guards cur and closed
	cur    *net.UnixConn
	closed bool

	served      atomic.Uint64 // front-end connections served
	protoErrors atomic.Uint64 // connections dropped for a protocol error
	guestErrors atomic.Uint64 // device failures reported through Fail
}

// Listen creates the vhost-user socket at path (replacing a stale socket
// file) with mode 0600.
func Listen(path string, cfg Config) (*Backend, error) {
	if cfg.Device == nil {
		return nil, errors.New("vhost-user: no device")
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	n := len(cfg.Device.QueueSizes())
	if cfg.Queues <= 0 || cfg.Queues > n {
		cfg.Queues = n
	}
	if cfg.Rings != nil {
		all := cfg.Rings(cfg.Device.Features() | virtio.QueueFeatures | FeatureProtocolFeatures)
		for _, q := range all {
			if q < 0 || q >= n {
				return nil, fmt.Errorf("vhost-user: ring map %v names queue %d; the device has %d", all, q, n)
			}
		}
		cfg.Queues = len(all)
	}
	// Created 0600 and never reachable with looser permissions: whoever can
	// connect here can read and write the guest's memory.
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("vhost-user: %w", err)
	}
	return &Backend{cfg: cfg, log: cfg.Log, ln: ln, path: path, queues: cfg.Queues}, nil
}

// Path is the socket path.
func (b *Backend) Path() string { return b.path }

// Stats returns how many front-ends were served, how many connections were
// dropped for protocol errors, and how many device failures were reported.
func (b *Backend) Stats() (served, protoErrors, guestErrors uint64) {
	return b.served.Load(), b.protoErrors.Load(), b.guestErrors.Load()
}

// Serve accepts front-ends until Close, serving one at a time.
func (b *Backend) Serve() error {
	for {
		c, err := b.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("vhost-user: accept: %w", err)
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			c.Close()
			return nil
		}
		b.cur = c
		b.mu.Unlock()
		b.served.Add(1)
		b.log.Info("vhost-user: front-end connected")
		f := newFrontend(b, c)
		err = f.serve()
		f.teardown()
		b.mu.Lock()
		b.cur = nil
		b.mu.Unlock()
		if err != nil {
			b.protoErrors.Add(1)
			b.log.WithError(err).Error("vhost-user: front-end dropped")
		} else {
			b.log.Info("vhost-user: front-end disconnected; waiting for the next one")
		}
	}
}

// Close stops accepting, disconnects the current front-end (which resets the
// device) and removes the socket file.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.closed = true
	if b.cur != nil {
		b.cur.Close()
	}
	b.mu.Unlock()
	err := b.ln.Close()
	if rerr := os.Remove(jail.Path(b.path)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}

// ring is the front-end's configuration of one vring.
type ring struct {
	num     uint32
	addr    vringAddr
	addrSet bool
	base    uint16 // next available index to process (SET_VRING_BASE)
	kick    *eventfd.EventFD
	enabled bool
	started bool // a kick descriptor arrived: the ring runs (when enabled)

	// sigMu guards call and errFD: device goroutines signal them under the
	// read lock, and the front-end goroutine replaces them under the write
	// lock, so a replaced descriptor can be closed at once: no signal can
	// reach it, or whatever reuses its number, afterwards.
	sigMu sync.RWMutex
	call  *eventfd.EventFD
	errFD *eventfd.EventFD
}

// swapSignal replaces the ring's call (or, with isErr, error) eventfd by e
// and closes the old one.
func (r *ring) swapSignal(isErr bool, e *eventfd.EventFD) {
	r.sigMu.Lock()
	p := &r.call
	if isErr {
		p = &r.errFD
	}
	old := *p
	*p = e
	r.sigMu.Unlock()
	if old != nil {
		old.Close()
	}
}

// frontend is the state of one front-end connection.
type frontend struct {
	b        *Backend
	c        *net.UnixConn
	features uint64 // virtio features the front-end acknowledged
	protocol uint64 // protocol features acknowledged
	mem      *guestmem.Memory
	rings    []*ring
	active   bool
	queues   []*virtio.Queue // the running activation's queues, by ring
	hdr      [headerSize]byte
	payload  [maxPayload]byte
	oob      []byte
}

func newFrontend(b *Backend, c *net.UnixConn) *frontend {
	f := &frontend{b: b, c: c, oob: make([]byte, unix.CmsgSpace(4*maxFDs))}
	for range b.queues {
		f.rings = append(f.rings, &ring{})
	}
	return f
}

// offeredFeatures is what GET_FEATURES answers: the device's features, the
// queue features, and VHOST_USER_F_PROTOCOL_FEATURES.
func (f *frontend) offeredFeatures() uint64 {
	return f.b.cfg.Device.Features() | virtio.QueueFeatures | FeatureProtocolFeatures
}

const offeredProtocol = ProtocolMQ | ProtocolReplyAck | ProtocolConfig

// errProtocol marks a malformed or out-of-order message: the connection is
// dropped.
var errProtocol = errors.New("vhost-user protocol error")

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errProtocol}, args...)...)
}

// serve handles messages until the front-end disconnects (nil) or breaks the
// protocol (an error).
func (f *frontend) serve() error {
	for {
		var h header
		fds, err := f.readHeader(&h)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if h.Flags&versionMask != flagVersion {
			closeAll(fds)
			return protoErr("message version %d", h.Flags&versionMask)
		}
		if h.Size > maxPayload {
			closeAll(fds)
			return protoErr("%v with a %d-byte payload", h.Request, h.Size)
		}
		p := f.payload[:h.Size]
		// A front-end that stops mid-message must not hold the backend's
		// only front-end slot for ever.
		_ = f.c.SetReadDeadline(time.Now().Add(messageTimeout))
		_, err = io.ReadFull(f.c, p)
		_ = f.c.SetReadDeadline(time.Time{})
		if err != nil {
			closeAll(fds)
			return protoErr("%v payload: %w", h.Request, err)
		}
		reply, err := f.handle(h, p, fds)
		if err != nil {
			return fmt.Errorf("%v: %w", h.Request, err)
		}
		if reply != nil {
			if err := f.send(h.Request, reply); err != nil {
				return err
			}
		} else if h.Flags&flagNeedReply != 0 && f.protocol&ProtocolReplyAck != 0 {
			if err := f.send(h.Request, encodeU64(0)); err != nil {
				return err
			}
		}
	}
}

// readHeader reads one message header and the descriptors sent with it.
func (f *frontend) readHeader(h *header) ([]int, error) {
	n, oobn, flags, _, err := f.c.ReadMsgUnix(f.hdr[:], f.oob)
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(f.oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				got, err := unix.ParseUnixRights(&m)
				if err == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if err != nil {
		closeAll(fds)
		return nil, err
	}
	if n == 0 {
		closeAll(fds)
		return nil, io.EOF
	}
	if flags&unix.MSG_CTRUNC != 0 {
		closeAll(fds)
		return nil, protoErr("more than %d descriptors in one message", maxFDs)
	}
	if n < headerSize {
		// As for payloads: a front-end that stops mid-header must not
		// hold the only front-end slot for ever.
		_ = f.c.SetReadDeadline(time.Now().Add(messageTimeout))
		_, err := io.ReadFull(f.c, f.hdr[n:])
		_ = f.c.SetReadDeadline(time.Time{})
		if err != nil {
			closeAll(fds)
			return nil, protoErr("short header: %v", err)
		}
	}
	h.decode(f.hdr[:])
	return fds, nil
}

// send writes a reply to req.
func (f *frontend) send(req Request, payload []byte) error {
	b := make([]byte, headerSize+len(payload))
	h := header{Request: req, Flags: flagVersion | flagReply, Size: uint32(len(payload))}
	h.encode(b)
	copy(b[headerSize:], payload)
	if _, err := f.c.Write(b); err != nil {
		return fmt.Errorf("vhost-user: reply to %v: %w", req, err)
	}
	return nil
}

// messageTimeout bounds reading the rest of a message once its header came.
const messageTimeout = 5 * time.Second

// isEventFD reports whether fd is an eventfd (an anonymous inode that
// /proc names "anon_inode:[eventfd]"): a kick descriptor that is, say, a
// regular file would always poll readable and make a worker spin.
func isEventFD(fd int) bool {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	return err == nil && target == "anon_inode:[eventfd]"
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// wantFDs checks a message carries exactly n descriptors (closing them if
// not).
func wantFDs(fds []int, n int) error {
	if len(fds) != n {
		closeAll(fds)
		return protoErr("%d descriptors attached, want %d", len(fds), n)
	}
	return nil
}

// handle acts on one message and returns its reply payload, if the request
// has one.
func (f *frontend) handle(h header, p []byte, fds []int) ([]byte, error) {
	switch h.Request {
	case GetFeatures, GetProtocolFeatures, GetQueueNum, SetOwner, ResetOwner, ResetDevice,
		SetFeatures, SetProtocolFeatures, SetVringNum, SetVringAddr, SetVringBase, GetVringBase,
		SetVringEnable, GetConfig, SetConfig:
		if err := wantFDs(fds, 0); err != nil {
			return nil, err
		}
	}
	switch h.Request {
	case GetFeatures:
		return encodeU64(f.offeredFeatures()), nil
	case SetFeatures:
		v, err := decodeU64(p)
		if err != nil {
			return nil, protoErr("%w", err)
		}
		if v&^f.offeredFeatures() != 0 {
			return nil, protoErr("features %#x were not offered", v&^f.offeredFeatures())
		}
		if f.active && v != f.features {
			return nil, protoErr("features changed while the rings run")
		}
		f.features = v
		if v&FeatureProtocolFeatures == 0 {
			// Without protocol features rings are enabled as soon as
			// they start.
			for _, r := range f.rings {
				r.enabled = true
			}
		}
		return nil, nil
	case GetProtocolFeatures:
		return encodeU64(offeredProtocol), nil
	case SetProtocolFeatures:
		v, err := decodeU64(p)
		if err != nil {
			return nil, protoErr("%w", err)
		}
		if v&^offeredProtocol != 0 {
			return nil, protoErr("protocol features %#x were not offered", v&^offeredProtocol)
		}
		f.protocol = v
		return nil, nil
	case GetQueueNum:
		return encodeU64(uint64(len(f.rings))), nil
	case SetOwner:
		return nil, nil
	case ResetOwner, ResetDevice:
		f.stop()
		for i := range f.rings {
			f.rings[i].base = 0
		}
		return nil, nil
	case SetMemTable:
		return nil, f.setMemTable(p, fds)
	case SetVringNum:
		s, r, err := f.ringState(p)
		if err != nil {
			return nil, err
		}
		if s.Num == 0 || s.Num > virtio.MaxQueueSize || s.Num&(s.Num-1) != 0 {
			return nil, protoErr("ring %d size %d", s.Index, s.Num)
		}
		if r.started {
			return nil, protoErr("ring %d resized while running", s.Index)
		}
		r.num = s.Num
		return nil, nil
	case SetVringAddr:
		a, err := decodeAddr(p)
		if err != nil {
			return nil, protoErr("%w", err)
		}
		r, err := f.ring(a.Index)
		if err != nil {
			return nil, err
		}
		if f.mem == nil {
			// The addresses are the front-end's, meaningful only through
			// its memory table (libvhost-user and rust-vmm refuse this too).
			return nil, protoErr("ring %d address before SET_MEM_TABLE", a.Index)
		}
		if r.started && f.active {
			return nil, protoErr("ring %d moved while running", a.Index)
		}
		r.addr, r.addrSet = a, true
		return nil, nil
	case SetVringBase:
		s, r, err := f.ringState(p)
		if err != nil {
			return nil, err
		}
		if r.started {
			return nil, protoErr("ring %d base set while running", s.Index)
		}
		if s.Num > 0xffff {
			return nil, protoErr("ring %d base %d", s.Index, s.Num)
		}
		r.base = uint16(s.Num)
		return nil, nil
	case GetVringBase:
		s, r, err := f.ringState(p)
		if err != nil {
			return nil, err
		}
		f.stop() // the device runs all rings together
		r.started = false
		if r.kick != nil {
			r.kick.Close() // the device stopped: nobody polls it
			r.kick = nil
		}
		return vringState{Index: s.Index, Num: uint32(r.base)}.encode(), nil
	case SetVringKick, SetVringCall, SetVringErr:
		return nil, f.setVringFD(h.Request, p, fds)
	case SetVringEnable:
		s, r, err := f.ringState(p)
		if err != nil {
			return nil, err
		}
		if f.features&FeatureProtocolFeatures == 0 {
			return nil, protoErr("SET_VRING_ENABLE without protocol features")
		}
		r.enabled = s.Num != 0
		if !r.enabled {
			f.stop()
		}
		return nil, f.maybeStart()
	case GetConfig:
		c, err := decodeConfig(p)
		if err != nil {
			return nil, protoErr("%w", err)
		}
		out := make([]byte, c.Size)
		f.b.cfg.Device.ReadConfig(uint64(c.Offset), out)
		c.Data = out
		return c.encode(), nil
	case SetConfig:
		c, err := decodeConfig(p)
		if err != nil {
			return nil, protoErr("%w", err)
		}
		f.b.cfg.Device.WriteConfig(uint64(c.Offset), c.Data)
		return nil, nil
	}
	closeAll(fds)
	return nil, protoErr("unsupported request %v", h.Request)
}

func (f *frontend) ring(index uint32) (*ring, error) {
	if int(index) >= len(f.rings) {
		return nil, protoErr("ring %d does not exist (the device has %d)", index, len(f.rings))
	}
	return f.rings[index], nil
}

func (f *frontend) ringState(p []byte) (vringState, *ring, error) {
	s, err := decodeState(p)
	if err != nil {
		return s, nil, protoErr("%w", err)
	}
	r, err := f.ring(s.Index)
	return s, r, err
}

// setMemTable maps the front-end's memory regions. Rings running on the old
// table are stopped first and restarted on the new one.
func (f *frontend) setMemTable(p []byte, fds []int) error {
	regs, err := decodeMemTable(p)
	if err != nil {
		closeAll(fds)
		return protoErr("%w", err)
	}
	if err := wantFDs(fds, len(regs)); err != nil {
		return err
	}
	if err := checkOverlap(regs); err != nil {
		closeAll(fds)
		return protoErr("%v", err)
	}
	for i, r := range regs {
		if err := checkRegionFile(fds[i], r); err != nil {
			closeAll(fds)
			return protoErr("region %d: %v", i, err)
		}
	}
	frs := make([]guestmem.FileRegion, len(regs))
	for i, r := range regs {
		frs[i] = guestmem.FileRegion{GPA: r.GPA, Size: r.Size, UserAddr: r.UserAddr, Offset: r.Offset, FD: fds[i]}
	}
	mem, err := guestmem.MapFiles(frs...)
	closeAll(fds) // the mappings stay valid without the descriptors
	if err != nil {
		return protoErr("%w", err)
	}
	wasActive := f.active
	f.stop()
	if f.mem != nil {
		_ = f.mem.Close()
	}
	f.mem = mem
	f.b.log.WithField("regions", len(regs)).WithField("bytes", mem.Size()).Debug("vhost-user: memory table")
	if wasActive {
		return f.maybeStart()
	}
	return nil
}

// checkRegionFile checks that a memory region lies inside its file and that
// the file can never shrink under the mapping. A shared mapping past the end
// of a file maps, but touching it raises SIGBUS, which would kill the
// back-end; a file that is shrunk after SET_MEM_TABLE turns the device's next
// touch of guest memory into the same SIGBUS. So every region's descriptor
// must be a memfd sealed with F_SEAL_SHRINK: QEMU's memory-backend-memfd
// seals its file that way by default (seal=on: F_SEAL_GROW|F_SEAL_SHRINK|
// F_SEAL_SEAL). A seal, once set, is never removed, so checking it before the
// size makes the size check hold for the life of the mapping. Files that
// cannot carry seals (memory-backend-file on tmpfs or hugetlbfs, shm) are
// refused: the back-end could not survive their truncation.
func checkRegionFile(fd int, r memRegion) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("descriptor is not a regular file (mode %#o); want a sealed memfd", st.Mode)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("guest memory is not a memfd (F_GET_SEALS: %v); want a memfd sealed with F_SEAL_SHRINK (QEMU: memory-backend-memfd, seal=on)", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return fmt.Errorf("memfd not sealed against shrinking (seals %#x); want F_SEAL_SHRINK (QEMU: memory-backend-memfd with seal=on, its default)", seals)
	}
	// Sealed: the size read now can only grow.
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if end := r.Offset + r.Size; end < r.Offset || end > uint64(st.Size) {
		return fmt.Errorf("%d bytes at offset %d run past the end of the %d-byte file", r.Size, r.Offset, st.Size)
	}
	return nil
}

// checkOverlap rejects a memory table whose regions overlap in guest-physical
// or in front-end virtual addresses, or whose ranges wrap: either would make
// an address translate two ways (TranslateUser picks the first region that
// holds it), so the device could read a ring or a buffer through a region the
// front-end did not mean.
func checkOverlap(regs []memRegion) error {
	for i, a := range regs {
		if a.Size == 0 {
			return fmt.Errorf("region %d is empty", i)
		}
		if a.GPA+a.Size < a.GPA {
			return fmt.Errorf("region %d: guest range %#x+%#x wraps", i, a.GPA, a.Size)
		}
		if a.UserAddr+a.Size < a.UserAddr {
			return fmt.Errorf("region %d: front-end range %#x+%#x wraps", i, a.UserAddr, a.Size)
		}
		for j, b := range regs[:i] {
			if a.GPA < b.GPA+b.Size && b.GPA < a.GPA+a.Size {
				return fmt.Errorf("regions %d and %d overlap in guest addresses (%#x+%#x, %#x+%#x)", j, i, b.GPA, b.Size, a.GPA, a.Size)
			}
			if a.UserAddr < b.UserAddr+b.Size && b.UserAddr < a.UserAddr+a.Size {
				return fmt.Errorf("regions %d and %d overlap in front-end addresses (%#x+%#x, %#x+%#x)", j, i, b.UserAddr, b.Size, a.UserAddr, a.Size)
			}
		}
	}
	return nil
}

// setVringFD takes a ring's kick, call or error eventfd.
func (f *frontend) setVringFD(req Request, p []byte, fds []int) error {
	v, err := decodeU64(p)
	if err != nil {
		closeAll(fds)
		return protoErr("%w", err)
	}
	r, err := f.ring(uint32(v & vringIndexMask))
	if err != nil {
		closeAll(fds)
		return err
	}
	var e *eventfd.EventFD
	if v&vringNoFD == 0 {
		if err := wantFDs(fds, 1); err != nil {
			return err
		}
		if !isEventFD(fds[0]) {
			closeAll(fds)
			return protoErr("%v: descriptor is not an eventfd", req)
		}
		if err := unix.SetNonblock(fds[0], true); err != nil {
			closeAll(fds)
			return protoErr("eventfd: %v", err)
		}
		e = eventfd.FromFD(fds[0])
	} else if err := wantFDs(fds, 0); err != nil {
		return err
	}
	switch req {
	case SetVringKick:
		if e == nil {
			// Polling without kicks (or in-band kicks) is not supported.
			return protoErr("ring %d without a kick descriptor", v&vringIndexMask)
		}
		if f.active {
			f.stop()
		}
		if r.kick != nil {
			r.kick.Close() // the device is stopped: nobody polls it
		}
		r.kick = e
		r.started = true
		if f.features&FeatureProtocolFeatures == 0 {
			r.enabled = true
		}
		return f.maybeStart()
	case SetVringCall, SetVringErr:
		r.swapSignal(req == SetVringErr, e)
	}
	return nil
}

// ringMap is the device queue of each ring the front-end drives for the
// features it negotiated.
func (f *frontend) ringMap() []int {
	if f.b.cfg.Rings != nil {
		return f.b.cfg.Rings(f.features)
	}
	m := make([]int, len(f.rings))
	for i := range m {
		m[i] = i
	}
	return m
}

// maybeStart activates the device once every ring the front-end drives is
// configured, started and enabled, and memory is mapped.
func (f *frontend) maybeStart() error {
	if f.active || f.mem == nil {
		return nil
	}
	qmap := f.ringMap()
	if len(qmap) > len(f.rings) {
		return protoErr("features %#x need %d rings; %d exist", f.features, len(qmap), len(f.rings))
	}
	for _, r := range f.rings[:len(qmap)] {
		if !r.started || !r.enabled || !r.addrSet || r.num == 0 || r.kick == nil {
			return nil
		}
	}
	sizes := f.b.cfg.Device.QueueSizes()
	a := virtio.Activation{
		Mem:      f.mem,
		Features: f.features,
		Queues:   make([]*virtio.ActiveQueue, len(sizes)),
		Fail:     f.fail,
	}
	f.queues = make([]*virtio.Queue, len(f.rings))
	for i, r := range f.rings[:len(qmap)] {
		dq := qmap[i]
		cfg, err := f.queueConfig(r)
		if err != nil {
			return protoErr("ring %d: %v", i, err)
		}
		if err := cfg.Validate(f.mem, uint16(min(uint32(sizes[dq]), virtio.MaxQueueSize))); err != nil {
			if r.num > uint32(sizes[dq]) {
				return protoErr("ring %d: size %d above the device's %d", i, r.num, sizes[dq])
			}
			return protoErr("ring %d: %v", i, err)
		}
		q := virtio.NewQueue(f.mem, cfg, f.features&virtio.FeatureEventIdx != 0, f.features&virtio.FeatureIndirectDesc != 0)
		if err := q.SetIndices(r.base); err != nil {
			return protoErr("ring %d: %v", i, err)
		}
		f.queues[i] = q
		a.Queues[dq] = &virtio.ActiveQueue{Queue: q, Kick: r.kick, Interrupt: r.interrupt}
	}
	if err := f.b.cfg.Device.Activate(a); err != nil {
		return fmt.Errorf("vhost-user: activate device: %w", err)
	}
	f.active = true
	f.b.log.WithField("features", fmt.Sprintf("%#x", f.features)).Info("vhost-user: rings started")
	return nil
}

// queueConfig translates a ring's front-end addresses to guest-physical ones.
func (f *frontend) queueConfig(r *ring) (virtio.QueueConfig, error) {
	n := uint64(r.num)
	desc, err := f.mem.TranslateUser(r.addr.Desc, 16*n)
	if err != nil {
		return virtio.QueueConfig{}, fmt.Errorf("descriptor table: %w", err)
	}
	avail, err := f.mem.TranslateUser(r.addr.Avail, 6+2*n)
	if err != nil {
		return virtio.QueueConfig{}, fmt.Errorf("available ring: %w", err)
	}
	used, err := f.mem.TranslateUser(r.addr.Used, 6+8*n)
	if err != nil {
		return virtio.QueueConfig{}, fmt.Errorf("used ring: %w", err)
	}
	return virtio.QueueConfig{Size: uint16(r.num), Desc: desc, Avail: avail, Used: used}, nil
}

// interrupt signals the ring's call eventfd, if the front-end gave one.
func (r *ring) interrupt() {
	r.sigMu.RLock()
	if r.call != nil {
		_ = r.call.Signal()
	}
	r.sigMu.RUnlock()
}

// fail is the device's Activation.Fail: vhost-user has no NEEDS_RESET, so
// the error is logged and counted and the front-end is told through the
// rings' error eventfds; the device stays stopped until the front-end
// restarts the rings.
func (f *frontend) fail(err error) {
	f.b.guestErrors.Add(1)
	f.b.log.WithError(err).Error("vhost-user: device stopped by a guest error")
	for _, r := range f.rings {
		r.sigMu.RLock()
		if r.errFD != nil {
			_ = r.errFD.Signal()
		}
		r.sigMu.RUnlock()
	}
}

// stop resets a running device and remembers where each ring stopped.
func (f *frontend) stop() {
	if !f.active {
		return
	}
	f.b.cfg.Device.Reset()
	for i, q := range f.queues {
		if q != nil {
			f.rings[i].base = q.LastAvail()
		}
	}
	f.queues = nil
	f.active = false
	f.b.log.Debug("vhost-user: rings stopped")
}

// teardown releases everything the connection held, device first.
func (f *frontend) teardown() {
	f.stop()
	for _, r := range f.rings {
		if r.kick != nil {
			r.kick.Close()
			r.kick = nil
		}
		r.swapSignal(false, nil)
		r.swapSignal(true, nil)
	}
	if f.mem != nil {
		_ = f.mem.Close()
		f.mem = nil
	}
	f.c.Close()
}
