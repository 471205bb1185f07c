// Package netpolicy decides where a guest on a user-mode network
// (devices/virtionet/usernet) may open connections: the host's loopback
// only when asked for (host-loopback), never the blocked ranges (loopback,
// link-local and cloud metadata, multicast, the network's own range)
// unless a rule names them, and, with an egress list, only the listed
// addresses and ports.
//
// It is pure (no sockets) and has no gVisor dependency, so the lean CLI
// parses and checks the --net user options with it, and microvm-net asks
// it about each connection the guest opens.
package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrRefused is wrapped by Decide's refusals.
var ErrRefused = errors.New("refused")

// Policy is one network's policy. The zero Policy (but for Subnet and
// HostGateway, which the network fills in) is the default: no host
// loopback, every destination outside the blocked ranges.
type Policy struct {
	// Subnet is the virtual network's own range. Its addresses are served
	// by the stack itself (gateway, DHCP, DNS); a connection to any other
	// would be re-originated on the host's networks, where the same
	// range can mean other machines, so it is refused.
	Subnet netip.Prefix
	// HostGateway, inside Subnet, stands for the host's 127.0.0.1.
	HostGateway netip.Addr
	// HostAddrs are the host's own addresses on its other interfaces: a
	// service bound to all of them (0.0.0.0) would be as reachable
	// through these as through loopback, so they need HostLoopback too.
	HostAddrs []netip.Addr
	// HostLoopback lets the guest reach the host's loopback through
	// HostGateway, and the host's own addresses (HostAddrs), every port.
	// Egress does not limit HostGateway.
	HostLoopback bool
	// Egress limits every other destination.
	Egress Egress
}

// Egress is an egress policy (ParseEgress). The zero Egress allows every
// destination outside the blocked ranges.
type Egress struct {
	// Restrict, when set, allows only Allow's destinations: none when
	// Allow is empty ("none").
	Restrict bool
	Allow    []Rule
	// DNS, with Restrict, lets the network's DNS server look names
	// outside its own zone up with the host's resolver. A lookup is
	// egress too: the names a guest asks about reach the host's DNS
	// servers and beyond, and can carry data. Without Restrict names are
	// always looked up.
	DNS bool
}

// LooksUpNames says whether the network's DNS server may ask the host's
// resolver about names outside its own zone.
func (e Egress) LooksUpNames() bool { return !e.Restrict || e.DNS }

// Rule allows a range of addresses (Prefix, or every public address with
// Public) on a range of ports, TCP and UDP alike.
type Rule struct {
	Prefix netip.Prefix // unset when Public
	// Public is every address outside the private, shared, documentation
	// and blocked ranges (publicRanges): the Internet, not the host's LAN.
	Public bool
	// Lo and Hi bound the ports, both included.
	Lo, Hi uint16
}

// blocked are the ranges a guest never reaches unless a rule lies wholly
// inside one that may be opened (open): a rule such as 0.0.0.0/0 or
// "public" never opens them, 169.254.169.254/32:80 opens that one port.
var blocked = []struct {
	p    netip.Prefix
	why  string
	open bool
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network (0.0.0.0 is the host itself)", false},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback (the host's is reached through the host gateway with host-loopback)", false},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local and cloud metadata", true},
	{netip.MustParsePrefix("100.100.100.200/32"), "cloud metadata", true},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast", false},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved and broadcast", false},
	{netip.MustParsePrefix("::/96"), "unspecified, loopback and IPv4-compatible", false},
	{netip.MustParsePrefix("fe80::/10"), "link-local", true},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata", true},
	{netip.MustParsePrefix("ff00::/8"), "multicast", false},
}

// notPublic are the ranges Rule.Public leaves out besides the blocked
// ones: private, shared (CGNAT), benchmarking, documentation and unique
// local addresses, which are some LAN's rather than the Internet's.
var notPublic = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("64:ff9b::/96"), // NAT64: embeds an IPv4 address not checked here
}

var loopback4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// Decide returns the address to dial for a guest connection to dst, or
// an error wrapping ErrRefused that says why not and how to allow it.
// HostGateway maps to 127.0.0.1; every check is made on the address that
// would be dialled, with IPv4-mapped IPv6 addresses unmapped first, so no
// other spelling of an address escapes its range.
func (p *Policy) Decide(dst netip.AddrPort) (netip.AddrPort, error) {
	a, port := dst.Addr().Unmap(), dst.Port()
	if !a.IsValid() {
		return netip.AddrPort{}, fmt.Errorf("%w: no address", ErrRefused)
	}
	if p.HostGateway.IsValid() && a == p.HostGateway {
		if !p.HostLoopback {
			return netip.AddrPort{}, fmt.Errorf("%w: %v is the host's loopback, which needs --net user,host-loopback", ErrRefused, dst)
		}
		return netip.AddrPortFrom(loopback4, port), nil
	}
	if p.Subnet.IsValid() && p.Subnet.Contains(a) {
		return netip.AddrPort{}, fmt.Errorf("%w: %v is in the user-mode network's own range %v", ErrRefused, dst, p.Subnet)
	}
	for _, h := range p.HostAddrs {
		if h.Unmap() == a && !p.HostLoopback {
			return netip.AddrPort{}, fmt.Errorf("%w: %v is one of the host's own addresses, which need --net user,host-loopback", ErrRefused, dst)
		}
	}
	for _, b := range blocked {
		if !b.p.Contains(a) {
			continue
		}
		if b.open && p.Egress.opens(b.p, a, port) {
			return netip.AddrPortFrom(a, port), nil
		}
		hint := "never reached"
		if b.open {
			hint = fmt.Sprintf("an egress rule inside %v opens it", b.p)
		}
		return netip.AddrPort{}, fmt.Errorf("%w: %v is %s (%v; %s)", ErrRefused, dst, b.why, b.p, hint)
	}
	if !p.Egress.allows(a, port) {
		return netip.AddrPort{}, fmt.Errorf("%w: %v is outside the egress policy %q", ErrRefused, dst, p.Egress.String())
	}
	return netip.AddrPortFrom(a, port), nil
}

// opens reports whether a rule lying wholly inside blocked range b allows
// a:port.
func (e Egress) opens(b netip.Prefix, a netip.Addr, port uint16) bool {
	for _, r := range e.Allow {
		if !r.Public && r.Prefix.Bits() >= b.Bits() && b.Contains(r.Prefix.Addr()) && r.matches(a, port) {
			return true
		}
	}
	return false
}

func (e Egress) allows(a netip.Addr, port uint16) bool {
	if !e.Restrict {
		return true
	}
	for _, r := range e.Allow {
		if r.matches(a, port) {
			return true
		}
	}
	return false
}

func (r Rule) matches(a netip.Addr, port uint16) bool {
	if port < r.Lo || port > r.Hi {
		return false
	}
	if r.Public {
		return isPublic(a)
	}
	return r.Prefix.Contains(a)
}

func isPublic(a netip.Addr) bool {
	for _, b := range blocked {
		if b.p.Contains(a) {
			return false
		}
	}
	for _, p := range notPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// EgressSyntax is ParseEgress's syntax, for usage lines.
const EgressSyntax = "all, none, or RULE[+RULE]... with RULE CIDR[:PORT[-PORT]], public[:PORT[-PORT]] or dns"

// ParseEgress parses an egress policy, the value of --net user's egress=:
//
//	all            every destination outside the blocked ranges, and DNS lookups (also "")
//	none           no destination, no DNS lookup (the gateway still answers its own
//	               zone, and published ports still work: they are inbound)
//	RULE[+RULE]... only these, each CIDR[:PORT[-PORT]], public[:PORT[-PORT]], or
//	               dns: the gateway's DNS server looks other names up
//
// A CIDR always has its /LEN (IPv6 ones too, so the port after it is not
// taken for part of the address); no port is every port. "+" separates
// rules because "," separates --net's options. "public" is every address
// outside the private, shared and documentation ranges.
func ParseEgress(s string) (Egress, error) {
	switch s {
	case "", "all":
		return Egress{}, nil
	case "none":
		return Egress{Restrict: true}, nil
	}
	e := Egress{Restrict: true}
	for _, rs := range strings.Split(s, "+") {
		if rs == "dns" {
			if e.DNS {
				return Egress{}, fmt.Errorf("egress %q: dns given twice", s)
			}
			e.DNS = true
			continue
		}
		r, err := parseRule(rs)
		if err != nil {
			return Egress{}, fmt.Errorf("egress %q: %w (want %s)", s, err, EgressSyntax)
		}
		e.Allow = append(e.Allow, r)
	}
	return e, nil
}

func parseRule(s string) (Rule, error) {
	r := Rule{Lo: 1, Hi: 65535}
	addr, ports, hasPorts := s, "", false
	if rest, ok := strings.CutPrefix(s, "public"); ok && (rest == "" || rest[0] == ':') {
		r.Public = true
		addr, ports, hasPorts = "public", strings.TrimPrefix(rest, ":"), rest != ""
	} else {
		slash := strings.LastIndexByte(s, '/')
		if slash < 0 {
			return r, fmt.Errorf("rule %q: want a CIDR with its /LEN, or public", s)
		}
		if bits, p, ok := strings.Cut(s[slash+1:], ":"); ok {
			addr, ports, hasPorts = s[:slash+1]+bits, p, true
		}
		pfx, err := netip.ParsePrefix(addr)
		if err != nil {
			return r, fmt.Errorf("rule %q: %w", s, err)
		}
		if pfx.Addr().Is4In6() || pfx.Addr().Zone() != "" {
			return r, fmt.Errorf("rule %q: write IPv4 ranges as IPv4, and no zone", s)
		}
		if pfx != pfx.Masked() {
			return r, fmt.Errorf("rule %q: host bits set (want %v)", s, pfx.Masked())
		}
		r.Prefix = pfx
	}
	if hasPorts {
		lo, hi, isRange := strings.Cut(ports, "-")
		if !isRange {
			hi = lo
		}
		l, err := parsePort(lo)
		if err != nil {
			return r, fmt.Errorf("rule %q: %w", s, err)
		}
		h, err := parsePort(hi)
		if err != nil {
			return r, fmt.Errorf("rule %q: %w", s, err)
		}
		if l > h {
			return r, fmt.Errorf("rule %q: port range %d-%d runs backwards", s, l, h)
		}
		r.Lo, r.Hi = l, h
	}
	return r, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q: want 1-65535", s)
	}
	return uint16(n), nil
}

// String is the policy in ParseEgress's syntax: ParseEgress(e.String())
// gives e back.
func (e Egress) String() string {
	if !e.Restrict {
		return "all"
	}
	if len(e.Allow) == 0 && !e.DNS {
		return "none"
	}
	rs := make([]string, 0, len(e.Allow)+1)
	for _, r := range e.Allow {
		rs = append(rs, r.String())
	}
	if e.DNS {
		rs = append(rs, "dns")
	}
	return strings.Join(rs, "+")
}

// String is the rule in ParseEgress's syntax.
func (r Rule) String() string {
	s := "public"
	if !r.Public {
		s = r.Prefix.String()
	}
	switch {
	case r.Lo == 1 && r.Hi == 65535:
		return s
	case r.Lo == r.Hi:
		return fmt.Sprintf("%s:%d", s, r.Lo)
	}
	return fmt.Sprintf("%s:%d-%d", s, r.Lo, r.Hi)
}
