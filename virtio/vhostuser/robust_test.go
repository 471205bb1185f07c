package vhostuser

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// fakeDevice is a virtio device with vsock's three queues that records
// activations and resets.
type fakeDevice struct {
	activated chan virtio.Activation
	mu        sync.Mutex
	resets    int
}

func newFakeDevice() *fakeDevice { return &fakeDevice{activated: make(chan virtio.Activation, 16)} }

func (d *fakeDevice) Type() uint32                    { return 19 }
func (d *fakeDevice) Features() uint64                { return 0 }
func (d *fakeDevice) QueueSizes() []uint16            { return []uint16{256, 256, 256} }
func (d *fakeDevice) ReadConfig(off uint64, p []byte) { clear(p) }
func (d *fakeDevice) WriteConfig(uint64, []byte)      {}
func (d *fakeDevice) Activate(a virtio.Activation) error {
	d.activated <- a
	return nil
}
func (d *fakeDevice) Reset() {
	d.mu.Lock()
	d.resets++
	d.mu.Unlock()
}

// testBackend is a Backend serving a fakeDevice, with its log captured.
type testBackend struct {
	*Backend
	dev  *fakeDevice
	hook *logtest.Hook
}

func startTestBackend(t *testing.T) *testBackend {
	t.Helper()
	dir, err := os.MkdirTemp("", "vhu") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.SetLevel(logrus.DebugLevel)
	hook := logtest.NewLocal(log)
	dev := newFakeDevice()
	b, err := Listen(filepath.Join(dir, "s"), Config{Device: dev, Queues: 2, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Serve() }()
	t.Cleanup(func() {
		b.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Serve still running 5s after Close")
		}
	})
	return &testBackend{Backend: b, dev: dev, hook: hook}
}

// frontEnd is a scriptable vhost-user front-end.
type frontEnd struct {
	t *testing.T
	c *net.UnixConn
}

func (b *testBackend) dial(t *testing.T) *frontEnd {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: b.Path(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &frontEnd{t: t, c: c}
}

// raw writes bytes, with descriptors attached.
func (f *frontEnd) raw(b []byte, fds ...int) {
	f.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := f.c.WriteMsgUnix(b, oob, nil)
	if err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		// EPIPE and ECONNRESET: the back-end dropped us earlier in the
		// sequence; expectDropped checks it did.
		f.t.Fatalf("write: %v", err)
	}
}

// msg sends one message with the given header flags.
func (f *frontEnd) msgFlags(req Request, flags uint32, p []byte, fds ...int) {
	f.t.Helper()
	b := make([]byte, headerSize+len(p))
	(&header{Request: req, Flags: flags, Size: uint32(len(p))}).encode(b)
	copy(b[headerSize:], p)
	f.raw(b, fds...)
}

// msg sends a version-1 message.
func (f *frontEnd) msg(req Request, p []byte, fds ...int) { f.msgFlags(req, flagVersion, p, fds...) }

// call sends a message and returns the reply's payload.
func (f *frontEnd) call(req Request, p []byte) []byte {
	f.t.Helper()
	f.msg(req, p)
	var hb [headerSize]byte
	if _, err := io.ReadFull(f.c, hb[:]); err != nil {
		f.t.Fatalf("%v reply: %v", req, err)
	}
	var h header
	h.decode(hb[:])
	if h.Request != req || h.Flags != flagVersion|flagReply || h.Size > maxPayload {
		f.t.Fatalf("%v reply header %+v", req, h)
	}
	out := make([]byte, h.Size)
	if _, err := io.ReadFull(f.c, out); err != nil {
		f.t.Fatalf("%v reply: %v", req, err)
	}
	return out
}

// acked sends a message with NEED_REPLY and checks the ack (REPLY_ACK must
// have been negotiated): it proves the back-end accepted the message.
func (f *frontEnd) acked(req Request, p []byte, fds ...int) {
	f.t.Helper()
	f.msgFlags(req, flagVersion|flagNeedReply, p, fds...)
	var b [headerSize + 8]byte
	if _, err := io.ReadFull(f.c, b[:]); err != nil {
		f.t.Fatalf("%v: no ack: %v", req, err)
	}
	var h header
	h.decode(b[:])
	if h.Request != req || h.Size != 8 || binary.LittleEndian.Uint64(b[headerSize:]) != 0 {
		f.t.Fatalf("%v: ack %+v %x", req, h, b[headerSize:])
	}
}

// expectDropped checks the back-end closes the connection.
func (f *frontEnd) expectDropped() {
	f.t.Helper()
	_ = f.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [64]byte
	n, err := f.c.Read(b[:])
	if n > 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
		f.t.Fatalf("want the connection closed, got %d bytes (%x), %v", n, b[:n], err)
	}
}

func u64(v uint64) []byte { return encodeU64(v) }

func state(index, num uint32) []byte { return vringState{index, num}.encode() }

// Guest memory layout of the good session: one memfd region, rings in it.
const (
	memSize  = 1 << 20
	memUser  = 0x7f00_0000_0000 // the front-end's address of guest address 0
	ringSize = 256
)

func ringAddr(index uint32) []byte {
	b := make([]byte, 40)
	base := memUser + uint64(index)*0x4000
	binary.LittleEndian.PutUint32(b[0:], index)
	binary.LittleEndian.PutUint64(b[8:], base)         // descriptors
	binary.LittleEndian.PutUint64(b[16:], base+0x2000) // used
	binary.LittleEndian.PutUint64(b[24:], base+0x1000) // available
	return b
}

func memTable(regions ...memRegion) []byte {
	b := make([]byte, 8+32*len(regions))
	binary.LittleEndian.PutUint32(b, uint32(len(regions)))
	for i, r := range regions {
		o := 8 + 32*i
		binary.LittleEndian.PutUint64(b[o:], r.GPA)
		binary.LittleEndian.PutUint64(b[o+8:], r.Size)
		binary.LittleEndian.PutUint64(b[o+16:], r.UserAddr)
		binary.LittleEndian.PutUint64(b[o+24:], r.Offset)
	}
	return b
}

// memfd returns a memfd of size bytes sealed against shrinking and growing,
// as QEMU's memory-backend-memfd hands it over (seal=on), closed at the end
// of the test.
func memfd(t *testing.T, size int64) int {
	t.Helper()
	fd := unsealedMemfd(t, size, unix.MFD_ALLOW_SEALING)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	return fd
}

// unsealedMemfd returns a memfd of size bytes without seals (flags may allow
// them), closed at the end of the test.
func unsealedMemfd(t *testing.T, size int64, flags int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("guest", unix.MFD_CLOEXEC|flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	return fd
}

func newEventFD(t *testing.T) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// negotiate does QEMU's opening: owner, features with protocol features,
// REPLY_ACK.
func (f *frontEnd) negotiate() {
	f.t.Helper()
	f.msg(SetOwner, nil)
	feat, _ := decodeU64(f.call(GetFeatures, nil))
	if feat&FeatureProtocolFeatures == 0 || feat&virtio.FeatureVersion1 == 0 {
		f.t.Fatalf("GET_FEATURES %#x", feat)
	}
	f.msg(SetFeatures, u64(virtio.FeatureVersion1|FeatureProtocolFeatures))
	proto, _ := decodeU64(f.call(GetProtocolFeatures, nil))
	if proto&ProtocolReplyAck == 0 {
		f.t.Fatalf("GET_PROTOCOL_FEATURES %#x", proto)
	}
	f.msg(SetProtocolFeatures, u64(ProtocolReplyAck))
	if n, _ := decodeU64(f.call(GetQueueNum, nil)); n != 2 {
		f.t.Fatalf("GET_QUEUE_NUM %d, want 2", n)
	}
}

// startRings configures and starts both rings as QEMU does, checking each
// message is acknowledged when ack is set.
func (f *frontEnd) startRings(ack bool) {
	f.t.Helper()
	send := f.msg
	if ack {
		send = f.acked
	}
	for i := range uint32(2) {
		send(SetVringNum, state(i, ringSize))
		send(SetVringBase, state(i, 0))
		send(SetVringAddr, ringAddr(i))
		send(SetVringKick, u64(uint64(i)), newEventFD(f.t))
		send(SetVringCall, u64(uint64(i)), newEventFD(f.t))
		send(SetVringEnable, state(i, 1))
	}
}

// goodSession runs a well-formed front-end through device activation and
// GET_VRING_BASE, proving the back-end serves.
func (b *testBackend) goodSession(t *testing.T) {
	t.Helper()
	f := b.dial(t)
	f.negotiate()
	f.acked(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), memfd(t, memSize))
	f.startRings(true)
	select {
	case a := <-b.dev.activated:
		if len(a.Queues) != 3 || a.Queues[0] == nil || a.Queues[1] == nil || a.Queues[2] != nil {
			t.Fatalf("activation queues %v: want rx and tx, no event queue", a.Queues)
		}
		if a.Features != virtio.FeatureVersion1|FeatureProtocolFeatures {
			t.Errorf("activation features %#x", a.Features)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("device not activated")
	}
	if s, err := decodeState(f.call(GetVringBase, state(0, 0))); err != nil || s != (vringState{0, 0}) {
		t.Fatalf("GET_VRING_BASE: %+v %v", s, err)
	}
	f.c.Close()
	// Wait for the back-end to let go of the connection.
	deadline := time.Now().Add(5 * time.Second)
	for !b.logged(logrus.InfoLevel, "vhost-user: front-end disconnected; waiting for the next one") {
		if time.Now().After(deadline) {
			t.Fatalf("back-end did not see the disconnect; log:\n%s", entries(b.hook))
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.hook.Reset()
}

// logged reports whether the back-end logged msg at level.
func (b *testBackend) logged(level logrus.Level, msg string) bool {
	for _, e := range b.hook.AllEntries() {
		if e.Level == level && e.Message == msg {
			return true
		}
	}
	return false
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestGoodFrontEnd checks the scripted front-end itself: two sessions in a
// row activate the device.
func TestGoodFrontEnd(t *testing.T) {
	b := startTestBackend(t)
	b.goodSession(t)
	b.goodSession(t)
	served, proto, guest := b.Stats()
	if proto != 0 || guest != 0 {
		t.Errorf("Stats: served %d, protocol errors %d, guest errors %d", served, proto, guest)
	}
}

// TestMalformedFrontEnd sends each kind of malformed input on a fresh
// connection. Each must be logged as an error and end the connection, leak no
// descriptor, and leave the back-end serving a good front-end afterwards.
func TestMalformedFrontEnd(t *testing.T) {
	tests := []struct {
		name string
		send func(t *testing.T, f *frontEnd)
		want string // in the logged error
	}{
		{"garbage header", func(t *testing.T, f *frontEnd) {
			f.raw([]byte{0xde, 0xad, 0xbe, 0xef, 0xfe, 0xed, 0xfa, 0xce, 0x0b, 0xad, 0xf0, 0x0d})
		}, "message version 2"},
		{"unknown request", func(t *testing.T, f *frontEnd) {
			f.msg(Request(0xdeadbeef), nil)
		}, "unsupported request REQUEST(3735928559)"},
		{"wrong version", func(t *testing.T, f *frontEnd) {
			f.msgFlags(GetFeatures, 0x2, nil)
		}, "message version 2"},
		{"version 0", func(t *testing.T, f *frontEnd) {
			f.msgFlags(GetFeatures, 0, nil)
		}, "message version 0"},
		{"oversized payload", func(t *testing.T, f *frontEnd) {
			b := make([]byte, headerSize)
			(&header{Request: SetMemTable, Flags: flagVersion, Size: 1 << 20}).encode(b)
			f.raw(b)
		}, "SET_MEM_TABLE with a 1048576-byte payload"},
		{"huge payload size", func(t *testing.T, f *frontEnd) {
			b := make([]byte, headerSize)
			(&header{Request: GetConfig, Flags: flagVersion, Size: 0xffffffff}).encode(b)
			f.raw(b)
		}, "GET_CONFIG with a 4294967295-byte payload"},
		{"short payload", func(t *testing.T, f *frontEnd) {
			f.msg(SetFeatures, []byte{1, 2, 3})
		}, "SET_FEATURES: vhost-user protocol error: payload of 3 bytes, want a u64"},
		{"descriptors on GET_FEATURES", func(t *testing.T, f *frontEnd) {
			f.msg(GetFeatures, nil, newEventFD(t))
		}, "GET_FEATURES: vhost-user protocol error: 1 descriptors attached, want 0"},
		{"SET_VRING_ADDR before SET_MEM_TABLE, then start", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			for i := range uint32(2) {
				f.msg(SetVringNum, state(i, ringSize))
				f.msg(SetVringAddr, ringAddr(i))
				f.msg(SetVringKick, u64(uint64(i)), newEventFD(t))
				f.msg(SetVringEnable, state(i, 1))
			}
		}, "SET_VRING_ADDR: vhost-user protocol error: ring 0 address before SET_MEM_TABLE"},
		{"ring addresses outside the memory table", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.acked(SetMemTable, memTable(memRegion{GPA: 0, Size: 0x4000, UserAddr: memUser}), memfd(t, 0x4000))
			f.startRings(false)
		}, "ring 1: descriptor table"},
		{"ring index out of range (SET_VRING_NUM)", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetVringNum, state(2, ringSize)) // the event queue: QEMU keeps it
		}, "SET_VRING_NUM: vhost-user protocol error: ring 2 does not exist (the device has 2)"},
		{"ring index out of range (SET_VRING_ADDR)", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.acked(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), memfd(t, memSize))
			f.msg(SetVringAddr, ringAddr(0xffffffff))
		}, "ring 4294967295 does not exist"},
		{"SET_MEM_TABLE with fewer descriptors than regions", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser},
				memRegion{GPA: memSize, Size: memSize, UserAddr: memUser + memSize}), memfd(t, memSize))
		}, "SET_MEM_TABLE: vhost-user protocol error: 1 descriptors attached, want 2"},
		{"SET_MEM_TABLE with more descriptors than regions", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), memfd(t, memSize), memfd(t, memSize))
		}, "2 descriptors attached, want 1"},
		{"SET_MEM_TABLE without descriptors", func(t *testing.T, f *frontEnd) {
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}))
		}, "0 descriptors attached, want 1"},
		{"SET_MEM_TABLE with nine descriptors", func(t *testing.T, f *frontEnd) {
			fds := make([]int, 9)
			for i := range fds {
				fds[i] = newEventFD(t)
			}
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), fds...)
		}, "more than 8 descriptors in one message"},
		{"SET_MEM_TABLE region past the end of its file", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), memfd(t, 0x1000))
			f.startRings(false)
		}, "past the end of"},
		// Regression: a front-end that shrank its memfd after
		// SET_MEM_TABLE killed the back-end with SIGBUS at the device's
		// next touch of guest memory. Only memory sealed against
		// shrinking is accepted now.
		{"memfd not sealed against shrinking", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), unsealedMemfd(t, memSize, 0))
		}, "memfd not sealed against shrinking"},
		{"memfd that allows sealing but is not sealed", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), unsealedMemfd(t, memSize, unix.MFD_ALLOW_SEALING))
		}, "memfd not sealed against shrinking (seals 0x0)"},
		{"guest memory in a plain file", func(t *testing.T, f *frontEnd) {
			file, err := os.CreateTemp(t.TempDir(), "mem")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { file.Close() })
			if err := file.Truncate(memSize); err != nil {
				t.Fatal(err)
			}
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), int(file.Fd()))
		}, "guest memory is not a memfd"},
		{"regions overlap in guest addresses", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser},
				memRegion{GPA: memSize - 0x1000, Size: memSize, UserAddr: memUser + memSize}), memfd(t, memSize), memfd(t, memSize))
		}, "regions 0 and 1 overlap in guest addresses"},
		{"regions overlap in front-end addresses", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser},
				memRegion{GPA: memSize, Size: memSize, UserAddr: memUser + 0x1000}), memfd(t, memSize), memfd(t, memSize))
		}, "regions 0 and 1 overlap in front-end addresses"},
		{"one region inside another (third of three)", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser},
				memRegion{GPA: 4 * memSize, Size: memSize, UserAddr: memUser + 4*memSize},
				memRegion{GPA: 4*memSize + 0x1000, Size: 0x1000, UserAddr: memUser + 8*memSize}), memfd(t, memSize), memfd(t, memSize), memfd(t, memSize))
		}, "regions 1 and 2 overlap in guest addresses"},
		{"front-end range that wraps", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: ^uint64(0) - 0x1000}), memfd(t, memSize))
		}, "front-end range 0xffffffffffffefff+0x100000 wraps"},
		{"kick for a missing ring", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			f.msg(SetVringKick, u64(2), newEventFD(t))
		}, "SET_VRING_KICK: vhost-user protocol error: ring 2 does not exist (the device has 2)"},
		{"call for a missing ring", func(t *testing.T, f *frontEnd) {
			f.msg(SetVringCall, u64(0xff), newEventFD(t))
		}, "ring 255 does not exist"},
		// Regression: a kick descriptor that is not an eventfd (here a
		// pipe's read end, always "readable" once written) used to be
		// accepted and could make the TX worker spin.
		{"kick that is not an eventfd", func(t *testing.T, f *frontEnd) {
			f.negotiate()
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
			f.msg(SetVringKick, u64(0), p[0])
		}, "SET_VRING_KICK: descriptor is not an eventfd"},
		{"kick without a descriptor", func(t *testing.T, f *frontEnd) {
			f.msg(SetVringKick, u64(vringNoFD), newEventFD(t))
		}, "1 descriptors attached, want 0"},
		{"SET_VRING_ENABLE without protocol features", func(t *testing.T, f *frontEnd) {
			f.msg(SetFeatures, u64(virtio.FeatureVersion1))
			f.msg(SetVringEnable, state(0, 1))
		}, "SET_VRING_ENABLE without protocol features"},
		{"features not offered", func(t *testing.T, f *frontEnd) {
			f.msg(SetFeatures, u64(1<<63))
		}, "were not offered"},
		{"bad ring size", func(t *testing.T, f *frontEnd) {
			f.msg(SetVringNum, state(0, 100))
		}, "ring 0 size 100"},
	}
	b := startTestBackend(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, protoBefore, _ := b.Stats()
			// Registered first, so it runs after the cleanups that close
			// this test's own descriptors.
			before := openFDs(t)
			t.Cleanup(func() {
				if after := openFDs(t); after != before {
					t.Errorf("%d descriptors open before, %d after: a leak", before, after)
				}
			})
			f := b.dial(t)
			tt.send(t, f)
			f.expectDropped()
			f.c.Close()
			// Serve logs after tearing the connection down.
			deadline := time.Now().Add(5 * time.Second)
			var got *logrus.Entry
			for got == nil && time.Now().Before(deadline) {
				for _, e := range b.hook.AllEntries() {
					if e.Level == logrus.ErrorLevel && e.Message == "vhost-user: front-end dropped" {
						got = e
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
			if got == nil {
				t.Fatalf("no error logged; log:\n%s", entries(b.hook))
			}
			if err, _ := got.Data[logrus.ErrorKey].(error); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("logged %v, want it to contain %q", got.Data[logrus.ErrorKey], tt.want)
			}
			if _, proto, _ := b.Stats(); proto != protoBefore+1 {
				t.Errorf("protocol errors went from %d to %d, want one more", protoBefore, proto)
			}
			b.hook.Reset()
			b.goodSession(t)
		})
	}
}

func entries(h *logtest.Hook) string {
	var b strings.Builder
	for _, e := range h.AllEntries() {
		s, _ := e.String()
		b.WriteString(s)
	}
	return b.String()
}

// Regression: a ring descriptor the front-end replaced (SET_VRING_CALL and
// SET_VRING_ERR at any time, SET_VRING_KICK and GET_VRING_BASE on a running
// device) stayed open until the front-end disconnected. QEMU sends
// SET_VRING_CALL each time the guest masks or unmasks the ring's interrupt,
// so a long-lived VM ran the back-end out of descriptors.
func TestRegressionReplacedVringFDsLeak(t *testing.T) {
	b := startTestBackend(t)
	f := b.dial(t)
	f.negotiate()
	f.acked(SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}), memfd(t, memSize))
	f.startRings(true)
	activated := func() {
		t.Helper()
		select {
		case <-b.dev.activated:
		case <-time.After(5 * time.Second):
			t.Fatal("device not activated")
		}
	}
	activated()
	// send attaches a fresh eventfd and closes this side's copy once the
	// back-end has acknowledged it, so only the back-end's copy remains.
	send := func(req Request, ring uint64) {
		t.Helper()
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		f.acked(req, u64(ring), fd)
		unix.Close(fd)
	}
	before := openFDs(t)
	for i := range 100 {
		send(SetVringCall, uint64(i%2))
		send(SetVringErr, uint64(i%2))
	}
	for i := range 4 { // each restarts the device
		send(SetVringKick, uint64(i%2))
		activated()
	}
	if s, err := decodeState(f.call(GetVringBase, state(0, 0))); err != nil || s.Index != 0 {
		t.Fatalf("GET_VRING_BASE: %+v %v", s, err)
	}
	send(SetVringKick, 0)
	activated()
	if after := openFDs(t); after > before+2 {
		t.Errorf("%d descriptors open before replacing ring descriptors 205 times, %d after", before, after)
	}
}

// TestSealedMemoryServes checks the other side of the seal requirement: a
// front-end with sealed memory in two adjacent regions (guest and front-end
// addresses touching, not overlapping) gets its rings started, and its memfd
// can no longer be shrunk under the back-end.
func TestSealedMemoryServes(t *testing.T) {
	b := startTestBackend(t)
	f := b.dial(t)
	f.negotiate()
	half := int64(memSize / 2)
	fd := memfd(t, half)
	f.acked(SetMemTable, memTable(memRegion{GPA: 0, Size: uint64(half), UserAddr: memUser},
		memRegion{GPA: uint64(half), Size: uint64(half), UserAddr: memUser + uint64(half)}), fd, memfd(t, half))
	f.startRings(true)
	select {
	case <-b.dev.activated:
	case <-time.After(5 * time.Second):
		t.Fatalf("device not activated; log:\n%s", entries(b.hook))
	}
	if err := unix.Ftruncate(fd, 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("shrinking the sealed memfd: %v, want EPERM", err)
	}
	if _, proto, _ := b.Stats(); proto != 0 {
		t.Errorf("%d protocol errors; log:\n%s", proto, entries(b.hook))
	}
}
