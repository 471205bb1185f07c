package usernet

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/containers/gvisor-tap-vsock/pkg/services/dhcp"
	"github.com/containers/gvisor-tap-vsock/pkg/services/forwarder"
	"github.com/containers/gvisor-tap-vsock/pkg/tap"
	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"github.com/inetaf/tcpproxy"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// The stack is assembled here from gvisor-tap-vsock's parts, as its
// virtualnetwork.New does, rather than by virtualnetwork.New itself:
// that one installs TCP and UDP forwarders that dial whatever the guest
// asks for, and keeps the stack out of reach, so no policy could be put
// in front of them.

// nic is the stack's one NIC, its end of the virtual switch.
const nic = 1

// newStack builds the stack and the switch in front of it, with DHCP and
// DNS served on GatewayIP and the guest's TCP and UDP going to
// n.forwardTCP and n.forwardUDP; it fills in n.stack, n.sw and n.ports.
func (n *Network) newStack(mac net.HardwareAddr) error {
	_, subnet, err := net.ParseCIDR(Subnet)
	if err != nil {
		return err
	}
	conf := &types.Configuration{MTU: MTU, Subnet: Subnet, GatewayIP: GatewayIP, GatewayMacAddress: gatewayMAC}
	pool := tap.NewIPPool(subnet)
	pool.Reserve(net.ParseIP(GatewayIP), gatewayMAC)
	pool.Reserve(net.ParseIP(GuestIP), mac.String())

	// HostIP is a "virtual IP" of the gateway: the link answers ARP for
	// it, so the guest sends to it, and the forwarder maps it to the
	// host's loopback when the policy allows.
	link, err := tap.NewLinkEndpoint(false, MTU, gatewayMAC, GatewayIP, []string{HostIP})
	if err != nil {
		return err
	}
	sw := tap.NewSwitch(false)
	link.Connect(sw)
	sw.Connect(link)

	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	if err := s.CreateNIC(nic, link); err != nil {
		return errors.New(err.String())
	}
	if err := s.AddProtocolAddress(nic, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: addr(GatewayIP).WithPrefix(),
	}, stack.AddressProperties{}); err != nil {
		return errors.New(err.String())
	}
	// Spoofing and promiscuous: the stack takes the guest's packets for
	// any address, so each connection reaches the forwarders below.
	s.SetSpoofing(nic, true)
	s.SetPromiscuousMode(nic, true)
	sn, err := tcpip.NewSubnet(tcpip.AddrFromSlice(subnet.IP), tcpip.MaskFromBytes(subnet.Mask))
	if err != nil {
		return err
	}
	s.SetRouteTable([]tcpip.Route{{Destination: sn, NIC: nic}})

	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tcp.NewForwarder(s, 0, 10, n.forwardTCP).HandlePacket)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, udp.NewForwarder(s, n.forwardUDP).HandlePacket)

	if err := serveDNS(s, n.policy.Egress.LooksUpNames()); err != nil {
		s.Close()
		return err
	}
	ds, err := dhcp.New(conf, s, pool)
	if err != nil {
		s.Close()
		return err
	}
	go func() { _ = ds.Serve() }()
	n.stack, n.sw, n.ports = s, sw, forwarder.NewPortsForwarder(s)
	return nil
}

func addr(ip string) tcpip.Address { return tcpip.AddrFrom4Slice(net.ParseIP(ip).To4()) }

// dialTarget asks the policy about a guest connection to ip:port: the
// host address to dial, or the refusal, which is counted and logged.
func (n *Network) dialTarget(proto string, ip tcpip.Address, port uint16) (string, bool) {
	a, _ := netip.AddrFromSlice(ip.AsSlice())
	to, err := n.policy.Decide(netip.AddrPortFrom(a, port))
	if err != nil {
		n.refused.Add(1)
		// The first refusal is a warning, as it is most likely a guest
		// that expected to get through; the rest are debug lines, since
		// a guest can make them as fast as it sends packets.
		if n.warned.CompareAndSwap(false, true) {
			n.log.Warnf("usernet: guest %s %s (further refusals are debug messages)", proto, err)
		} else {
			n.log.Debugf("usernet: guest %s %s", proto, err)
		}
		return "", false
	}
	return to.String(), true
}

// forwardTCP runs on a goroutine of its own per connection the guest
// opens (gVisor's forwarder starts it): it dials the host address first,
// so that a refusal, by the policy or by the far end, answers the guest's
// SYN with an RST, then copies both ways until either side closes.
func (n *Network) forwardTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	to, ok := n.dialTarget("tcp", id.LocalAddress, id.LocalPort)
	if !ok {
		r.Complete(true)
		return
	}
	out, err := net.Dial("tcp", to)
	if err != nil {
		n.log.Debugf("usernet: dial tcp %s: %v", to, err)
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, tcpErr := r.CreateEndpoint(&wq)
	r.Complete(false)
	if tcpErr != nil {
		out.Close()
		n.log.Debugf("usernet: tcp to %s: %v", to, tcpErr)
		return
	}
	p := tcpproxy.DialProxy{DialContext: func(context.Context, string, string) (net.Conn, error) { return out, nil }}
	p.HandleConn(gonet.NewTCPConn(&wq, ep))
}

// forwardUDP runs on the stack's goroutine for a flow's first datagram:
// a refused flow's datagrams are dropped (this runs again for the next),
// an allowed one gets a proxy goroutine and a host socket until it has
// been idle for forwarder.UDPConnTrackTimeout.
func (n *Network) forwardUDP(r *udp.ForwarderRequest) {
	id := r.ID()
	to, ok := n.dialTarget("udp", id.LocalAddress, id.LocalPort)
	if !ok {
		return
	}
	var wq waiter.Queue
	ep, tcpErr := r.CreateEndpoint(&wq)
	if tcpErr != nil {
		n.log.Debugf("usernet: udp to %s: %v", to, tcpErr)
		return
	}
	p, err := forwarder.NewUDPProxy(idleUDP{gonet.NewUDPConn(&wq, ep)}, func() (net.Conn, error) { return net.Dial("udp", to) })
	if err != nil { // none today; a nil proxy would panic its goroutine
		ep.Close()
		n.log.Debugf("usernet: udp to %s: %v", to, err)
		return
	}
	go func() {
		p.Run()
		ep.Close()
	}()
}

// idleUDP ends a UDP flow's proxy once the guest's side has been quiet
// for forwarder.UDPConnTrackTimeout (gvisor-tap-vsock's own listener for
// this is unexported).
type idleUDP struct{ *gonet.UDPConn }

func (c idleUDP) ReadFrom(b []byte) (int, net.Addr, error) {
	_ = c.SetReadDeadline(time.Now().Add(forwarder.UDPConnTrackTimeout))
	return c.UDPConn.ReadFrom(b)
}

func (c idleUDP) WriteTo(b []byte, a net.Addr) (int, error) {
	_ = c.SetReadDeadline(time.Now().Add(forwarder.UDPConnTrackTimeout))
	return c.UDPConn.WriteTo(b, a)
}
