package usernet_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/microvm/microvm/devices/virtionet/usernet"
	"github.com/microvm/microvm/devices/virtionet/usernet/netpolicy"
)

// hostListener is a TCP listener on the host's loopback that counts the
// connections it accepts.
type hostListener struct {
	port     uint16
	accepted atomic.Int64
}

func newHostListener(t *testing.T) *hostListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	h := &hostListener{port: uint16(l.Addr().(*net.TCPAddr).Port)}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			c.Close()
		}
	}()
	return h
}

// wantRefusedTCP: the guest's connection to ip:port is answered with an
// RST (refused at once, not timed out).
func wantRefusedTCP(t *testing.T, g *testGuest, ip string, port uint16) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := g.g.Dial(ctx, ip, port)
	if err == nil {
		c.Close()
		t.Fatalf("guest dial %s:%d: connected, want a refusal", ip, port)
	}
	if ctx.Err() != nil {
		t.Fatalf("guest dial %s:%d: no answer in %v (%v), want an RST", ip, port, time.Since(start), err)
	}
}

// TestHostLoopbackNeedsOptIn: without HostLoopback, the guest's
// connections to the host's loopback through usernet.HostIP get an RST
// and never reach the host's listener; with it they do, egress none
// notwithstanding. (Loopback and this-network destinations sent straight
// to the gateway are netpolicy's TestDecide: the test guest's stack does
// not route them out of its NIC.)
func TestHostLoopbackNeedsOptIn(t *testing.T) {
	h := newHostListener(t)
	n := newNetwork(t)
	g := newTestGuest(t, n)
	wantRefusedTCP(t, g, usernet.HostIP, h.port)
	if got := n.Stats().Refused; got != 1 {
		t.Errorf("Stats().Refused = %d, want the refusals counted", got)
	}

	on := newNetworkWith(t, usernet.Config{HostLoopback: true, Egress: netpolicy.Egress{Restrict: true}})
	g = newTestGuest(t, on)
	g.dial(t, usernet.HostIP, h.port).Close()
	time.Sleep(100 * time.Millisecond)
	if got := h.accepted.Load(); got != 1 {
		t.Fatalf("the host's listener accepted %d connections, want 1 (through %s with host-loopback)", got, usernet.HostIP)
	}
}

// TestHostLoopbackUDP: without HostLoopback a guest's datagram to
// usernet.HostIP is dropped before any host socket sends it.
func TestHostLoopbackUDP(t *testing.T) {
	echo, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	var got atomic.Int64
	go func() {
		b := make([]byte, 2048)
		for {
			k, a, err := echo.ReadFrom(b)
			if err != nil {
				return
			}
			got.Add(1)
			echo.WriteTo(b[:k], a)
		}
	}()
	n := newNetwork(t)
	g := newTestGuest(t, n)
	c := g.udp(t, 0, usernet.HostIP, uint16(echo.LocalAddr().(*net.UDPAddr).Port))
	for range 3 {
		if _, err := c.Write([]byte("to the host")); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	if k, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatalf("the guest got %d bytes back from the host's loopback, want its datagrams dropped", k)
	}
	if got.Load() != 0 {
		t.Fatalf("the host's echo server got %d datagrams, want none", got.Load())
	}
	if n.Stats().Refused == 0 {
		t.Error("Stats().Refused = 0, want the dropped flow counted")
	}
}

// TestEgressRefusals: link-local (cloud metadata), the network's own
// range and, under egress none or a list, everything not listed: each
// answered with an RST, refused before any host socket is opened (so
// nothing leaves this machine), and counted.
func TestEgressRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		egress string
		dst    string
	}{
		{"metadata", "", "169.254.169.254"},
		{"link-local", "", "169.254.10.10"},
		{"the gateway's other ports", "", usernet.GatewayIP},
		{"another address in the subnet", "", "192.168.127.77"},
		{"none", "none", "198.51.100.1"},
		{"not in the list", "192.0.2.0/24:443", "198.51.100.1"},
		{"wrong port", "198.51.100.0/24:443", "198.51.100.1"},
		{"public is not the LAN", "public", "10.11.12.13"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := netpolicy.ParseEgress(tc.egress)
			if err != nil {
				t.Fatal(err)
			}
			n := newNetworkWith(t, usernet.Config{Egress: e})
			g := newTestGuest(t, n)
			wantRefusedTCP(t, g, tc.dst, 80)
			if got := n.Stats().Refused; got != 1 {
				t.Errorf("Stats().Refused = %d, want 1", got)
			}
		})
	}
}

func ExampleConfig_egress() {
	// What a CI runner might give its jobs: the Internet on HTTPS and
	// SSH, and one LAN host (a GitLab instance), nothing else.
	e, err := netpolicy.ParseEgress("public:443+public:22+192.168.10.5/32:443")
	if err != nil {
		panic(err)
	}
	_ = usernet.Config{Egress: e}
	fmt.Println(e)
	// Output: public:443+public:22+192.168.10.5/32:443
}
