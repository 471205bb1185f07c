package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// A restored clone's own MAC address (SetMAC). Its virtio-net device
// reports the address the host gave the clone, but Linux's driver read
// the original's at probe and keeps it: the host asks the agent to move
// the interface to the new one.
//
//	SetMAC(old, mac)
//	-> the interface whose address is old (net.Interfaces)
//	-> RTM_SETLINK with IFLA_ADDRESS over rtnetlink (setLinkAddr);
//	   virtio-net changes its address while up
//	-> one gratuitous ARP request per IPv4 address of the interface,
//	   broadcast on an AF_PACKET socket (announce), as QEMU's announce
//	   after a migration: a bridge learns the new address's port and
//	   neighbours update their ARP entries at once.
//
// An interface that already has mac (a call repeated after an answer was
// lost) is announced again and reported as if moved.

// SetMAC implements agentapi.AgentServer.
func (s *Server) SetMAC(_ context.Context, req *agentapi.SetMACRequest) (*agentapi.SetMACResponse, error) {
	old, mac := net.HardwareAddr(req.GetOld()), net.HardwareAddr(req.GetMac())
	switch {
	case len(old) != 6:
		return nil, status.Errorf(codes.InvalidArgument, "agent: set MAC: old address %v: want 6 bytes", old)
	case len(mac) != 6 || mac[0]&1 != 0:
		return nil, status.Errorf(codes.InvalidArgument, "agent: set MAC: %v: want a 6-byte unicast address", mac)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "agent: set MAC: %v", err)
	}
	ifc := findByAddr(ifs, old)
	if ifc == nil {
		ifc = findByAddr(ifs, mac) // moved already
	}
	if ifc == nil {
		return nil, status.Errorf(codes.NotFound, "agent: set MAC: no interface has address %v", old)
	}
	if !bytes.Equal(ifc.HardwareAddr, mac) {
		if err := setLinkAddr(ifc.Index, mac); err != nil {
			return nil, status.Errorf(codes.Internal, "agent: set MAC of %s to %v: %v", ifc.Name, mac, err)
		}
	}
	n, err := announce(ifc, mac)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "agent: %s: announce %v: %v", ifc.Name, mac, err)
	}
	s.logf("agent: %s: MAC %v -> %v, %d IPv4 addresses announced", ifc.Name, old, mac, n)
	return &agentapi.SetMACResponse{Interface: ifc.Name, Announced: uint32(n)}, nil
}

func findByAddr(ifs []net.Interface, a net.HardwareAddr) *net.Interface {
	for i := range ifs {
		if bytes.Equal(ifs[i].HardwareAddr, a) {
			return &ifs[i]
		}
	}
	return nil
}

// setLinkAddr sets interface index's hardware address with an RTM_SETLINK
// request and waits for the kernel's acknowledgement.
func setLinkAddr(index int, mac net.HardwareAddr) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("rtnetlink socket: %w", err)
	}
	defer unix.Close(fd)
	kernel := &unix.SockaddrNetlink{Family: unix.AF_NETLINK}
	if err := unix.Sendto(fd, setLinkAddrMsg(index, mac), 0, kernel); err != nil {
		return fmt.Errorf("RTM_SETLINK: %w", err)
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("RTM_SETLINK: read the answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("RTM_SETLINK: the answer: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq != setLinkSeq {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("RTM_SETLINK: a short acknowledgement")
			}
			if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
				return fmt.Errorf("RTM_SETLINK: %w", unix.Errno(-e))
			}
			return nil
		}
	}
}

// setLinkSeq is the sequence number of setLinkAddr's request.
const setLinkSeq = 1

// setLinkAddrMsg is an RTM_SETLINK request (struct nlmsghdr, struct
// ifinfomsg, one IFLA_ADDRESS attribute; the kernel's layouts, in host
// byte order) asking for an acknowledgement.
func setLinkAddrMsg(index int, mac net.HardwareAddr) []byte {
	const attrLen = unix.SizeofRtAttr + 6
	size := unix.SizeofNlMsghdr + unix.SizeofIfInfomsg + (attrLen+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1)
	b := make([]byte, size)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(size))
	ne.PutUint16(b[4:], unix.RTM_SETLINK)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(b[8:], setLinkSeq)
	ifi := b[unix.SizeofNlMsghdr:]
	ifi[0] = unix.AF_UNSPEC
	ne.PutUint32(ifi[4:], uint32(int32(index)))
	attr := ifi[unix.SizeofIfInfomsg:]
	ne.PutUint16(attr[0:], attrLen)
	ne.PutUint16(attr[2:], unix.IFLA_ADDRESS)
	copy(attr[unix.SizeofRtAttr:], mac)
	return b
}

// announce broadcasts a gratuitous ARP request for each IPv4 address of
// ifc, from mac, and returns how many it sent. An interface that is down
// (or has no IPv4 address) announces nothing.
func announce(ifc *net.Interface, mac net.HardwareAddr) (int, error) {
	addrs, err := ifc.Addrs()
	if err != nil {
		return 0, err
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			ips = append(ips, n.IP.To4())
		}
	}
	if len(ips) == 0 || ifc.Flags&net.FlagUp == 0 {
		return 0, nil
	}
	proto := htons(unix.ETH_P_ARP)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return 0, fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifc.Index, Halen: 6,
		Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
	sent := 0
	for _, ip := range ips {
		if err := unix.Sendto(fd, gratuitousARP(mac, ip), 0, to); err != nil {
			if err == unix.ENETDOWN {
				break
			}
			return sent, fmt.Errorf("gratuitous ARP for %v: %w", ip, err)
		}
		sent++
	}
	return sent, nil
}

// gratuitousARP is an ARP request (RFC 826) for ip from ip at mac: the
// sender and target protocol addresses are both ip, the target hardware
// address zeros (RFC 5227, 3: an ARP announcement).
func gratuitousARP(mac net.HardwareAddr, ip net.IP) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)      // hardware type: Ethernet
	binary.BigEndian.PutUint16(b[2:], 0x0800) // protocol type: IPv4
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], 1) // request
	copy(b[8:], mac)
	copy(b[14:], ip.To4())
	copy(b[24:], ip.To4())
	return b
}

// htons is v in network byte order, as the packet socket's protocol
// fields take it, on this little-endian (x86-64) guest.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
