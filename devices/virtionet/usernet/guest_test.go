package usernet_test

import (
	"context"
	"net"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/microvm/microvm/devices/virtionet/usernet"
	"github.com/microvm/microvm/devices/virtionet/usernet/usernettest"
)

// testGuest wraps usernettest.Guest with the tests' failure handling.
type testGuest struct{ g *usernettest.Guest }

var testMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x2a}

func newTestGuest(t *testing.T, n *usernet.Network) *testGuest {
	t.Helper()
	g, err := usernettest.New(n, testMAC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return &testGuest{g}
}

func (g *testGuest) dial(t *testing.T, ip string, port uint16) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := g.g.Dial(ctx, ip, port)
	if err != nil {
		t.Fatalf("guest dial %s:%d: %v", ip, port, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (g *testGuest) listen(t *testing.T, port uint16) net.Listener {
	t.Helper()
	l, err := g.g.Listen(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func (g *testGuest) udp(t *testing.T, port uint16, rip string, rport uint16) *gonet.UDPConn {
	t.Helper()
	c, err := g.g.UDP(port, rip, rport)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
