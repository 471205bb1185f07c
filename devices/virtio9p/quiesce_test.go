package virtio9p_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/microvm/microvm/devices/virtio9p"
	"github.com/microvm/microvm/virtio"
)

// gate is a p9.Attacher around the share that holds reads in the server
// on demand (a slow host file, for as long as the test says) and counts
// the files the server holds.
type gate struct {
	inner   p9.Attacher
	armed   atomic.Bool
	entered chan struct{} // a token per read held
	release chan struct{} // closed by open: held reads go on
	once    sync.Once

	opened, closed atomic.Int64
}

// gateShare puts a gate between dev's server and its share. The test must
// open it before its device is closed (defer g.open()): a read it holds
// would otherwise hold up the close.
func gateShare(dev *virtio9p.Device) *gate {
	g := &gate{entered: make(chan struct{}, 64), release: make(chan struct{})}
	virtio9p.WrapAttacher(dev, func(a p9.Attacher) p9.Attacher {
		g.inner = a
		return g
	})
	return g
}

// hold makes every read from now on wait for open.
func (g *gate) hold() { g.armed.Store(true) }

// open lets the held reads, and all later ones, go on.
func (g *gate) open() {
	g.once.Do(func() {
		g.armed.Store(false)
		close(g.release)
	})
}

// held is the number of files the server holds (fids, and files it is
// walking).
func (g *gate) held() int64 { return g.opened.Load() - g.closed.Load() }

func (g *gate) wrap(f p9.File) p9.File {
	g.opened.Add(1)
	return &gatedFile{File: f, g: g}
}

// Attach implements p9.Attacher.
func (g *gate) Attach() (p9.File, error) {
	f, err := g.inner.Attach()
	if err != nil {
		return nil, err
	}
	return g.wrap(f), nil
}

type gatedFile struct {
	p9.File
	g *gate
}

func (f *gatedFile) Walk(names []string) ([]p9.QID, p9.File, error) {
	qids, nf, err := f.File.Walk(names)
	if err != nil {
		return nil, nil, err
	}
	return qids, f.g.wrap(nf), nil
}

func (f *gatedFile) ReadAt(p []byte, off int64) (int, error) {
	if f.g.armed.Load() {
		f.g.entered <- struct{}{}
		<-f.g.release
	}
	return f.File.ReadAt(p, off)
}

func (f *gatedFile) Close() error {
	f.g.closed.Add(1)
	return f.File.Close()
}

// newTransport puts dev behind a virtio-mmio transport over d's memory,
// interrupting d; the test's end shuts the driver and closes the
// transport (a device reset) before the device.
func newTransport(t *testing.T, dev *virtio9p.Device, d *driver) *virtio.MMIO {
	t.Helper()
	m, err := virtio.NewMMIO(dev, d.mem.Memory, d.interrupt, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.shut() // before the kick eventfd closes
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func w32(m *virtio.MMIO, off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	m.Write(off, b[:])
}

func r32(m *virtio.MMIO, off uint64) uint32 {
	var b [4]byte
	m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// notifier is the driver's kick through m's QueueNotify register.
func notifier(m *virtio.MMIO) func() { return func() { w32(m, virtio.RegQueueNotify, 0) } }

// newMMIODriver is a driver for dev behind a virtio-mmio transport, which
// it starts through the registers as Linux's driver does.
func newMMIODriver(t *testing.T, dev *virtio9p.Device) (*driver, *virtio.MMIO) {
	t.Helper()
	d := attachDriver(t, dev)
	m := newTransport(t, dev, d)
	d.mu.Lock()
	d.kick = notifier(m)
	d.mu.Unlock()
	addStatus := func(bits uint32) { w32(m, virtio.RegStatus, r32(m, virtio.RegStatus)|bits) }
	w32(m, virtio.RegStatus, 0)
	addStatus(virtio.StatusAcknowledge)
	addStatus(virtio.StatusDriver)
	f := virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc | 1 // the mount tag
	w32(m, virtio.RegDriverFeaturesSel, 1)
	w32(m, virtio.RegDriverFeatures, uint32(f>>32))
	w32(m, virtio.RegDriverFeaturesSel, 0)
	w32(m, virtio.RegDriverFeatures, uint32(f))
	addStatus(virtio.StatusFeaturesOK)
	cfg := d.q.Cfg
	w32(m, virtio.RegQueueSel, 0)
	w32(m, virtio.RegQueueNum, uint32(cfg.Size))
	w32(m, virtio.RegQueueDescLow, uint32(cfg.Desc))
	w32(m, virtio.RegQueueDescHigh, uint32(cfg.Desc>>32))
	w32(m, virtio.RegQueueDriverLow, uint32(cfg.Avail))
	w32(m, virtio.RegQueueDriverHigh, uint32(cfg.Avail>>32))
	w32(m, virtio.RegQueueDeviceLow, uint32(cfg.Used))
	w32(m, virtio.RegQueueDeviceHigh, uint32(cfg.Used>>32))
	w32(m, virtio.RegQueueReady, 1)
	addStatus(virtio.StatusDriverOK)
	if s := r32(m, virtio.RegStatus); s != 15 {
		t.Fatalf("status after DRIVER_OK: %s", virtio.StatusString(s))
	}
	return d, m
}

// clientRoot is a 9P client over d attached to the share's root. Nothing
// is clunked at the test's end: the device may be stopped by then.
func clientRoot(t *testing.T, d *driver) p9.File {
	t.Helper()
	c, err := p9.NewClient(d, p9.WithMessageSize(slotSize))
	if err != nil {
		t.Fatal(err)
	}
	root, err := c.Attach("")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// openAt walks from dir to name and opens it for reading.
func openAt(t *testing.T, dir p9.File, name string) p9.File {
	t.Helper()
	_, f, err := dir.Walk([]string{name})
	if err != nil {
		t.Fatalf("walk %s: %v", name, err)
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	return f
}

// within waits for ch, or fails the test after waitTimeout.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("no %s in %v", what, waitTimeout)
		panic("unreachable")
	}
}

// noSession waits until no goroutine runs a session's code (their loops
// have returned; the tail of a goroutine that closed its done channel may
// still be on its way out), or fails the test.
func noSession(t *testing.T) {
	t.Helper()
	buf := make([]byte, 4<<20)
	deadline := time.Now().Add(waitTimeout)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte("virtio9p.(*session)")) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a session goroutine outlived Quiesce:\n%s", buf[:n])
		}
		time.Sleep(time.Millisecond)
	}
}

// checkDrained checks what the Quiescer contract promises once the
// transport's Quiesce has returned: the saved position has nothing in
// flight, the used index in guest memory is that position, and no session
// goroutine is left. It returns the position.
func checkDrained(t *testing.T, d *driver, m *virtio.MMIO) uint16 {
	t.Helper()
	st, err := m.SaveState()
	if err != nil {
		t.Fatalf("SaveState after Quiesce: %v", err)
	}
	q := st.Queues[0]
	used, err := d.mem.Load16Acquire(d.q.Cfg.Used + 2)
	if err != nil {
		t.Fatal(err)
	}
	if q.NextAvail != q.UsedIdx || used != q.UsedIdx {
		t.Fatalf("after Quiesce: next available %d, used index saved %d, in the ring %d; want all equal", q.NextAvail, q.UsedIdx, used)
	}
	noSession(t)
	return q.UsedIdx
}

// checkHealthy checks that the device saw no guest error, answered every
// request it took, and pushed no chain twice.
func checkHealthy(t *testing.T, d *driver, m *virtio.MMIO) {
	t.Helper()
	if s := r32(m, virtio.RegStatus); s&virtio.StatusNeedsReset != 0 {
		t.Errorf("status %s", virtio.StatusString(s))
	}
	if s := d.dev.Stats(); s.GuestErrors != 0 || s.Requests != s.Replies {
		t.Errorf("stats %+v: want no guest error and a reply per request", s)
	}
	if h := d.strayHeads(); len(h) != 0 {
		t.Errorf("used heads %v answered no chain in flight (pushed twice?)", h)
	}
}

// pattern is content whose every 4 KiB block differs from the others.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i>>12) ^ byte(i*31)
	}
	return b
}

// TestQuiesceAnswersInFlight: reads the server holds (a slow host file)
// when the transport quiesces the device are answered before Quiesce
// returns, and Quiesce waits for them; requests that race the quiesce
// are either answered or left on the ring for the resumed session. Then
// the queue's positions are final, no session goroutine is left, the
// state saves, and after Resume the guest's fids (open files included)
// still work. A driver reset after a quiesce ends the connection: the
// server closes every file.
func TestQuiesceAnswersInFlight(t *testing.T) {
	const held, racing = 3, 4
	dir := t.TempDir()
	content := pattern(64 << 10)
	if err := os.WriteFile(filepath.Join(dir, "big"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "small"), []byte("small"), 0o644); err != nil {
		t.Fatal(err)
	}
	dev := newDevice(t, virtio9p.Config{Root: dir})
	g := gateShare(dev)
	defer g.open()
	d, m := newMMIODriver(t, dev)
	root := clientRoot(t, d)
	files := make([]p9.File, held)
	for i := range files {
		files[i] = openAt(t, root, "big")
	}
	_, small, err := root.Walk([]string{"small"})
	if err != nil {
		t.Fatal(err)
	}
	fids := g.held()
	// The client clunks a file it no longer references (a finalizer),
	// which would change what the server holds.
	defer runtime.KeepAlive([]p9.File{root, small, files[0], files[1], files[2]})

	type result struct {
		i   int
		got []byte
		err error
	}
	reads := make(chan result, held)
	g.hold()
	for i, f := range files {
		go func() {
			buf := make([]byte, 4096)
			n, err := f.ReadAt(buf, int64(i)*4096)
			reads <- result{i, buf[:n], err}
		}()
	}
	for range held {
		within(t, g.entered, "read reaching the server")
	}
	others := make(chan error, racing)
	for range racing {
		go func() {
			_, _, a, err := small.GetAttr(p9.AttrMaskAll)
			if err == nil && a.Size != 5 {
				err = fmt.Errorf("size %d, want 5", a.Size)
			}
			others <- err
		}()
	}

	draining := virtio9p.Draining(dev)
	if draining == nil {
		t.Fatal("no session runs")
	}
	quiesced := make(chan error, 1)
	go func() { quiesced <- m.Quiesce() }()
	within(t, draining, "drain")
	select {
	case err := <-quiesced:
		t.Fatalf("Quiesce returned (%v) while the server held %d reads", err, held)
	default:
	}
	g.open()
	if err := within(t, quiesced, "Quiesce"); err != nil {
		t.Fatalf("Quiesce: %v", err)
	}
	checkDrained(t, d, m)
	// The held reads were popped, so their replies are in the used ring
	// already: they arrive with the device stopped.
	for range held {
		r := within(t, reads, "reply to a held read")
		if want := content[r.i*4096 : (r.i+1)*4096]; r.err != nil || !bytes.Equal(r.got, want) {
			t.Errorf("read %d: %d bytes, %v; want block %d", r.i, len(r.got), r.err, r.i)
		}
	}
	if n := g.held(); n != fids {
		t.Errorf("the server holds %d files after Quiesce; it held %d before", n, fids)
	}

	if err := m.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	for range racing {
		if err := within(t, others, "racing getattr"); err != nil {
			t.Errorf("getattr: %v", err)
		}
	}
	// The fids from before the quiesce, open files included.
	buf := make([]byte, 4096)
	if n, err := files[0].ReadAt(buf, 8192); err != nil || !bytes.Equal(buf[:n], content[8192:12288]) {
		t.Errorf("read after Resume: %d bytes, %v", n, err)
	}
	if _, f, err := root.Walk([]string{"small"}); err != nil {
		t.Errorf("walk after Resume: %v", err)
	} else if err := f.Close(); err != nil {
		t.Errorf("clunk after Resume: %v", err)
	}
	checkHealthy(t, d, m)

	// Quiesced again, with nothing in flight, then reset by the driver:
	// the connection ends and the server closes every file.
	if err := m.Quiesce(); err != nil {
		t.Fatalf("second Quiesce: %v", err)
	}
	checkDrained(t, d, m)
	if n := g.held(); n != fids {
		t.Errorf("the server holds %d files after the second Quiesce; want %d", n, fids)
	}
	w32(m, virtio.RegStatus, 0)
	if n := g.held(); n != 0 {
		t.Errorf("the server holds %d files after the driver's reset; want none", n)
	}
}

// tmsg encodes a 9P message of type typ and tag with fields (uint16,
// uint32, uint64 or string).
func tmsg(typ byte, tag uint16, fields ...any) []byte {
	b := []byte{0, 0, 0, 0, typ, byte(tag), byte(tag >> 8)}
	for _, f := range fields {
		switch v := f.(type) {
		case uint16:
			b = binary.LittleEndian.AppendUint16(b, v)
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, v)
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, v)
		case string:
			b = binary.LittleEndian.AppendUint16(b, uint16(len(v)))
			b = append(b, v...)
		default:
			panic(fmt.Sprintf("tmsg: field of type %T", f))
		}
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// rawConn plays a 9P client message by message over a driver.
type rawConn struct {
	t       *testing.T
	d       *driver
	replies chan []byte
}

func newRawConn(t *testing.T, d *driver) *rawConn {
	c := &rawConn{t: t, d: d, replies: make(chan []byte, 16)}
	go func() {
		for {
			var hdr [4]byte
			if _, err := io.ReadFull(d, hdr[:]); err != nil {
				return
			}
			m := make([]byte, binary.LittleEndian.Uint32(hdr[:]))
			copy(m, hdr[:])
			if _, err := io.ReadFull(d, m[4:]); err != nil {
				return
			}
			c.replies <- m
		}
	}()
	return c
}

func (c *rawConn) send(m []byte) {
	c.t.Helper()
	if _, err := c.d.Write(m); err != nil {
		c.t.Fatal(err)
	}
}

// recv returns the next reply, checking its type and tag.
func (c *rawConn) recv(typ byte, tag uint16) []byte {
	c.t.Helper()
	m := within(c.t, c.replies, fmt.Sprintf("reply type %d tag %d", typ, tag))
	if m[4] != typ || binary.LittleEndian.Uint16(m[5:]) != tag {
		c.t.Fatalf("reply %x: want type %d tag %d", m, typ, tag)
	}
	return m
}

// call sends m and returns its reply, of type typ.
func (c *rawConn) call(m []byte, typ byte) []byte {
	c.t.Helper()
	c.send(m)
	return c.recv(typ, binary.LittleEndian.Uint16(m[5:]))
}

// 9P2000.L message types the raw tests use.
const (
	tAttach, rAttach = 104, 105
	tWalk, rWalk     = 110, 111
	tLopen, rLopen   = 12, 13
	tRead, rRead     = 116, 117
	tFlush, rFlush   = 108, 109
	tReaddir         = 40
	noFid            = ^uint32(0)
)

// TestQuiesceFlush: a Tflush waits in the server for the request it names;
// with that request held in the server, Quiesce answers both (the read
// and the flush) and returns, and the fid works after Resume.
func TestQuiesceFlush(t *testing.T) {
	dir := t.TempDir()
	content := pattern(8192)
	if err := os.WriteFile(filepath.Join(dir, "big"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	dev := newDevice(t, virtio9p.Config{Root: dir})
	g := gateShare(dev)
	defer g.open()
	d, m := newMMIODriver(t, dev)
	c := newRawConn(t, d)
	c.call(tversion(slotSize, 0xffff), 101)
	c.call(tmsg(tAttach, 1, uint32(1), noFid, "", "", noFid), rAttach)
	c.call(tmsg(tWalk, 1, uint32(1), uint32(2), uint16(1), "big"), rWalk)
	c.call(tmsg(tLopen, 1, uint32(2), uint32(0)), rLopen)

	g.hold()
	c.send(tmsg(tRead, 5, uint32(2), uint64(0), uint32(100)))
	within(t, g.entered, "read reaching the server")
	c.send(tmsg(tFlush, 6, uint16(5)))
	// Both taken by the device before it is quiesced (requests are
	// counted as they go to the server).
	deadline := time.Now().Add(waitTimeout)
	for dev.Stats().Requests < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("the device took %d requests; want 6", dev.Stats().Requests)
		}
		time.Sleep(time.Millisecond)
	}
	draining := virtio9p.Draining(dev)
	quiesced := make(chan error, 1)
	go func() { quiesced <- m.Quiesce() }()
	within(t, draining, "drain")
	select {
	case err := <-quiesced:
		t.Fatalf("Quiesce returned (%v) while the server held a read and its flush", err)
	default:
	}
	g.open()
	if err := within(t, quiesced, "Quiesce"); err != nil {
		t.Fatalf("Quiesce: %v", err)
	}
	checkDrained(t, d, m)
	got := map[byte][]byte{}
	for range 2 {
		r := within(t, c.replies, "reply to the read or the flush")
		got[r[4]] = r
	}
	if r := got[rRead]; len(r) < 11 || binary.LittleEndian.Uint16(r[5:]) != 5 || !bytes.Equal(r[11:], content[:100]) {
		t.Errorf("Rread %x: want tag 5 and the file's first 100 bytes", r)
	}
	if r := got[rFlush]; len(r) != 7 || binary.LittleEndian.Uint16(r[5:]) != 6 {
		t.Errorf("Rflush %x: want tag 6", r)
	}

	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}
	r := c.call(tmsg(tRead, 7, uint32(2), uint64(100), uint32(100)), rRead)
	if !bytes.Equal(r[11:], content[100:200]) {
		t.Errorf("read after Resume: %x", r[11:])
	}
	checkHealthy(t, d, m)
}

// TestRestoreForgetsFids: restored into a new device and transport (as in
// a new process), the share comes back with no fids: the guest's requests
// on its old ones get a clean 9P error (EBADF), not a guest error or a
// hang, and a new mount (Tversion, Tattach) works.
func TestRestoreForgetsFids(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("kept on the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := newDevice(t, virtio9p.Config{Root: dir})
	d, m := newMMIODriver(t, old)
	root := clientRoot(t, d)
	f := openAt(t, root, "f")
	buf := make([]byte, 64)
	if n, err := f.ReadAt(buf, 0); err != nil || string(buf[:n]) != "kept on the host" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if err := m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	checkDrained(t, d, m)
	st, err := m.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back virtio.MMIOState
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	old.Close() // the old process is gone

	dev := newDevice(t, virtio9p.Config{Root: dir})
	m2 := newTransport(t, dev, d)
	d.mu.Lock()
	d.dev, d.kick = dev, notifier(m2)
	d.mu.Unlock()
	if err := m2.RestoreState(back); err != nil {
		t.Fatalf("RestoreState: %v", err)
	}
	if _, err := f.ReadAt(buf, 0); !errors.Is(err, linux.EBADF) {
		t.Errorf("read of an old fid: %v; want EBADF", err)
	}
	if _, _, _, err := f.GetAttr(p9.AttrMaskAll); !errors.Is(err, linux.EBADF) {
		t.Errorf("getattr of an old fid: %v; want EBADF", err)
	}
	if _, _, err := root.Walk([]string{"f"}); !errors.Is(err, linux.EBADF) {
		t.Errorf("walk from the old root: %v; want EBADF", err)
	}
	// A new mount: the guest's remount after such errors. The old client
	// must stay idle meanwhile (the two share the driver's replies): a
	// finalizer of its files would clunk them.
	defer runtime.KeepAlive([]p9.File{root, f})
	root2 := clientRoot(t, d)
	f2 := openAt(t, root2, "f")
	if n, err := f2.ReadAt(buf, 0); err != nil || string(buf[:n]) != "kept on the host" {
		t.Errorf("read after a new mount: %q, %v", buf[:n], err)
	}
	checkHealthy(t, d, m2)
}
