package vhufront

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/vhostuser"
	"github.com/microvm/microvm/vsock"
)

// startDgramBackend is startBackend with datagrams on (dgram) or off, wired
// as microvm vhost-user-vsock wires them (rings mapped by negotiated
// features).
func startDgramBackend(t *testing.T, dgram bool) *backend {
	t.Helper()
	dir, err := os.MkdirTemp("", "vhu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := &backend{sock: filepath.Join(dir, "vhu.sock"), uds: filepath.Join(dir, "v.sock")}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	b.dev, err = vsock.New(vsock.Config{CID: 3, QueueSize: virtio.MaxQueueSize, Dialer: vsock.UDSDialer{Path: b.uds},
		Log: log, Dgram: dgram, DgramUDS: b.uds})
	if err != nil {
		t.Fatal(err)
	}
	be, err := vhostuser.Listen(b.sock, vhostuser.Config{Device: b.dev, Rings: b.dev.BackendQueues, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- be.Serve() }()
	t.Cleanup(func() {
		be.Close()
		<-served
		b.dev.Close()
	})
	return b
}

// Datagrams both ways through a vhost-user back-end, with the ring map the
// CLI uses: guest->host counted by a host socket, host->guest by the
// guest, and the stream path still working beside them.
func TestDgramThroughBackend(t *testing.T) {
	for _, mode := range []Mode{ModeEvent, ModePoll} {
		t.Run(string(mode), func(t *testing.T) {
			b := startDgramBackend(t, true)
			g := startGuest(t, b, Config{Dgram: true, Mode: mode})
			if !g.DgramEnabled() || g.Features()&FeatureDgram == 0 {
				t.Fatalf("datagrams not negotiated (features %#x)", g.Features())
			}
			sink, err := ListenHostDgram(vsock.DgramHostPath(b.uds, 6000), 64)
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			sent, err := g.DgramSource(1234, 6000, 64, 20*time.Millisecond)
			if err != nil || sent == 0 {
				t.Fatalf("DgramSource: %d sent, %v", sent, err)
			}
			deadline := time.Now().Add(testTimeout)
			for {
				n, bad := sink.Count()
				st := b.dev.Stats()
				if bad != 0 {
					t.Fatalf("%d datagrams of the wrong size", bad)
				}
				if n+st.DgramTxDropped == sent {
					t.Logf("g2h: %d sent, %d received, %d dropped", sent, n, st.DgramTxDropped)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("g2h: %d sent, %d received, stats %+v", sent, n, st)
				}
				time.Sleep(time.Millisecond)
			}

			hsent := make(chan uint64, 1)
			go func() {
				n, err := HostDgramSource(b.dev.DgramPath(), 1234, 6000, 4096, 100*time.Millisecond)
				if err != nil {
					t.Error(err)
				}
				hsent <- n
			}()
			// A second of quiet before the sink gives up: on a loaded
			// host the device's worker can lag the sender by far more
			// than the 100 ms it sends for, and what is still in flight
			// would read as neither received nor dropped.
			got, err := g.DgramSink(4096, time.Now().Add(100*time.Millisecond), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			n := <-hsent
			st := b.dev.Stats()
			if got+st.DgramRxDropped != n || got == 0 {
				t.Errorf("h2g: host sent %d, guest got %d, device dropped %d", n, got, st.DgramRxDropped)
			}
			t.Logf("h2g: %d sent, %d received, %d dropped", n, got, st.DgramRxDropped)
		})
	}
}

// A back-end without datagrams does not offer the feature; the generator
// says so instead of failing, and streams work as before.
func TestDgramNotOffered(t *testing.T) {
	b := startDgramBackend(t, false)
	g := startGuest(t, b, Config{Dgram: true})
	if g.DgramEnabled() {
		t.Fatal("datagrams negotiated with a back-end that does not offer them")
	}
	if _, err := g.DgramSource(1, 2, 64, time.Millisecond); !errors.Is(err, ErrNoDgram) {
		t.Errorf("DgramSource: %v; want ErrNoDgram", err)
	}
}

// A datagram back-end serves a front-end that does not ask for datagrams
// with two rings, as QEMU drives it.
func TestDgramBackendPlainFrontEnd(t *testing.T) {
	b := startDgramBackend(t, true)
	g := startGuest(t, b, Config{})
	if g.DgramEnabled() {
		t.Fatal("datagrams negotiated without being asked for")
	}
	sinkPort := uint32(5001)
	ln, err := ListenUnix(b.uds + "_5001")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := AcceptOne(ln, testTimeout)
		if err == nil {
			_, err = HostSink(c, 4096, testTimeout)
			c.Close()
		}
		errc <- err
	}()
	if _, err := g.Source(sinkPort, 4096, 10*time.Millisecond, time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
