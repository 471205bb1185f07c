package virtionet

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Publish forwards a host port to a guest port on a user-mode network
// (`--publish`; package usernet binds it).
type Publish struct {
	// Proto is "tcp" or "udp".
	Proto string
	// HostIP is the host address the listener binds (default 127.0.0.1:
	// only this machine reaches the guest unless the user says so).
	HostIP string
	// HostPort and GuestPort are the two ends.
	HostPort, GuestPort uint16
}

// ParsePublish parses [HOSTIP:]HOSTPORT:GUESTPORT[/tcp|/udp], as
// `docker run -p` writes it (HOSTIP defaults to 127.0.0.1, not to every
// address as in docker; an IPv6 HOSTIP goes in brackets).
func ParsePublish(s string) (Publish, error) {
	p := Publish{Proto: "tcp", HostIP: "127.0.0.1"}
	spec, proto, ok := strings.Cut(s, "/")
	if ok {
		if proto != "tcp" && proto != "udp" {
			return Publish{}, fmt.Errorf("publish %q: protocol %q, want tcp or udp", s, proto)
		}
		p.Proto = proto
	}
	i := strings.LastIndex(spec, ":")
	if i < 0 {
		return Publish{}, fmt.Errorf("publish %q: want [HOSTIP:]HOSTPORT:GUESTPORT[/udp]", s)
	}
	host, guest := spec[:i], spec[i+1:]
	if j := strings.LastIndex(host, ":"); j >= 0 && !strings.HasSuffix(host, "]") {
		p.HostIP, host = strings.Trim(host[:j], "[]"), host[j+1:]
		if net.ParseIP(p.HostIP) == nil {
			return Publish{}, fmt.Errorf("publish %q: host address %q is not an IP address", s, p.HostIP)
		}
	}
	var err error
	if p.HostPort, err = parsePort(host); err != nil {
		return Publish{}, fmt.Errorf("publish %q: host port: %w", s, err)
	}
	if p.GuestPort, err = parsePort(guest); err != nil {
		return Publish{}, fmt.Errorf("publish %q: guest port: %w", s, err)
	}
	return p, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a port (1..65535)", s)
	}
	return uint16(n), nil
}

// HostAddr is the listener's address, HOSTIP:HOSTPORT.
func (p Publish) HostAddr() string {
	return net.JoinHostPort(p.HostIP, strconv.Itoa(int(p.HostPort)))
}

// String is the flag's form, with every part spelt out.
func (p Publish) String() string {
	return fmt.Sprintf("%s:%d/%s", p.HostAddr(), p.GuestPort, p.Proto)
}
