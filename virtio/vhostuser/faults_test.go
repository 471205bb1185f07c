package vhostuser

// The vhost-user rows of the fault matrix (docs/fault-matrix.md): the real
// vsock device behind the back-end, driven by vsocktest's guest driver over
// a sealed memfd that an in-process front-end hands over as QEMU does.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

const (
	faultMemSize = 8 << 20
	faultWait    = 10 * time.Second
)

// vhuTransport is a vsocktest.Transport that plays QEMU: each activation is
// a new front-end connection with a fresh sealed memfd as guest memory,
// SET_MEM_TABLE, and the rx and tx rings set up and started with REPLY_ACK;
// the guest's own eventfds are the kicks. QEMU keeps the event queue.
type vhuTransport struct {
	t     *testing.T
	b     *Backend
	f     *frontEnd // the current front-end, nil between sessions
	memfd int       // the current session's memory
}

// newMemory is the Guest's NewMemory hook: a sealed memfd, mapped here as
// the guest's view (the back-end maps it again from SET_MEM_TABLE).
func (tr *vhuTransport) newMemory(tb testing.TB) *virtiotest.Memory {
	tr.memfd = memfd(tr.t, faultMemSize)
	m, err := guestmem.MapFiles(guestmem.FileRegion{GPA: 0, Size: faultMemSize, UserAddr: memUser, FD: tr.memfd})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return virtiotest.MemoryFrom(m)
}

func (tr *vhuTransport) Activate(g *vsocktest.Guest, a virtio.Activation) ([]*eventfd.EventFD, error) {
	t := tr.t
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: tr.b.Path(), Net: "unix"})
	if err != nil {
		return nil, err
	}
	f := &frontEnd{t: t, c: c}
	tr.f = f
	f.msg(SetOwner, nil)
	if feat, _ := decodeU64(f.call(GetFeatures, nil)); a.Features&^feat != 0 {
		return nil, fmt.Errorf("the back-end offers %#x; the guest wants %#x", feat, a.Features)
	}
	f.msg(SetFeatures, u64(a.Features|FeatureProtocolFeatures))
	f.call(GetProtocolFeatures, nil)
	f.msg(SetProtocolFeatures, u64(ProtocolReplyAck))
	f.acked(SetMemTable, memTable(memRegion{GPA: 0, Size: faultMemSize, UserAddr: memUser}), tr.memfd)
	for i, q := range a.Queues[:2] {
		cfg := q.Config()
		ring := uint32(i)
		addr := make([]byte, 40)
		vringAddr{Index: ring, Desc: memUser + cfg.Desc, Used: memUser + cfg.Used, Avail: memUser + cfg.Avail}.put(addr)
		f.acked(SetVringNum, state(ring, uint32(cfg.Size)))
		f.acked(SetVringBase, state(ring, 0))
		f.acked(SetVringAddr, addr)
		f.acked(SetVringKick, u64(uint64(ring)), q.Kick.FD())
		f.acked(SetVringCall, u64(uint64(ring)), newEventFD(t))
		f.acked(SetVringEnable, state(ring, 1)) // the last one starts the device
	}
	return nil, nil
}

// Reset is QEMU stopping the device cleanly: GET_VRING_BASE, then a
// disconnect.
func (tr *vhuTransport) Reset(*vsocktest.Guest) {
	if tr.f == nil {
		return
	}
	tr.f.call(GetVringBase, state(0, 0))
	tr.vanish()
}

// vanish drops the front-end's connection without a word, as a killed QEMU
// does, and waits for the back-end to let go of it.
func (tr *vhuTransport) vanish() {
	tr.t.Helper()
	tr.f.c.Close()
	tr.f = nil
	deadline := time.Now().Add(faultWait)
	for {
		tr.b.mu.Lock()
		idle := tr.b.cur == nil
		tr.b.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			tr.t.Fatal("the back-end still serves a front-end that vanished")
		}
		time.Sleep(time.Millisecond)
	}
}

// put encodes a vring address message (flags and log address 0).
func (a vringAddr) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], a.Index)
	binary.LittleEndian.PutUint64(b[8:], a.Desc)
	binary.LittleEndian.PutUint64(b[16:], a.Used)
	binary.LittleEndian.PutUint64(b[24:], a.Avail)
}

// busyPeer keeps a host end writing and reading until it is closed under
// it; wait reports whether that happened within faultWait.
func busyPeer(h net.Conn) (wait func() bool) {
	var wg sync.WaitGroup
	wg.Go(func() {
		b := vsocktest.Pattern(1, 64<<10)
		_ = h.SetWriteDeadline(time.Now().Add(faultWait))
		for {
			if _, err := h.Write(b); err != nil {
				return
			}
		}
	})
	wg.Go(func() { _ = vsocktest.WaitEOF(h, faultWait) })
	return func() bool {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
			return true
		case <-time.After(faultWait):
			return false
		}
	}
}

// transfer moves g2h and h2g over c and its host end h at the same time and
// checks both, calling during (if not nil) on each poll.
func transfer(t *testing.T, g *vsocktest.Guest, c *vsocktest.Conn, h net.Conn, g2h, h2g []byte, during func()) {
	t.Helper()
	got := make(chan []byte, 1)
	go func() {
		b, _ := vsocktest.ReadFull(h, len(g2h), faultWait)
		got <- b
	}()
	go func() {
		_ = h.SetWriteDeadline(time.Now().Add(faultWait))
		_, _ = h.Write(h2g)
	}()
	sent := 0
	var rcvd []byte
	g.WaitFor("a transfer both ways", func() bool {
		if during != nil {
			during()
		}
		sent += c.TryWrite(g2h[sent:])
		rcvd = append(rcvd, c.Consume(c.Buffered())...)
		if c.Rst {
			t.Fatalf("connection reset during the transfer")
		}
		return sent == len(g2h) && len(rcvd) >= len(h2g)
	})
	vsocktest.CheckEqual(t, "host->guest", rcvd, h2g)
	vsocktest.CheckEqual(t, "guest->host", <-got, g2h)
}

// Rows "vhost-user front-end vanishes and comes back" and "memfd shrunk
// under the back-end", with the real vsock device: a front-end whose guest
// has connections from both sides busy both ways disappears without a
// message (its socket closed, as when QEMU is killed). The back-end resets
// the device, every host socket is closed, and the back-end waits for the
// next front-end, which gets a working device on new memory. While that
// one's guest transfers data, the front-end tries to shrink the memfd it
// handed over: the seal refuses it (EPERM), so the back-end can never touch
// memory that is gone, and the transfer completes intact. TestQEMURestart
// (conformance/) does the first row with QEMU and Linux, killed with
// SIGKILL.
func TestFaultFrontEndVanishes(t *testing.T) {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	log.SetLevel(logrus.WarnLevel)
	dial := vsocktest.NewDialer(t)
	dev, err := vsock.New(vsock.Config{CID: vsocktest.DefaultCID, Log: log, Dialer: dial, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dev.Close)
	dir, err := os.MkdirTemp("", "vhf") // short: sun_path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := Listen(filepath.Join(dir, "s"), Config{Device: dev, Rings: dev.BackendQueues, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- b.Serve() }()
	t.Cleanup(func() {
		b.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	tr := &vhuTransport{t: t, b: b}
	g := vsocktest.New(t, dev, vsocktest.Options{NoEventQueue: true, EventIdx: true,
		Transport: tr, NewMemory: tr.newMemory, Timeout: faultWait})

	var conns []*vsocktest.Conn
	var waits []func() bool
	for i := uint32(0); i < 2; i++ {
		c, err := g.Connect(100+i, 2000+i)
		if err != nil {
			t.Fatal(err)
		}
		h := dial.Accept(faultWait)
		h2, err := vsocktest.HostConnect(t, dev, 3000+i, nil, time.Now().Add(faultWait))
		if err != nil {
			t.Fatal(err)
		}
		c2 := g.Accept(3000 + i)
		if _, err := vsocktest.ReadOK(h2, faultWait); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c, c2)
		waits = append(waits, busyPeer(h), busyPeer(h2))
	}
	out := vsocktest.Pattern(2, 32<<10)
	g.WaitFor("traffic both ways", func() bool {
		for _, c := range conns {
			c.TryWrite(out)
			c.Consume(c.Buffered())
		}
		s := dev.Stats()
		return s.TxBytes > 512<<10 && s.RxBytes > 512<<10
	})
	tr.vanish()
	g.Detach()
	for i, w := range waits {
		if !w() {
			t.Fatalf("host end %d still open after the front-end vanished", i)
		}
	}
	if s := dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open after the front-end vanished", s.ConnsOpen)
	}

	g.Activate() // the next front-end, new memory
	c, err := g.Connect(100, 2000)
	if err != nil {
		t.Fatal(err)
	}
	h := dial.Accept(faultWait)
	shrunk := false
	transfer(t, g, c, h, vsocktest.Pattern(3, 1<<20), vsocktest.Pattern(4, 1<<20), func() {
		if !shrunk && dev.Stats().RxBytes > 1<<20 {
			shrunk = true
			if err := unix.Ftruncate(tr.memfd, 0); !errors.Is(err, unix.EPERM) {
				t.Errorf("shrinking the memfd under the back-end: %v, want EPERM", err)
			}
		}
	})
	if !shrunk {
		t.Error("the transfer ended before the memfd could be shrunk")
	}
	served1, proto, guest := b.Stats()
	if served1 != 2 || proto != 0 || guest != 0 {
		t.Errorf("back-end: %d front-ends served, %d protocol errors, %d guest errors; want 2, 0, 0", served1, proto, guest)
	}
	g.Reset()
	h.Close()
}
