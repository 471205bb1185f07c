package vsock_test

import (
	"bytes"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// sessionWorkers counts the goroutines running a session's workers (the
// tests of this package do not run in parallel).
func sessionWorkers() int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, w := range []string{"vsock.(*session).txLoop", "vsock.(*session).rxLoop", "vsock.(*session).dgramLoop"} {
			if strings.Contains(g, w) {
				n++
				break
			}
		}
	}
	return n
}

// quiesced checks what a quiesce leaves: the rings' positions final, no
// worker running, no connection open, the stopped session's budget back
// to zero.
func quiesced(t *testing.T, e *env, budget func() uint64) {
	t.Helper()
	if err := e.g.Drained(); err != nil {
		t.Fatalf("after Quiesce: %v", err)
	}
	if n := sessionWorkers(); n != 0 {
		t.Errorf("%d session workers still run after Quiesce", n)
	}
	if s := e.dev.Stats(); s.ConnsOpen != 0 || s.BufferGranted != 0 {
		t.Errorf("after Quiesce: %d connections open, %d bytes granted; want none", s.ConnsOpen, s.BufferGranted)
	}
	if b := budget(); b != 0 {
		t.Errorf("the quiesced session still has %d bytes of budget in use", b)
	}
}

// hostConnectAsync starts a host-initiated connection to guest port port on
// its own goroutine; the channel gets ConnectFromHost's result.
func hostConnectAsync(t *testing.T, dev *vsock.Device, port uint32) (*net.UnixConn, <-chan error) {
	t.Helper()
	fd, h := vsocktest.Socketpair(t)
	t.Cleanup(func() { h.Close() })
	done := make(chan error, 1)
	go func() { done <- dev.ConnectFromHost(fd, port, nil, time.Now().Add(waitTimeout)) }()
	return h, done
}

// notWithin fails the test if ch delivers within quietFor. The guest is
// not polled meanwhile.
func notWithin[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s (%v)", what, v)
	case <-time.After(quietFor):
	}
}

// recv waits for ch, polling the guest meanwhile.
func recv[T any](e *env, ch <-chan T, what string) T {
	e.tb.Helper()
	var v T
	e.g.WaitFor(what, func() bool {
		select {
		case v = <-ch:
			return true
		default:
			return false
		}
	})
	return v
}

// A quiesce with connections open both ways and data in flight both ways
// (the host not reading what the guest sent, the guest not reading what
// the host sent) leaves every ring drained, no worker, no connection, every
// host socket closed. Resumed on the same rings, the guest gets exactly
// one TRANSPORT_RESET, which resets its connections; a guest connection
// and a host connection started before the guest handled the event wait
// for it (the fence), then succeed; new connections both ways carry data.
func TestQuiesceResume(t *testing.T) {
	for _, l := range guestLayouts[:5] {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: l.o})
			c1, h1 := e.connectGuest(100, 2000)
			// Counted once the process has made a host socket: the
			// runtime's poller opens descriptors of its own then.
			fds := openFDs(t)
			c2, h2 := e.connectHost(3000, nil)
			// Guest to host: more than the host reads (it reads nothing).
			e.stallGuest(c1, vsocktest.Pattern(1, 4<<20))
			// Host to guest: more than the guest reads.
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := vsocktest.Pattern(2, 64<<10)
				_ = h2.SetWriteDeadline(time.Now().Add(waitTimeout))
				for {
					if _, err := h2.Write(b); err != nil {
						return
					}
				}
			}()
			e.g.WaitFor("the guest's buffer full", func() bool { return c2.GuestCredit() == 0 })
			// And packets the device may or may not have taken yet.
			c2.TryWrite(vsocktest.Pattern(3, 8<<10))
			budget := e.dev.SessionBudget()
			if budget() == 0 {
				t.Fatal("no budget in use before the quiesce")
			}

			e.g.Quiesce()
			quiesced(t, e, budget)
			wg.Wait() // the writer ends when the device closes h2
			hostClosed(t, h1)
			hostClosed(t, h2)
			if err := e.dev.ResetTransport(); !errors.Is(err, vsock.ErrNotActive) {
				t.Errorf("ResetTransport while quiesced: %v; want ErrNotActive", err)
			}

			// Before the guest handles the event: a host connect (from
			// the pause on) and a guest REQUEST both wait.
			sentBefore := e.dev.Stats().EventsSent
			dials := e.dial.Dials.Load()
			h3, connected := hostConnectAsync(t, e.dev, 4000)
			e.g.Resume()
			c4 := e.g.Dial(5000, 2100)
			notWithin(t, connected, "ConnectFromHost returned before the guest handled the event")
			if n := e.dial.Dials.Load(); n != dials {
				t.Fatalf("the guest's REQUEST was dialled before it handled the event")
			}
			var reqAfterEvent []bool
			e.g.Observe = func(p vsocktest.Packet) {
				if p.Hdr.Op == vsock.OpRequest {
					reqAfterEvent = append(reqAfterEvent, e.g.TransportResets() > 0)
				}
			}
			e.g.WaitFor("the event", func() bool { return e.g.TransportResets() > 0 })
			if ev := e.g.Events(); len(ev) != 1 || ev[0] != (vsocktest.Event{ID: vsock.EventTransportReset, Len: vsock.EventSize}) {
				t.Errorf("events %+v; want one {ID 0 Len 4}", ev)
			}
			if !c1.TransportReset || !c2.TransportReset {
				t.Errorf("connections reset by the event: guest-initiated %v, host-initiated %v; want both",
					c1.TransportReset, c2.TransportReset)
			}
			c3 := e.g.Accept(4000)
			if err := recv(e, connected, "ConnectFromHost"); err != nil {
				t.Fatalf("ConnectFromHost: %v", err)
			}
			if port, err := vsocktest.ReadOK(h3, waitTimeout); err != nil || port != c3.HostPort {
				t.Fatalf("OK line: port %d, %v; want %d", port, err, c3.HostPort)
			}
			// The new session does not start its host ports over: the
			// guest may still be closing the reset connection's.
			if c3.HostPort == c2.HostPort {
				t.Errorf("the new session's host connection has port %d, as the reset one", c3.HostPort)
			}
			if len(reqAfterEvent) != 1 || !reqAfterEvent[0] {
				t.Errorf("the host connection's REQUEST came before the guest handled the event (%v)", reqAfterEvent)
			}
			e.g.Observe = nil
			e.g.WaitFor("RESPONSE for the guest's REQUEST", func() bool { return c4.Established || c4.Rst })
			if !c4.Established {
				t.Fatal("the guest connection made before the event was reset")
			}
			h4 := e.dial.Accept(waitTimeout)
			e.transfer(c4, h4, vsocktest.Pattern(4, 200<<10), vsocktest.Pattern(5, 200<<10))
			e.transfer(c3, h3, vsocktest.Pattern(6, 200<<10), vsocktest.Pattern(7, 200<<10))
			c5, h5 := e.connectGuest(100, 2001)
			e.transfer(c5, h5, vsocktest.Pattern(8, 100<<10), vsocktest.Pattern(9, 100<<10))
			e.g.Quiet(quietFor, "a second event", func() bool { return len(e.g.Events()) > 1 })
			if s := e.dev.Stats(); s.EventsSent != sentBefore+1 || s.TransportResets != 0 {
				t.Errorf("%d events sent, %d transport resets counted; want %d, 0", s.EventsSent, s.TransportResets, sentBefore+1)
			}
			for _, h := range []net.Conn{h1, h2, h3, h4, h5} {
				h.Close()
			}
			for _, c := range []*vsocktest.Conn{c3, c4, c5} {
				c.Reset()
			}
			e.g.Sync()
			waitFDs(t, fds)
		})
	}
}

// RX buffers a host read popped and left empty are the ring's most recent
// pops: a quiesce puts them back (none is returned empty, which the guest
// would reject), and the next session fills them.
func TestQuiescePutsBackRX(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, h := e.connectGuest(100, 2000)
	msg := []byte("short")
	hostWrite(t, h, msg)
	if got := c.Read(len(msg)); !bytes.Equal(got, msg) {
		t.Fatalf("guest read %q", got)
	}
	if _, spare, _ := e.dev.ProbeRX(); spare == 0 {
		t.Fatal("no RX buffer on the spare list: the test needs a short read's leftovers")
	}
	e.g.Quiesce()
	if err := e.g.Drained(); err != nil {
		t.Fatal(err)
	}
	e.g.Resume()
	e.g.WaitFor("the event", func() bool { return e.g.TransportResets() == 1 })
	c2, h2 := e.connectGuest(100, 2001)
	e.transfer(c2, h2, vsocktest.Pattern(1, 100<<10), vsocktest.Pattern(2, 300<<10))
	if out, spare, _ := e.dev.ProbeRX(); out != spare {
		t.Errorf("%d RX buffers out, %d spare", out, spare)
	}
}

// A spare RX buffer older than one another producer popped and returned
// while its read was out (a hole) cannot be put back: the quiesce returns
// it empty, and the positions are final all the same. The guest (like
// Linux) drops empty buffers and posts them again.
func TestQuiesceReturnsHolesEmpty(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{RxBuffers: 8}})
	e.g.AcceptEmptyRX = true
	b, bh := e.connectGuest(5000, 6000)
	e.g.Sync()
	e.g.AutoRepost = false

	popped := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	vsock.SetRxReadHook(t, func(txWorker bool) {
		if !txWorker {
			return
		}
		once.Do(func() {
			close(popped)
			<-release
		})
	})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	// The guest accepts a host connection: the TX worker reads its
	// (empty) socket into every RX buffer left, held in the hook.
	e.connectHost(7000, nil)
	select {
	case <-popped:
	case <-time.After(waitTimeout):
		t.Fatal("the TX worker never read the accepted connection's socket")
	}
	out, _, _ := e.dev.ProbeRX()
	// Meanwhile the RX worker puts host data for b into a buffer posted
	// after those: a newer pop, returned.
	e.g.PostRX(1)
	data := []byte("data")
	hostWrite(t, bh, data)
	if got := b.Read(len(data)); !bytes.Equal(got, data) {
		t.Fatalf("guest read %q", got)
	}
	released = true
	close(release)
	deadline := time.Now().Add(waitTimeout)
	for {
		o, spare, _ := e.dev.ProbeRX()
		if o == out && spare == out {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d RX buffers out, %d spare; want %d and %d", o, spare, out, out)
		}
		time.Sleep(time.Millisecond)
	}

	e.g.Quiesce()
	if err := e.g.Drained(); err != nil {
		t.Fatal(err)
	}
	e.g.AutoRepost = true
	e.g.Resume()
	e.g.WaitFor("the empty RX buffers and the event", func() bool {
		return e.g.EmptyRX() == out && e.g.TransportResets() == 1
	})
	c, h := e.connectGuest(5000, 6001)
	e.transfer(c, h, vsocktest.Pattern(1, 100<<10), vsocktest.Pattern(2, 100<<10))
}

// A quiesce while a transport reset's fence is up: the REQUEST the TX
// worker holds (and the packet behind it) go back into the ring and are
// handled by the next session once the guest handled its event; a host
// connect waiting at the old session's fence keeps its socket and connects
// in the next session.
func TestQuiesceDuringFence(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{EventBuffers: -1}})
	if err := e.dev.ResetTransport(); err != nil {
		t.Fatal(err)
	}
	h3, connected := hostConnectAsync(t, e.dev, 4000)
	c := e.g.Dial(5000, 2100)
	c2 := e.g.Dial(5001, 2101)
	dials := e.dial.Dials.Load()
	notWithin(t, connected, "ConnectFromHost returned while the fence is up")
	if e.dial.Dials.Load() != dials {
		t.Fatal("a REQUEST was dialled while the fence is up")
	}
	budget := e.dev.SessionBudget()
	e.g.Quiesce()
	quiesced(t, e, budget)
	select {
	case err := <-connected:
		t.Fatalf("ConnectFromHost ended with the quiesce: %v", err)
	default:
	}
	e.g.Resume()
	notWithin(t, connected, "ConnectFromHost returned before the guest had an event buffer")
	e.g.PostEvents(2, vsock.EventSize)
	e.g.WaitFor("the event", func() bool { return e.g.TransportResets() == 1 })
	e.g.WaitFor("RESPONSEs", func() bool { return (c.Established || c.Rst) && (c2.Established || c2.Rst) })
	if !c.Established || !c2.Established {
		t.Fatalf("held REQUESTs answered with RST (%v, %v)", c.Rst, c2.Rst)
	}
	c3 := e.g.Accept(4000)
	if err := recv(e, connected, "ConnectFromHost"); err != nil {
		t.Fatalf("ConnectFromHost: %v", err)
	}
	if port, err := vsocktest.ReadOK(h3, waitTimeout); err != nil || port != c3.HostPort {
		t.Fatalf("OK line: port %d, %v; want %d", port, err, c3.HostPort)
	}
	h, h2 := e.dial.Accept(waitTimeout), e.dial.Accept(waitTimeout)
	if h.Port != 5000 {
		h, h2 = h2, h
	}
	if h.Port != 5000 || h2.Port != 5001 {
		t.Fatalf("dialled ports %d, %d; want 5000, 5001", h.Port, h2.Port)
	}
	e.transfer(c, h, vsocktest.Pattern(1, 50<<10), vsocktest.Pattern(2, 50<<10))
	e.transfer(c3, h3, vsocktest.Pattern(3, 50<<10), vsocktest.Pattern(4, 50<<10))
	if ev := e.g.Events(); len(ev) != 1 {
		t.Errorf("events %+v; want one: the reset before the pause and the pause make one", ev)
	}
}

// Datagrams in flight both ways when the device quiesces: their queues
// are drained too, and datagrams flow in the next session.
func TestQuiesceDgram(t *testing.T) {
	e, uds := dgramEnv(t, vsocktest.Options{})
	l := hostDgramListener(t, uds, 7000)
	snd := hostDgramSender(t, e.dev)
	for i := range 32 {
		e.g.SendDgram(1000, 7000, vsocktest.Pattern(uint64(i), 1000))
		if _, err := snd.Write(withPrefix(1000, 7000, vsocktest.Pattern(uint64(i), 1000))); err != nil {
			t.Fatal(err)
		}
	}
	budget := e.dev.SessionBudget()
	e.g.Quiesce()
	quiesced(t, e, budget)
	e.g.Resume()
	// The host socket's queue may be full of the datagrams from before
	// (then the device drops new ones): send until one arrives.
	want := withPrefix(1000, 7000, []byte("after"))
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(waitTimeout); ; {
		if time.Now().After(deadline) {
			t.Fatal("no datagram from the guest after the resume")
		}
		e.g.SendDgram(1000, 7000, []byte("after"))
		e.g.SyncDgram()
		_ = l.SetReadDeadline(time.Now().Add(quietFor))
		got := false
		for {
			n, _, err := l.ReadFrom(buf)
			if err != nil {
				break
			}
			got = got || bytes.Equal(buf[:n], want)
		}
		if got {
			break
		}
	}
	if _, err := snd.Write(withPrefix(1000, 7000, []byte("back"))); err != nil {
		t.Fatal(err)
	}
	e.g.WaitFor("the datagram", func() bool {
		for _, p := range e.g.Dgrams() {
			if string(p.Data) == "back" {
				return true
			}
		}
		return false
	})
}

// A device reset after a quiesce drops the event it owed: the driver that
// starts again has no connection to be told about.
func TestQuiesceThenReset(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.connectGuest(100, 2000)
	e.g.Quiesce()
	e.g.Quiesce() // nothing runs: nothing to do
	e.g.Reset()
	e.g.Activate()
	c, h := e.connectGuest(100, 2001)
	e.transfer(c, h, []byte("x"), []byte("y"))
	if ev := e.g.Events(); len(ev) != 0 {
		t.Errorf("events %+v after a device reset; want none", ev)
	}
}

// RestoreDeviceState on a fresh device: its first session starts with the
// event, with or without a saved state; states that are not the device's
// are refused with ErrBadState and change nothing.
func TestRestoreDeviceState(t *testing.T) {
	for _, st := range []string{"", "null", `{"TransportReset":true}`, `{"TransportReset": false}`} {
		t.Run("state="+st, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			e.g.Reset()
			if err := e.dev.RestoreDeviceState([]byte(st)); err != nil {
				t.Fatal(err)
			}
			saved, err := e.dev.SaveDeviceState()
			if err != nil || string(saved) != `{"TransportReset":true}` {
				t.Errorf("state after restore: %s, %v", saved, err)
			}
			e.g.Activate()
			e.g.WaitFor("the event", func() bool { return e.g.TransportResets() == 1 })
			c, h := e.connectGuest(100, 2000)
			e.transfer(c, h, []byte("x"), []byte("y"))
			if ev := e.g.Events(); len(ev) != 1 {
				t.Errorf("events %+v; want one", ev)
			}
		})
	}
	for _, st := range []string{
		`{}`, `[]`, `true`, `"x"`, `{"TransportReset":1}`, `{"TransportReset":"true"}`, `{"TransportReset":null}`,
		`{"transportreset":true}`, `{"TransportReset":true,"CID":3}`, `{"TransportReset":true} {}`, `{"TransportReset":tru`,
	} {
		t.Run("bad="+st, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			e.g.Reset()
			if err := e.dev.RestoreDeviceState([]byte(st)); !errors.Is(err, virtio.ErrBadState) {
				t.Fatalf("RestoreDeviceState(%s): %v; want ErrBadState", st, err)
			}
			if saved, _ := e.dev.SaveDeviceState(); string(saved) != `{"TransportReset":false}` {
				t.Errorf("state after a refused restore: %s", saved)
			}
			e.g.Activate()
			c, h := e.connectGuest(100, 2000)
			e.transfer(c, h, []byte("x"), []byte("y"))
			if ev := e.g.Events(); len(ev) != 0 {
				t.Errorf("events %+v after a refused restore; want none", ev)
			}
		})
	}
	e := newEnv(t, envOpts{})
	if err := e.dev.RestoreDeviceState(nil); !errors.Is(err, virtio.ErrInUse) {
		t.Errorf("RestoreDeviceState on an active device: %v; want ErrInUse", err)
	}
}

// The device under the virtio-mmio transport, as a VMM pauses and
// snapshots it: MMIO.Quiesce with connections open and data in flight, a
// saved state with every queue drained and the device's own state, and
// MMIO.Resume delivering the event; then a second pause restored into a
// new device and a new transport over the same guest memory (a new
// process), whose first session delivers the event again.
func TestQuiesceMMIO(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{EventIdx: true}})
	e.g.Reset()
	tr := newMMIOTransport(t, e, 16<<20)
	e.g.Opts.Transport = tr
	e.g.Opts.NewMemory = func(testing.TB) *virtiotest.Memory { return tr.mem }
	e.g.Activate()

	c1, h1 := e.connectGuest(100, 2000)
	c2, h2 := e.connectHost(3000, nil)
	e.stallGuest(c1, vsocktest.Pattern(1, 4<<20))
	hostWrite(t, h2, vsocktest.Pattern(2, 100<<10))
	e.g.WaitFor("host data", func() bool { return c2.Buffered() > 0 })

	save := func(m *virtio.MMIO) virtio.MMIOState {
		t.Helper()
		if err := m.Quiesce(); err != nil {
			t.Fatalf("Quiesce: %v", err)
		}
		st, err := m.SaveState()
		if err != nil {
			t.Fatalf("SaveState: %v", err)
		}
		if string(st.Device) != `{"TransportReset":true}` {
			t.Errorf("device state %s", st.Device)
		}
		for i, q := range st.Queues {
			if !q.Ready || q.NextAvail != q.UsedIdx {
				t.Errorf("queue %d saved %+v: want ready, drained", i, q)
			}
		}
		if n := sessionWorkers(); n != 0 {
			t.Errorf("%d session workers still run after Quiesce", n)
		}
		return st
	}
	save(tr.m)
	hostClosed(t, h1)
	hostClosed(t, h2)
	if err := tr.m.Resume(); err != nil {
		t.Fatal(err)
	}
	e.g.WaitFor("the event", func() bool { return e.g.TransportResets() == 1 })
	if !c1.TransportReset || !c2.TransportReset {
		t.Error("connections not reset by the event")
	}
	c3, h3 := e.connectGuest(100, 2001)
	e.transfer(c3, h3, vsocktest.Pattern(3, 100<<10), vsocktest.Pattern(4, 100<<10))

	// A new process: a new device (a clone's CID may differ; here it
	// does not), a new transport over the same memory, the saved state.
	st := save(tr.m)
	hostClosed(t, h3)
	dev2, err := vsock.New(vsock.Config{CID: vsocktest.DefaultCID, Dialer: e.dial, Log: quietLog(), ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dev2.Close)
	tr2 := &mmioTransport{tb: t, mem: tr.mem}
	if tr2.m, err = virtio.NewMMIO(dev2, tr.mem.Memory, func() {}, quietLog()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr2.m.Close() })
	e.dev.Close()
	if err := tr2.m.RestoreState(st); err != nil {
		t.Fatalf("RestoreState: %v", err)
	}
	e.g.Opts.Transport, e.g.Dev, e.dev = tr2, dev2, dev2
	k := tr2.m.KickFDs()
	e.g.RXKick, e.g.TXKick, e.g.EventKick = k[vsock.QueueRX], k[vsock.QueueTX], k[vsock.QueueEvent]
	e.g.WaitFor("the event after the restore", func() bool { return e.g.TransportResets() == 2 })
	if !c3.TransportReset {
		t.Error("connection not reset by the event after the restore")
	}
	c4, h4 := e.connectGuest(100, 2002)
	e.transfer(c4, h4, vsocktest.Pattern(5, 100<<10), vsocktest.Pattern(6, 100<<10))
	c5, h5 := e.connectHost(3001, nil)
	e.transfer(c5, h5, vsocktest.Pattern(7, 100<<10), vsocktest.Pattern(8, 100<<10))
	if ev := e.g.Events(); len(ev) != 2 {
		t.Errorf("events %+v; want two", ev)
	}
}
