package vsock_test

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// busyHost keeps a host end writing and reading until the device closes
// it; the returned function waits for both to stop.
func busyHost(h net.Conn, seed uint64) (wait func() bool) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		b := vsocktest.Pattern(seed, 64<<10)
		_ = h.SetWriteDeadline(time.Now().Add(waitTimeout))
		for {
			if _, err := h.Write(b); err != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		_ = vsocktest.WaitEOF(h, waitTimeout)
	}()
	return func() bool {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
			return true
		case <-time.After(waitTimeout):
			return false
		}
	}
}

// A host-side transport reset while data flows both ways on connections
// opened from either side: every host socket is closed, the guest gets one
// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (id 0, 4 bytes) and resets its
// established connections, a guest connection still being dialled gets an
// RST, and new connections work at once on the same activation.
func TestTransportReset(t *testing.T) {
	for _, l := range guestLayouts[:2] {
		t.Run(l.name, func(t *testing.T) {
			// The held dial must outlive the whole test.
			e := newEnv(t, envOpts{guest: l.o, cfg: vsock.Config{ConnectTimeout: time.Minute}})
			fds := openFDs(t)
			var conns []*vsocktest.Conn
			var waits []func() bool
			var hosts []net.Conn
			for i := uint32(0); i < 2; i++ {
				c, h := e.connectGuest(100+i, 2000+i)
				c2, h2 := e.connectHost(3000+i, nil)
				conns = append(conns, c, c2)
				hosts = append(hosts, h, h2)
				waits = append(waits, busyHost(h, uint64(i)), busyHost(h2, uint64(10+i)))
			}
			release := make(chan struct{})
			var once sync.Once
			releaseDial := func() { once.Do(func() { close(release) }) }
			defer releaseDial()
			const slowPort = 200
			e.dial.Script = func(port uint32) vsocktest.DialAction {
				if port == slowPort {
					return vsocktest.DialAction{Wait: release}
				}
				return vsocktest.DialAction{}
			}
			dialing := e.g.Dial(slowPort, 2100)
			out := vsocktest.Pattern(2, 32<<10)
			e.g.WaitFor("traffic both ways", func() bool {
				for _, c := range conns {
					c.TryWrite(out)
					c.Consume(c.Buffered())
				}
				s := e.dev.Stats()
				return s.TxBytes > 256<<10 && s.RxBytes > 256<<10
			})
			before := e.dev.Stats()
			if err := e.dev.ResetTransport(); err != nil {
				t.Fatal(err)
			}
			e.g.WaitFor("the TRANSPORT_RESET event and the RST of the dial", func() bool {
				return e.g.TransportResets() > 0 && dialing.Rst
			})
			if ev := e.g.Events(); len(ev) != 1 || ev[0] != (vsocktest.Event{ID: vsock.EventTransportReset, Len: vsock.EventSize}) {
				t.Errorf("events %+v; want one {ID 0 Len 4}", ev)
			}
			for i, c := range conns {
				if !c.TransportReset {
					t.Errorf("connection %d (%d<->%d) not reset by the event", i, c.HostPort, c.GuestPort)
				}
			}
			for i, w := range waits {
				if !w() {
					t.Fatalf("host end %d still open after the transport reset", i)
				}
				hostClosed(t, hosts[i])
			}
			s := e.dev.Stats()
			if s.ConnsOpen != 0 || s.TransportResets != 1 || s.EventsSent != 1 || s.BufferGranted != 0 {
				t.Errorf("stats after the reset: %d open, %d resets, %d events, %d bytes granted; want 0, 1, 1, 0",
					s.ConnsOpen, s.TransportResets, s.EventsSent, s.BufferGranted)
			}
			if s.RstSent == before.RstSent {
				t.Error("no RST for the connection being dialled")
			}
			// The same activation serves new connections both ways (on
			// new ports, as a Linux guest's autobind picks: an RST for a
			// dropped connection may still be in the RX ring).
			c, h := e.connectGuest(100, 2010)
			e.transfer(c, h, vsocktest.Pattern(3, 300<<10), vsocktest.Pattern(4, 300<<10))
			c2, h2 := e.connectHost(3010, nil)
			e.transfer(c2, h2, vsocktest.Pattern(5, 300<<10), vsocktest.Pattern(6, 300<<10))
			// The dial released now finds its connection gone and
			// closes what it got.
			releaseDial()
			h3 := e.dial.Accept(waitTimeout)
			hostClosed(t, h3)
			h3.Close()
			for _, h := range hosts {
				h.Close()
			}
			h.Close()
			h2.Close()
			c.Reset()
			c2.Reset()
			e.g.Sync()
			waitFDs(t, fds)
		})
	}
}

// Resets while the driver has no event buffer posted wait for one and make
// a single event; the next reset finds the buffer given back.
func TestTransportResetWaitsForEventBuffer(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{EventBuffers: -1, EventIdx: true}})
	c, h := e.connectGuest(100, 2000)
	for range 2 {
		if err := e.dev.ResetTransport(); err != nil {
			t.Fatal(err)
		}
	}
	hostClosed(t, h)
	e.g.Quiet(quietFor, "an event without an event buffer", func() bool { return len(e.g.Events()) > 0 })
	if c.TransportReset {
		t.Fatal("connection reset without an event")
	}
	e.g.PostEvents(2, vsock.EventSize)
	e.g.WaitFor("the event", func() bool { return e.g.TransportResets() == 1 })
	e.g.Quiet(quietFor, "a second event for resets made while waiting", func() bool { return len(e.g.Events()) > 1 })
	if !c.TransportReset {
		t.Error("the connection survived the event")
	}
	if s := e.dev.Stats(); s.TransportResets != 2 || s.EventsSent != 1 {
		t.Errorf("%d resets, %d events; want 2 and 1", s.TransportResets, s.EventsSent)
	}
	if err := e.dev.ResetTransport(); err != nil {
		t.Fatal(err)
	}
	e.g.WaitFor("the second event", func() bool { return e.g.TransportResets() == 2 })
}

// Without an event queue (vhost-user, where the front-end keeps it) the
// guest gets an RST for each connection instead.
func TestTransportResetWithoutEventQueue(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{NoEventQueue: true}})
	c, h := e.connectGuest(100, 2000)
	c2, h2 := e.connectHost(3000, nil)
	if err := e.dev.ResetTransport(); err != nil {
		t.Fatal(err)
	}
	c.WaitRst()
	c2.WaitRst()
	hostClosed(t, h)
	hostClosed(t, h2)
	if s := e.dev.Stats(); s.ConnsOpen != 0 || s.EventsSent != 0 || s.TransportResets != 1 {
		t.Errorf("stats %+v: want no connection, no event, one reset", s)
	}
	c3, h3 := e.connectGuest(100, 2001)
	e.transfer(c3, h3, vsocktest.Pattern(1, 10<<10), vsocktest.Pattern(2, 10<<10))
}

// ResetTransport needs a driver using the device.
func TestTransportResetInactive(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.g.Reset()
	if err := e.dev.ResetTransport(); !errors.Is(err, vsock.ErrNotActive) {
		t.Errorf("ResetTransport after a device reset: %v; want ErrNotActive", err)
	}
	e.g.Activate()
	if err := e.dev.ResetTransport(); err != nil {
		t.Errorf("ResetTransport on an active device: %v", err)
	}
	e.g.WaitFor("the event", func() bool { return e.g.TransportResets() == 1 })
	e.g.Reset()
	e.dev.Close()
	if err := e.dev.ResetTransport(); !errors.Is(err, vsock.ErrNotActive) {
		t.Errorf("ResetTransport after Close: %v; want ErrNotActive", err)
	}
}

// An event buffer too small for an event is a broken queue: the device
// fails instead of writing past it.
func TestTransportResetShortEventBuffer(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{EventBuffers: -1}})
	e.allowFail = true
	e.g.PostEvents(1, vsock.EventSize-1)
	if err := e.dev.ResetTransport(); err != nil {
		t.Fatal(err)
	}
	if err := e.g.WaitFail(); err == nil {
		t.Fatal("no failure")
	}
	if len(e.g.Events()) != 0 {
		t.Errorf("events %+v in a 3-byte buffer", e.g.Events())
	}
}

// Regression: a transport reset dropped an established connection whose
// RESPONSE the guest had not received yet without an RST, and a Linux
// driver resets only connected sockets on the event: the guest's connect()
// waited for an answer that never came. Here the RESPONSE cannot go out
// (no RX buffer) when the reset comes.
func TestRegressionTransportResetBeforeResponse(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{RxBuffers: -1}})
	c := e.g.Dial(5000, 1025)
	h := e.dial.Accept(waitTimeout)
	e.g.Sync()
	if err := e.dev.ResetTransport(); err != nil {
		t.Fatal(err)
	}
	hostClosed(t, h)
	e.g.PostRX(16)
	e.g.WaitFor("RST or RESPONSE for the dropped connection", func() bool { return c.Rst || c.Established })
	if c.Established && !c.Rst {
		t.Error("the guest got RESPONSE for a connection the device dropped")
	}
	e.g.WaitFor("the event", func() bool { return e.g.TransportResets() == 1 })
}

// Transport resets fired from another goroutine every few milliseconds
// while the guest opens connections and sends data: every connection
// attempt is answered (RESPONSE, RST or the event), nothing deadlocks, and
// the budget is all given back.
func TestTransportResetStress(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{EventIdx: true}})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			_ = e.dev.ResetTransport()
		}
	}()
	out := vsocktest.Pattern(1, 8<<10)
	port := uint32(10000)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); port++ {
		c := e.g.Dial(100, port)
		e.g.WaitFor("an answer to the REQUEST", func() bool { return c.Established || c.Rst })
		if c.Established && !c.Rst && !c.TransportReset {
			e.dial.Accept(waitTimeout) // held by the dialer, closed at the end
			c.TryWrite(out)
			e.g.Within(2*time.Millisecond, func() bool { return c.Rst || c.TransportReset })
		}
		if !c.Rst && !c.TransportReset {
			c.Reset()
		} else {
			c.Forget()
		}
		e.g.TakePending()
	}
	close(stop)
	<-done
	e.g.WaitFor("every connection to close", func() bool { e.g.TakePending(); return e.dev.Stats().ConnsOpen == 0 })
	s := e.dev.Stats()
	t.Logf("%d connection attempts, %d transport resets, %d events", port-10000, s.TransportResets, s.EventsSent)
	if s.BufferGranted != 0 {
		t.Errorf("%d bytes of budget granted with no connection open", s.BufferGranted)
	}
}

// Until the guest has handled the event (it posts an event buffer again),
// no connection is set up: a guest REQUEST is held in the TX ring and a
// host connect waits; both complete once the guest has acted on the event,
// so neither is reset by it. A guest that never handles it holds them up
// for the connect timeout at most, after which the undelivered event is
// dropped.
func TestTransportResetFence(t *testing.T) {
	t.Run("handled", func(t *testing.T) {
		log, hook := logtest.NewNullLogger()
		e := newEnv(t, envOpts{cfg: vsock.Config{Log: log}, guest: vsocktest.Options{EventBuffers: -1}})
		if err := e.dev.ResetTransport(); err != nil {
			t.Fatal(err)
		}
		c := e.g.Dial(100, 2000)
		hostDone := make(chan error, 1)
		var h net.Conn
		go func() {
			var err error
			h, err = vsocktest.HostConnect(t, e.dev, 3000, nil, time.Now().Add(waitTimeout))
			hostDone <- err
		}()
		e.g.Quiet(100*time.Millisecond, "a connection set up before the guest handled the event", func() bool {
			return c.Established || c.Rst || len(e.g.Pending()) > 0 || e.dial.Dials.Load() > 0
		})
		e.g.PostEvents(1, vsock.EventSize)
		e.g.WaitFor("the event, then the held REQUEST's answer", func() bool {
			return e.g.TransportResets() == 1 && (c.Established || c.Rst)
		})
		if c.Rst || c.TransportReset {
			t.Fatalf("the REQUEST held by the fence was reset (RST %v, by the event %v)", c.Rst, c.TransportReset)
		}
		hh := e.dial.Accept(waitTimeout)
		e.transfer(c, hh, vsocktest.Pattern(1, 64<<10), vsocktest.Pattern(2, 64<<10))
		c2 := e.g.Accept(3000)
		if err := <-hostDone; err != nil {
			t.Fatalf("host connect held by the fence: %v", err)
		}
		if _, err := vsocktest.ReadOK(h, waitTimeout); err != nil {
			t.Fatal(err)
		}
		e.transfer(c2, h, vsocktest.Pattern(3, 64<<10), vsocktest.Pattern(4, 64<<10))
		// The guest's repost lifted the fence, not the timeout.
		for _, en := range hook.AllEntries() {
			if en.Level <= logrus.WarnLevel {
				t.Errorf("device logged %q", en.Message)
			}
		}
	})
	t.Run("never handled", func(t *testing.T) {
		const timeout = 300 * time.Millisecond
		e := newEnv(t, envOpts{cfg: vsock.Config{ConnectTimeout: timeout}, guest: vsocktest.Options{EventBuffers: -1}})
		if err := e.dev.ResetTransport(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c := e.g.Dial(100, 2000)
		e.g.WaitFor("the held REQUEST's answer", func() bool { return c.Established || c.Rst })
		if d := time.Since(start); c.Rst || d < timeout/2 {
			t.Errorf("REQUEST answered after %v (RST %v); want RESPONSE after about %v", d, c.Rst, timeout)
		}
		e.dial.Accept(waitTimeout)
		e.g.PostEvents(1, vsock.EventSize)
		e.g.Quiet(100*time.Millisecond, "the dropped event delivered late", func() bool { return len(e.g.Events()) > 0 })
		if s := e.dev.Stats(); s.EventsSent != 0 || s.TransportResets != 1 {
			t.Errorf("%d events sent, %d resets; want 0 and 1", s.EventsSent, s.TransportResets)
		}
	})
}
