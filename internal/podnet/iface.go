package podnet

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Interface is the pod's network interface as CNI configured it.
type Interface struct {
	Name    string           // in the pod's namespace: eth0 for CRI
	MAC     net.HardwareAddr // the guest takes it, so frames match what the node learnt
	Addr    net.IPNet        // the pod's IPv4 address and prefix
	Gateway net.IP           // the default route's next hop; nil when there is none
	MTU     int
}

// ErrNoInterface is returned when the namespace has no interface with an
// IPv4 address besides loopback.
var ErrNoInterface = errors.New("podnet: no interface with an IPv4 address in the pod's network namespace")

// handle opens a netlink handle bound to the namespace at nsPath.
func handle(nsPath string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("podnet: network namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("podnet: netlink in %s: %w", nsPath, err)
	}
	return h, nil
}

// Inspect returns the pod's interface in the namespace at nsPath: the one
// the IPv4 default route leaves by, or, without a default route, the only
// interface other than loopback with an IPv4 address. Its first IPv4
// address is the pod's; more addresses, and IPv6 ones, are not carried
// into the guest.
func Inspect(nsPath string) (Interface, error) {
	h, err := handle(nsPath)
	if err != nil {
		return Interface{}, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return Interface{}, fmt.Errorf("podnet: links in %s: %w", nsPath, err)
	}
	routes, err := h.RouteList(nil, unix.AF_INET)
	if err != nil {
		return Interface{}, fmt.Errorf("podnet: routes in %s: %w", nsPath, err)
	}
	var gw net.IP
	gwLink := 0
	for _, r := range routes {
		if r.Gw != nil && (r.Dst == nil || isDefault(r.Dst)) {
			gw, gwLink = r.Gw, r.LinkIndex
			break
		}
	}
	var found []Interface
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || (gwLink != 0 && a.Index != gwLink) {
			continue
		}
		addrs, err := h.AddrList(l, unix.AF_INET)
		if err != nil {
			return Interface{}, fmt.Errorf("podnet: addresses of %s in %s: %w", a.Name, nsPath, err)
		}
		if len(addrs) == 0 {
			continue
		}
		ifc := Interface{Name: a.Name, MAC: a.HardwareAddr, Addr: *addrs[0].IPNet, MTU: a.MTU}
		if a.Index == gwLink {
			ifc.Gateway = gw
		}
		found = append(found, ifc)
	}
	switch {
	case len(found) == 0:
		return Interface{}, fmt.Errorf("%w (%s)", ErrNoInterface, nsPath)
	case len(found) > 1:
		return Interface{}, fmt.Errorf("podnet: %s has %d interfaces with IPv4 addresses and no default route to choose one: %s and %s",
			nsPath, len(found), found[0].Name, found[1].Name)
	case len(found[0].MAC) != 6:
		return Interface{}, fmt.Errorf("podnet: %s in %s has no Ethernet address (%v): a VM needs an Ethernet interface", found[0].Name, nsPath, found[0].MAC)
	}
	return found[0], nil
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0 && n.IP.IsUnspecified()
}

// KernelArg is the guest kernel's ip= parameter (Documentation/admin-guide/
// nfs/nfsroot.rst) that gives guest interface dev the pod's address,
// netmask and gateway before init, with no autoconfiguration.
func (i Interface) KernelArg(dev string) string {
	gw := ""
	if i.Gateway != nil {
		gw = i.Gateway.String()
	}
	return "ip=" + i.Addr.IP.String() + "::" + gw + ":" + net.IP(i.Addr.Mask).String() + "::" + dev + ":off"
}

// String describes the interface for logs.
func (i Interface) String() string {
	s := i.Name + " " + i.Addr.String() + " " + i.MAC.String() + " mtu " + strconv.Itoa(i.MTU)
	if i.Gateway != nil {
		s += " via " + i.Gateway.String()
	}
	return s
}
