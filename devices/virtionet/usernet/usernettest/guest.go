// Package usernettest is a guest for a usernet.Network without a VM: a
// second gVisor netstack on the device's end of the network's socketpair,
// where a VM's kernel would be behind virtio-net. The network's tests and
// bench/usernet use it. It takes usernet.GuestIP statically (DHCP is
// tested on raw frames) and routes everything through usernet.GatewayIP.
package usernettest

import (
	"context"
	"fmt"
	"net"

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

	"github.com/microvm/microvm/devices/virtionet/usernet"
)

// Guest is the guest's stack.
type Guest struct {
	s  *stack.Stack
	fd int
}

// New starts a guest stack with address mac on n's device end, which it
// takes (usernet.Network.TakeDeviceFD).
func New(n *usernet.Network, mac net.HardwareAddr) (*Guest, error) {
	fd, err := n.TakeDeviceFD()
	if err != nil {
		return nil, err
	}
	g, err := newGuest(fd, mac)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return g, nil
}

func newGuest(fd int, mac net.HardwareAddr) (*Guest, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	ep, err := fdbased.New(&fdbased.Options{
		FDs: []int{fd}, MTU: usernet.MTU, EthernetHeader: true, Address: tcpip.LinkAddress(mac),
		PacketDispatchMode: fdbased.Readv,
	})
	if err != nil {
		return nil, err
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if err := s.CreateNIC(1, ep); err != nil {
		return nil, fmt.Errorf("guest NIC: %s", err)
	}
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: Addr(usernet.GuestIP), PrefixLen: 24},
	}, stack.AddressProperties{}); err != nil {
		return nil, fmt.Errorf("guest address: %s", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: Addr(usernet.GatewayIP), NIC: 1}})
	return &Guest{s: s, fd: fd}, nil
}

// Close stops the stack and closes its descriptor.
func (g *Guest) Close() {
	g.s.Close()
	g.s.Wait()
	unix.Close(g.fd)
}

// Addr is ip as the stack spells an IPv4 address.
func Addr(ip string) tcpip.Address { return tcpip.AddrFrom4Slice(net.ParseIP(ip).To4()) }

// Dial opens a TCP connection from the guest to ip:port.
func (g *Guest) Dial(ctx context.Context, ip string, port uint16) (net.Conn, error) {
	return gonet.DialContextTCP(ctx, g.s, tcpip.FullAddress{NIC: 1, Addr: Addr(ip), Port: port}, ipv4.ProtocolNumber)
}

// Listen opens a TCP listener on the guest's port.
func (g *Guest) Listen(port uint16) (net.Listener, error) {
	return gonet.ListenTCP(g.s, tcpip.FullAddress{NIC: 1, Addr: Addr(usernet.GuestIP), Port: port}, ipv4.ProtocolNumber)
}

// UDP opens a UDP socket on the guest's port (0: any), connected to
// rip:rport unless rip is empty.
func (g *Guest) UDP(port uint16, rip string, rport uint16) (*gonet.UDPConn, error) {
	var raddr *tcpip.FullAddress
	if rip != "" {
		raddr = &tcpip.FullAddress{NIC: 1, Addr: Addr(rip), Port: rport}
	}
	return gonet.DialUDP(g.s, &tcpip.FullAddress{NIC: 1, Addr: Addr(usernet.GuestIP), Port: port}, raddr, ipv4.ProtocolNumber)
}
