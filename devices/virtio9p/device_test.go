package virtio9p_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/devices/virtio9p"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

const (
	waitTimeout = 10 * time.Second
	slots       = 8
	slotSize    = 64 << 10 // the client's msize: requests and replies fit
)

// driver plays the guest's 9p transport on a virtiotest queue: each
// message the p9 client writes becomes a chain (the request readable, a
// reply buffer writable), and each used chain's reply is what the client
// reads. It is the client's io.ReadWriteCloser.
type driver struct {
	t   testing.TB
	dev *virtio9p.Device
	mem *virtiotest.Memory
	irq chan struct{}

	mu      sync.Mutex
	kick    func() // notifies the device of a new chain (under mu)
	q       *virtiotest.Queue
	pending []byte         // bytes of a message the client is still writing
	free    []int          // free slots
	byHead  map[uint16]int // slot of each chain in flight
	slotReq []uint64       // each slot's request buffer
	slotRep []uint64       // and reply buffer
	fails   []error
	strays  []uint16 // used heads of no chain in flight: pushed twice, or never posted
	closed  bool     // shut: Write fails
	room    *sync.Cond

	replies *io.PipeReader
	feed    *io.PipeWriter
	done    chan struct{}
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.Out = io.Discard
	return l
}

// newDevice makes a device for cfg (the tag defaults to "share"), closed
// when the test ends.
func newDevice(t testing.TB, cfg virtio9p.Config) *virtio9p.Device {
	t.Helper()
	cfg.Log = quietLog()
	if cfg.Tag == "" {
		cfg.Tag = "share"
	}
	dev, err := virtio9p.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dev.Close)
	return dev
}

// newDriver is a driver for a device of cfg, activated directly (no
// transport) with a kick eventfd of its own.
func newDriver(t testing.TB, cfg virtio9p.Config) *driver {
	t.Helper()
	kick, err := eventfd.NewNonblocking()
	if err != nil {
		t.Fatal(err)
	}
	var d *driver
	t.Cleanup(func() { // made first, so closed after the device
		d.shut()
		kick.Close()
	})
	dev := newDevice(t, cfg)
	d = attachDriver(t, dev)
	d.kick = func() { _ = kick.Signal() }
	aq := &virtio.ActiveQueue{
		Queue:     virtio.NewQueue(d.mem.Memory, d.q.Cfg, true, true),
		Kick:      kick,
		Interrupt: d.interrupt,
	}
	err = dev.Activate(virtio.Activation{Mem: d.mem.Memory, Features: virtio.QueueFeatures | 1,
		Queues: []*virtio.ActiveQueue{aq}, Fail: func(err error) {
			d.mu.Lock()
			d.fails = append(d.fails, err)
			d.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// attachDriver is the guest's side for dev: memory, the request queue
// (with EVENT_IDX), the slots and the reaper. The caller activates the
// device and sets kick.
func attachDriver(t testing.TB, dev *virtio9p.Device) *driver {
	t.Helper()
	d := &driver{t: t, dev: dev, mem: virtiotest.NewMemory(t, 4<<20), irq: make(chan struct{}, 1),
		byHead: map[uint16]int{}, done: make(chan struct{})}
	d.room = sync.NewCond(&d.mu)
	d.q = virtiotest.NewQueue(d.mem, dev.QueueSizes()[0], true)
	for i := range slots {
		d.free = append(d.free, i)
		d.slotReq = append(d.slotReq, d.mem.Alloc(slotSize, 8))
		d.slotRep = append(d.slotRep, d.mem.Alloc(slotSize, 8))
	}
	d.replies, d.feed = io.Pipe()
	go d.reap()
	t.Cleanup(func() {
		d.shut()
		close(d.done)
		d.feed.Close()
	})
	return d
}

// shut makes the driver post nothing more: the client's later messages
// (its finalizers clunk the files a test dropped) fail instead of kicking
// a closed eventfd, whose number may be another test's by then, or
// waiting for a slot for ever. Called before what kick uses is closed.
func (d *driver) shut() {
	d.mu.Lock()
	d.closed = true
	d.kick = func() {}
	d.mu.Unlock()
	d.room.Broadcast()
}

// interrupt is the device's interrupt: it wakes the reaper.
func (d *driver) interrupt() {
	select {
	case d.irq <- struct{}{}:
	default:
	}
}

func (d *driver) failures() []error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]error(nil), d.fails...)
}

// strayHeads returns the used heads that answered no chain in flight.
func (d *driver) strayHeads() []uint16 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]uint16(nil), d.strays...)
}

// post makes one chain available and kicks: readable parts, then a
// writable reply buffer of slot s.
func (d *driver) post(bufs ...virtiotest.Buf) uint16 {
	head, ok := d.q.Add(bufs...)
	if !ok {
		d.t.Error("virtqueue full")
	}
	d.kick()
	return head
}

// Write implements io.Writer for the client: whole messages become chains.
func (d *driver) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending = append(d.pending, p...)
	for len(d.pending) >= 4 {
		size := int(binary.LittleEndian.Uint32(d.pending))
		if size > slotSize {
			return 0, errors.New("driver: message over the slot size")
		}
		if len(d.pending) < size {
			break
		}
		for len(d.free) == 0 && !d.closed {
			d.room.Wait()
		}
		if d.closed {
			return 0, io.ErrClosedPipe
		}
		s := d.free[len(d.free)-1]
		d.free = d.free[:len(d.free)-1]
		if err := d.mem.Write(d.slotReq[s], d.pending[:size]); err != nil {
			return 0, err
		}
		head := d.post(virtiotest.Buf{Addr: d.slotReq[s], Len: uint32(size)},
			virtiotest.Buf{Addr: d.slotRep[s], Len: slotSize, Writable: true})
		d.byHead[head] = s
		d.pending = d.pending[size:]
	}
	return len(p), nil
}

// reap feeds the replies of used chains to the client.
func (d *driver) reap() {
	for {
		select {
		case <-d.done:
			return
		case <-d.irq:
		case <-time.After(10 * time.Millisecond):
		}
		d.mu.Lock()
		used := d.q.Reap()
		var out [][]byte
		for _, u := range used {
			s, ok := d.byHead[u.ID]
			if !ok {
				d.strays = append(d.strays, u.ID)
				continue
			}
			delete(d.byHead, u.ID)
			b := make([]byte, u.Len)
			_ = d.mem.Read(d.slotRep[s], b)
			out = append(out, b)
			d.free = append(d.free, s)
			d.room.Broadcast()
		}
		d.mu.Unlock()
		for _, b := range out {
			if _, err := d.feed.Write(b); err != nil {
				return
			}
		}
	}
}

func (d *driver) Read(p []byte) (int, error) { return d.replies.Read(p) }
func (d *driver) Close() error               { return nil }

// mount is a 9P client attached to a share of dir through the device.
func mount(t *testing.T, dir string, readOnly bool) (*driver, p9.File) {
	t.Helper()
	d := newDriver(t, virtio9p.Config{Root: dir, ReadOnly: readOnly})
	c, err := p9.NewClient(d, p9.WithMessageSize(slotSize))
	if err != nil {
		t.Fatal(err)
	}
	root, err := c.Attach("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return d, root
}

func walk(t *testing.T, f p9.File, names ...string) p9.File {
	t.Helper()
	_, g, err := f.Walk(names)
	if err != nil {
		t.Fatalf("walk %v: %v", names, err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func TestShareReadWrite(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "host.txt"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, root := mount(t, dir, false)

	// Read a host file.
	f := walk(t, root, "host.txt")
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	n, err := f.ReadAt(buf, 0)
	if err != nil || string(buf[:n]) != "from the host" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}

	// Make a directory and a file in it; the host sees both.
	if _, err := root.Mkdir("sub", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	// Tlcreate turns the directory's fid into the new file's (9P2000.L).
	nf, _, _, err := walk(t, root, "sub").Create("new.txt", p9.ReadWrite, 0o600, p9.NoUID, p9.NoGID)
	if err != nil {
		t.Fatal(err)
	}
	sub := walk(t, root, "sub")
	big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB: several messages
	if n, err := nf.WriteAt(big, 0); err != nil || n != len(big) {
		t.Fatalf("write %d of %d: %v", n, len(big), err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "sub", "new.txt"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("host read %d bytes (%v), want the %d written", len(got), err, len(big))
	}

	// Attributes, truncation, listing, rename, unlink.
	if err := nf.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 10}); err != nil {
		t.Fatal(err)
	}
	if _, _, a, err := nf.GetAttr(p9.AttrMaskAll); err != nil || a.Size != 10 {
		t.Fatalf("size after truncate: %d, %v", a.Size, err)
	}
	if _, _, err := sub.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	ents, err := sub.Readdir(0, 4096)
	if err != nil || len(ents) != 3 || ents[0].Name != "." || ents[1].Name != ".." || ents[2].Name != "new.txt" {
		t.Fatalf("readdir: %v, %v", ents, err)
	}
	if err := root.RenameAt("host.txt", sub, "moved.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sub", "moved.txt")); err != nil {
		t.Fatalf("rename not on the host: %v", err)
	}
	if err := walk(t, root, "sub").UnlinkAt("moved.txt", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sub", "moved.txt")); !os.IsNotExist(err) {
		t.Fatalf("unlink not on the host: %v", err)
	}
	if f := d.failures(); len(f) != 0 {
		t.Fatalf("guest errors: %v", f)
	}
	if s := d.dev.Stats(); s.Requests == 0 || s.Replies != s.Requests {
		t.Errorf("stats %+v: want requests, each replied", s)
	}
}

// TestShareConfinement: what the guest (or the host) puts in the share
// never takes the server outside it.
func TestShareConfinement(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host only"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// A symlink to outside, as a hostile image or the guest could make.
	if err := os.Symlink(outside, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, root := mount(t, dir, false)

	if _, _, err := root.Walk([]string{"out", "secret"}); err == nil {
		t.Fatal("walked through a symlink out of the share")
	}
	if _, _, err := root.Walk([]string{".."}); err == nil {
		t.Fatal("walked to the share's parent")
	}
	if _, _, err := root.Walk([]string{"a/b"}); err == nil {
		t.Fatal("walked a name with a slash")
	}
	// The symlink itself can be walked to and read, not opened.
	l := walk(t, root, "out")
	if target, err := l.Readlink(); err != nil || target != outside {
		t.Fatalf("readlink %q, %v", target, err)
	}
	if _, _, err := l.Open(p9.ReadOnly); err == nil {
		t.Fatal("opened a symlink (the host would follow it)")
	}
	if err := l.SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o777}); err == nil {
		t.Fatal("chmod through a symlink")
	}
	// A guest-made symlink is stored, never followed by the host.
	if _, err := root.Symlink("/etc", "etc", p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := root.Walk([]string{"etc", "passwd"}); err == nil {
		t.Fatal("walked through a guest-made symlink")
	}
	// FIFOs are not opened (a guest could block the server on them), and
	// none can be made.
	fifo := walk(t, root, "fifo")
	if _, _, err := fifo.Open(p9.ReadOnly); err == nil {
		t.Fatal("opened a FIFO")
	}
	if _, err := root.Mknod("dev", p9.ModeCharacterDevice|0o600, 1, 3, p9.NoUID, p9.NoGID); err == nil {
		t.Fatal("made a device node")
	}
	// Hard links only to regular files of the share.
	if err := root.Link(l, "hard"); err == nil {
		t.Fatal("hard-linked a symlink")
	}
}

func TestShareReadOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, root := mount(t, dir, true)
	f := walk(t, root, "f")
	if _, _, err := f.Open(p9.ReadWrite); !errors.Is(err, linux.EROFS) {
		t.Fatalf("open for writing: %v, want EROFS", err)
	}
	if _, _, _, err := root.Create("g", p9.WriteOnly, 0o644, p9.NoUID, p9.NoGID); !errors.Is(err, linux.EROFS) {
		t.Fatalf("create: %v, want EROFS", err)
	}
	if err := root.UnlinkAt("f", 0); !errors.Is(err, linux.EROFS) {
		t.Fatalf("unlink: %v, want EROFS", err)
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
}

// TestMsizeBounded: the device lowers what a Tversion asks for to
// MaxMessage, so no reply outgrows a bound the guest cannot raise.
func TestMsizeBounded(t *testing.T) {
	d := newDriver(t, virtio9p.Config{Root: t.TempDir()})
	msg := tversion(1<<24, 0xffff)
	if _, err := d.Write(msg); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 64)
	n, err := d.Read(b)
	if err != nil || n < 11 || b[4] != 101 {
		t.Fatalf("no Rversion: %x, %v", b[:n], err)
	}
	if m := binary.LittleEndian.Uint32(b[7:]); m != virtio9p.MaxMessage {
		t.Fatalf("msize %d granted, want %d", m, virtio9p.MaxMessage)
	}
}

func tversion(msize uint32, tag uint16) []byte {
	v := "9P2000.L"
	b := make([]byte, 7+4+2+len(v))
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	b[4] = 100
	binary.LittleEndian.PutUint16(b[5:], tag)
	binary.LittleEndian.PutUint32(b[7:], msize)
	binary.LittleEndian.PutUint16(b[11:], uint16(len(v)))
	copy(b[13:], v)
	return b
}

// TestMalformedRequests: chains that are not one whole request stop the
// device with a counted guest error, and nothing reaches the server.
func TestMalformedRequests(t *testing.T) {
	cases := []struct {
		name string
		post func(d *driver)
	}{
		{"size field disagrees", func(d *driver) {
			m := tversion(8192, 1)
			binary.LittleEndian.PutUint32(m, 1000)
			a := d.mem.Alloc(uint64(len(m)), 8)
			_ = d.mem.Write(a, m)
			d.post(virtiotest.Buf{Addr: a, Len: uint32(len(m))}, virtiotest.Buf{Addr: d.mem.Alloc(64, 8), Len: 64, Writable: true})
		}},
		{"shorter than a header", func(d *driver) {
			a := d.mem.Alloc(4, 8)
			d.post(virtiotest.Buf{Addr: a, Len: 4}, virtiotest.Buf{Addr: d.mem.Alloc(64, 8), Len: 64, Writable: true})
		}},
		{"no room for a reply", func(d *driver) {
			m := tversion(8192, 1)
			a := d.mem.Alloc(uint64(len(m)), 8)
			_ = d.mem.Write(a, m)
			d.post(virtiotest.Buf{Addr: a, Len: uint32(len(m))})
		}},
		{"over MaxMessage", func(d *driver) {
			n := uint32(virtio9p.MaxMessage + 8)
			a := d.mem.Alloc(uint64(n), 8)
			_ = d.mem.Write32(a, n)
			d.post(virtiotest.Buf{Addr: a, Len: n}, virtiotest.Buf{Addr: d.mem.Alloc(64, 8), Len: 64, Writable: true})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(t, virtio9p.Config{Root: t.TempDir()})
			d.mu.Lock()
			c.post(d)
			d.mu.Unlock()
			deadline := time.Now().Add(waitTimeout)
			for len(d.failures()) == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if len(d.failures()) != 1 {
				t.Fatalf("failures %v, want one", d.failures())
			}
			s := d.dev.Stats()
			if s.GuestErrorsByKind[virtio.GuestErrLayout] != 1 || s.Requests != 0 {
				t.Fatalf("stats %+v: want one layout error and no request served", s)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []virtio9p.Config{
		{Tag: "", Root: t.TempDir()},
		{Tag: "a b", Root: t.TempDir()},
		{Tag: "t", Root: filepath.Join(t.TempDir(), "missing")},
		{Tag: "t", Root: file},
	} {
		if _, err := virtio9p.New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

// TestOverMsize: a request longer than the msize the guest negotiated
// ends the server's session; the device reports it as a guest error
// instead of leaving the guest's requests unanswered.
func TestOverMsize(t *testing.T) {
	d := newDriver(t, virtio9p.Config{Root: t.TempDir()})
	if _, err := d.Write(tversion(8192, 0xffff)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 64)
	if n, err := d.Read(b); err != nil || n < 11 || binary.LittleEndian.Uint32(b[7:]) != 8192 {
		t.Fatalf("Rversion %x, %v: want msize 8192", b[:n], err)
	}
	big := make([]byte, 10000)
	binary.LittleEndian.PutUint32(big, uint32(len(big)))
	big[4] = 118 // Twrite
	binary.LittleEndian.PutUint16(big[5:], 2)
	if _, err := d.Write(big); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout)
	for len(d.failures()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if f := d.failures(); len(f) != 1 || !errors.Is(f[0], virtio.ErrGuest) {
		t.Fatalf("failures %v, want one guest error", f)
	}
	if n := d.dev.Stats().GuestErrorsByKind[virtio.GuestErrLayout]; n != 1 {
		t.Fatalf("%d layout errors, want 1", n)
	}
}

// FuzzRequests: whatever one request message holds (after a Tversion, so
// the server has a session), the device answers it or reports a guest
// error; it never panics, and the server's file tree stays inside the
// share.
func FuzzRequests(f *testing.F) {
	f.Add([]byte{120, 1, 0, 1, 0, 0, 0})                                    // Tclunk of fid 1
	f.Add(append([]byte{110, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0}, ".."...)) // Twalk of ..
	f.Add(tversion(1<<30, 3)[4:])
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) < 3 || len(body) > 4096 {
			return
		}
		d := newDriver(t, virtio9p.Config{Root: t.TempDir()})
		if _, err := d.Write(tversion(8192, 0xffff)); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 64)
		if _, err := d.Read(b); err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, 4+len(body))
		binary.LittleEndian.PutUint32(msg, uint32(len(msg)))
		copy(msg[4:], body)
		if _, err := d.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make(chan struct{})
		go func() {
			r := make([]byte, slotSize)
			if _, err := d.Read(r); err == nil {
				close(got)
			}
		}()
		deadline := time.After(waitTimeout)
		for {
			select {
			case <-got:
				return
			case <-deadline:
				t.Fatalf("request %x: no reply and no guest error", body)
			case <-time.After(5 * time.Millisecond):
				if len(d.failures()) > 0 {
					return
				}
			}
		}
	})
}

// TestReaddirCountBounded: a Treaddir asking for more than MaxMessage
// bytes of a large directory is answered (the device lowers the count);
// the server would otherwise write a longer reply than the device takes,
// a host panic. The reply fills the chain's room, a slot here (the rest
// is cut, as for any guest that asks for more than its msize), so it is
// checked by the device's counters.
func TestReaddirCountBounded(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("n", 240)
	for i := range 1200 { // about 264 bytes of entry each: over MaxMessage in all
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s%05d", long, i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := newDriver(t, virtio9p.Config{Root: dir})
	c := newRawConn(t, d)
	c.call(tversion(slotSize, 0xffff), 101)
	c.call(tmsg(tAttach, 1, uint32(1), noFid, "", "", noFid), rAttach)
	c.call(tmsg(tLopen, 1, uint32(1), uint32(0)), rLopen)
	before := d.dev.Stats()
	c.send(tmsg(tReaddir, 2, uint32(1), uint64(0), uint32(4<<20)))
	deadline := time.Now().Add(waitTimeout)
	for d.dev.Stats().Replies == before.Replies {
		if time.Now().After(deadline) {
			t.Fatal("no reply to the Treaddir")
		}
		time.Sleep(time.Millisecond)
	}
	if n := d.dev.Stats().ReplyBytes - before.ReplyBytes; n != slotSize {
		t.Errorf("Rreaddir: %d bytes written; want the slot's %d", n, slotSize)
	}
	if f := d.failures(); len(f) != 0 {
		t.Errorf("guest errors: %v", f)
	}
}
