package usernet

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// testGuest is the guest side of a Network in these tests: a second
// netstack on the device's end of the socketpair, where the VM's kernel
// would be behind virtio-net. It takes GuestIP statically (TestDHCP checks
// the lease separately) and routes everything through GatewayIP.
type testGuest struct {
	s *stack.Stack
}

var testMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x2a}

func newTestGuest(t *testing.T, n *Network) *testGuest {
	t.Helper()
	fd, err := n.TakeDeviceFD()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	ep, err := fdbased.New(&fdbased.Options{
		FDs: []int{fd}, MTU: MTU, EthernetHeader: true, Address: tcpip.LinkAddress(testMAC),
		PacketDispatchMode: fdbased.Readv,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if err := s.CreateNIC(1, ep); err != nil {
		t.Fatal(err)
	}
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: addr(GuestIP), PrefixLen: 24},
	}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: addr(GatewayIP), NIC: 1}})
	t.Cleanup(func() {
		s.Close()
		s.Wait()
		unix.Close(fd)
	})
	return &testGuest{s: s}
}

func addr(ip string) tcpip.Address { return tcpip.AddrFrom4Slice(net.ParseIP(ip).To4()) }

// dial opens a TCP connection from the guest.
func (g *testGuest) dial(t *testing.T, ip string, port uint16) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := gonet.DialContextTCP(ctx, g.s, tcpip.FullAddress{NIC: 1, Addr: addr(ip), Port: port}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatalf("guest dial %s:%d: %v", ip, port, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// listen opens a TCP listener in the guest on GuestIP:port.
func (g *testGuest) listen(t *testing.T, port uint16) net.Listener {
	t.Helper()
	l, err := gonet.ListenTCP(g.s, tcpip.FullAddress{NIC: 1, Addr: addr(GuestIP), Port: port}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// udp opens a UDP socket in the guest on GuestIP:port, connected to
// raddr when it is not empty.
func (g *testGuest) udp(t *testing.T, port uint16, rip string, rport uint16) *gonet.UDPConn {
	t.Helper()
	var raddr *tcpip.FullAddress
	if rip != "" {
		raddr = &tcpip.FullAddress{NIC: 1, Addr: addr(rip), Port: rport}
	}
	c, err := gonet.DialUDP(g.s, &tcpip.FullAddress{NIC: 1, Addr: addr(GuestIP), Port: port}, raddr, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
