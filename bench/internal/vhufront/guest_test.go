package vhufront

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/vhostuser"
	"github.com/microvm/microvm/vsock"
)

const testTimeout = 10 * time.Second

// backend is microvm's vhost-user-vsock back-end, in this process: the
// device, its host socket and the vhost-user server, as the command wires
// them.
type backend struct {
	sock, uds string
	dev       *vsock.Device
}

func startBackend(t testing.TB, opts vsock.Options) *backend {
	t.Helper()
	dir, err := os.MkdirTemp("", "vhu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := &backend{sock: filepath.Join(dir, "vhu.sock"), uds: filepath.Join(dir, "v.sock")}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	b.dev, err = vsock.New(vsock.Config{CID: 3, QueueSize: virtio.MaxQueueSize, Options: &opts,
		Dialer: vsock.UDSDialer{Path: b.uds}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	hs, err := vsock.ListenUDS(b.uds, b.dev, 2*time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve()
	be, err := vhostuser.Listen(b.sock, vhostuser.Config{Device: b.dev, Queues: 2, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- be.Serve() }()
	t.Cleanup(func() {
		be.Close()
		<-served
		hs.Close()
		b.dev.Close()
	})
	return b
}

func startGuest(t testing.TB, b *backend, cfg Config) *Guest {
	t.Helper()
	if cfg.CID == 0 {
		cfg.CID = 3
	}
	g, err := Start(b.sock, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return g
}

// hostSide runs f on its own goroutine and returns its error.
func hostSide(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func waitHost(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("host side: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("host side did not finish")
	}
}

// TestStreams moves data both ways in every mode and layout through the
// in-process back-end: host->guest (CONNECT handshake, the guest sinks),
// guest->host (the guest connects to <uds>_<port>), ping-pong both ways;
// every byte is checked against the pattern and the counts must agree.
func TestStreams(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		opts vsock.Options
	}{
		{"event", Config{}, vsock.DefaultOptions},
		{"event turn-publish", Config{Publish: PublishTurn}, vsock.DefaultOptions},
		{"poll", Config{Mode: ModePoll}, vsock.DefaultOptions},
		{"no-event-idx one-region", Config{NoEventIdx: true, Regions: 1}, vsock.DefaultOptions},
		{"small-ring big-rx-buffers all-off", Config{QueueSize: 16, RXBufSize: 65536, BufAlloc: 32 << 10}, vsock.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBackend(t, tc.opts)
			g := startGuest(t, b, tc.cfg)
			if g.Features()&FeatureEventIdx != 0 == tc.cfg.NoEventIdx {
				t.Errorf("features %#x with NoEventIdx %v", g.Features(), tc.cfg.NoEventIdx)
			}
			for i, payload := range []int{1, 64, 4096, 65536} {
				dur := 30 * time.Millisecond
				deadline := time.Now().Add(testTimeout)
				// host -> guest
				var sent Transfer
				h := hostSide(func() error {
					c, _, err := DialVsock(b.uds, 5000, testTimeout)
					if err != nil {
						return err
					}
					defer c.Close()
					sent, err = HostSource(c, payload, dur, testTimeout)
					return err
				})
				got, err := g.Sink(5000, deadline)
				if err != nil {
					t.Fatalf("h2g %d: %v", payload, err)
				}
				waitHost(t, h)
				if got.Bytes != sent.Bytes || got.Bytes == 0 {
					t.Errorf("h2g %d: guest received %d bytes, host sent %d", payload, got.Bytes, sent.Bytes)
				}
				// guest -> host
				port := uint32(6000 + i)
				l, err := ListenUnix(fmt.Sprintf("%s_%d", b.uds, port))
				if err != nil {
					t.Fatal(err)
				}
				var recv Transfer
				h = hostSide(func() error {
					c, err := AcceptOne(l, testTimeout)
					if err != nil {
						return err
					}
					defer c.Close()
					recv, err = HostSink(c, 65536, testTimeout)
					return err
				})
				out, err := g.Source(port, payload, dur, deadline)
				if err != nil {
					t.Fatalf("g2h %d: %v", payload, err)
				}
				waitHost(t, h)
				if out.Bytes != recv.Bytes || out.Bytes == 0 || out.Msgs == 0 {
					t.Errorf("g2h %d: guest sent %d bytes (%d messages), host received %d", payload, out.Bytes, out.Msgs, recv.Bytes)
				}
				// ping-pong, host first
				var rtts []int64
				h = hostSide(func() error {
					c, _, err := DialVsock(b.uds, 5001, testTimeout)
					if err != nil {
						return err
					}
					defer c.Close()
					rtts, err = HostPing(c, payload, dur, 50, testTimeout)
					return err
				})
				if err := g.Echo(5001, deadline); err != nil {
					t.Fatalf("h2g ping %d: %v", payload, err)
				}
				waitHost(t, h)
				if len(rtts) == 0 {
					t.Errorf("h2g ping %d: no round trips", payload)
				}
				// ping-pong, guest first
				l, err = ListenUnix(fmt.Sprintf("%s_%d", b.uds, port+100))
				if err != nil {
					t.Fatal(err)
				}
				h = hostSide(func() error {
					c, err := AcceptOne(l, testTimeout)
					if err != nil {
						return err
					}
					defer c.Close()
					return HostEcho(c, testTimeout)
				})
				grtts, err := g.Ping(port+100, payload, dur, 50, deadline)
				if err != nil {
					t.Fatalf("g2h ping %d: %v", payload, err)
				}
				waitHost(t, h)
				if len(grtts) == 0 {
					t.Errorf("g2h ping %d: no round trips", payload)
				}
			}
			if n := g.Conns(); n != 0 {
				t.Errorf("%d connections left in the guest's table", n)
			}
			s := g.Stats()
			ds := b.dev.Stats()
			if s.TxPackets != ds.TxPackets || s.TxBytes != ds.TxBytes {
				t.Errorf("guest sent %d packets, %d bytes; device received %d, %d", s.TxPackets, s.TxBytes, ds.TxPackets, ds.TxBytes)
			}
			if s.RxBytes != ds.RxBytes || s.RxPackets != ds.RxPackets {
				t.Errorf("guest received %d packets, %d bytes; device sent %d, %d", s.RxPackets, s.RxBytes, ds.RxPackets, ds.RxBytes)
			}
			if s.Kicks[QueueTX] == 0 {
				t.Errorf("no TX kicks: %+v", s)
			}
			if tc.cfg.Mode != ModePoll && s.Irqs[QueueRX] == 0 {
				t.Errorf("no RX interrupts in event mode: %+v", s)
			}
			if s.CreditReqs != 0 {
				t.Errorf("the guest had to ask for credit %d times", s.CreditReqs)
			}
			if ds.GuestErrors != 0 {
				t.Errorf("the device counted %d guest errors", ds.GuestErrors)
			}
		})
	}
}

// TestRefused: a guest connection to a port nobody listens on is reset, a
// clear error and no hang.
func TestRefused(t *testing.T) {
	b := startBackend(t, vsock.DefaultOptions)
	g := startGuest(t, b, Config{})
	_, err := g.Source(7777, 64, time.Millisecond, time.Now().Add(testTimeout))
	if err == nil || !strings.Contains(err.Error(), "reset by the device") {
		t.Fatalf("Source to a closed port: %v, want a reset", err)
	}
	// A host that never connects: Sink gives up at its deadline.
	start := time.Now()
	_, err = g.Sink(5000, time.Now().Add(100*time.Millisecond))
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("Sink with nobody connecting: %v after %v", err, time.Since(start))
	}
}

// TestWrongCID: the back-end's config space is checked.
func TestWrongCID(t *testing.T) {
	b := startBackend(t, vsock.DefaultOptions)
	_, err := Start(b.sock, Config{CID: 4})
	if err == nil || !strings.Contains(err.Error(), "guest CID is 3, not 4") {
		t.Fatalf("Start with CID 4: %v", err)
	}
}

// TestInterruptWakesTheDriver is the regression test for the event-mode
// driver polling its call eventfds without asking for POLLIN: every sleep
// then lasted its full 10 ms bound and each round trip took 10 ms while
// the interrupt counts looked normal. During a ping-pong the device's
// interrupts, not the bound, must end the sleeps.
func TestInterruptWakesTheDriver(t *testing.T) {
	b := startBackend(t, vsock.DefaultOptions)
	g := startGuest(t, b, Config{})
	l, err := ListenUnix(b.uds + "_7000")
	if err != nil {
		t.Fatal(err)
	}
	h := hostSide(func() error {
		c, err := AcceptOne(l, testTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		return HostEcho(c, testTimeout)
	})
	s0 := g.Stats()
	rtts, err := g.Ping(7000, 64, time.Minute, 50, time.Now().Add(testTimeout))
	if err != nil {
		t.Fatal(err)
	}
	waitHost(t, h)
	s := g.Stats()
	sleeps, timeouts := s.Sleeps-s0.Sleeps, s.SleepTimeouts-s0.SleepTimeouts
	if len(rtts) != 50 || sleeps == 0 || timeouts*2 > sleeps {
		t.Errorf("%d round trips; the driver slept %d times, %d of them until the timeout (RX irqs %d)",
			len(rtts), sleeps, timeouts, s.Irqs[QueueRX]-s0.Irqs[QueueRX])
	}
}

// TestDataWithTheRequest: host bytes that follow the CONNECT line reach
// the guest right behind the REQUEST, possibly in the same pass over the
// used ring (the driver publishes its RESPONSE at once). They must wait for
// the application to set OnData, not be dispatched to nobody. The accept
// callback is slow so that the device has delivered them before the driver
// looks at the ring again.
func TestDataWithTheRequest(t *testing.T) {
	b := startBackend(t, vsock.DefaultOptions)
	g := startGuest(t, b, Config{})
	want := PatternAt(0, 1000)
	h := hostSide(func() error {
		c, err := DialUnix(b.uds, testTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write(append([]byte("CONNECT 5000\n"), want...)); err != nil {
			return err
		}
		var ok [64]byte
		_, err = c.Read(ok[:])
		return err
	})
	var c *Conn
	g.Listen(5000, func(n *Conn) {
		time.Sleep(50 * time.Millisecond)
		c = n
	})
	deadline := time.Now().Add(testTimeout)
	if err := g.Run(deadline, nil, func() bool { return c != nil }); err != nil {
		t.Fatal(err)
	}
	var got []byte
	c.OnData = func(p []byte) { got = append(got, p...) }
	if err := g.Run(deadline, nil, func() bool { return len(got) >= len(want) }); err != nil {
		t.Fatalf("%v after %d of %d bytes", err, len(got), len(want))
	}
	if string(got) != string(want) {
		t.Errorf("got %d bytes that are not the %d sent", len(got), len(want))
	}
	waitHost(t, h)
}
