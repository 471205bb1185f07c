package usernet

import (
	"fmt"
	"net"
	"strings"

	tapdns "github.com/containers/gvisor-tap-vsock/pkg/services/dns"
	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// zoneRecords are the names the network's DNS server answers itself.
var zoneRecords = []types.Record{
	{Name: "host", IP: net.ParseIP(HostIP)},
	{Name: "gateway", IP: net.ParseIP(GatewayIP)},
}

// serveDNS answers UDP and TCP port 53 on GatewayIP: the microvm.internal
// zone from its records and, when lookUp is set, other names through the
// host's resolver (gvisor-tap-vsock's server). Without lookUp (an egress
// policy that does not allow DNS, netpolicy.Egress.LooksUpNames) a
// question outside the zone is refused here: it never reaches the host's
// resolver, so the names a guest asks about carry nothing out.
func serveDNS(s *stack.Stack, lookUp bool) error {
	at := tcpip.FullAddress{NIC: nic, Addr: addr(GatewayIP), Port: 53}
	uc, err := gonet.DialUDP(s, &at, nil, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("dns: %w", err)
	}
	tl, err := gonet.ListenTCP(s, at, ipv4.ProtocolNumber)
	if err != nil {
		uc.Close()
		return fmt.Errorf("dns: %w", err)
	}
	if !lookUp {
		h := zoneOnly{}
		go func() { _ = (&dns.Server{PacketConn: uc, Handler: h}).ActivateAndServe() }()
		go func() { _ = (&dns.Server{Listener: tl, Handler: h}).ActivateAndServe() }()
		return nil
	}
	srv, err := tapdns.New(uc, tl, []types.Zone{{Name: zone, Records: zoneRecords}})
	if err != nil {
		uc.Close()
		tl.Close()
		return fmt.Errorf("dns: %w", err)
	}
	go func() { _ = srv.Serve() }()
	go func() { _ = srv.ServeTCP() }()
	return nil
}

// zoneOnly is the DNS server of a network that looks nothing up: the
// zone's A records, NXDOMAIN for other names in the zone, REFUSED for
// names outside it.
type zoneOnly struct{}

func (zoneOnly) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	for _, q := range r.Question {
		name := strings.ToLower(q.Name)
		label, inZone := strings.CutSuffix(name, "."+zone)
		if !inZone {
			m.Rcode = dns.RcodeRefused
			break
		}
		var ip net.IP
		for _, rec := range zoneRecords {
			if rec.Name == label {
				ip = rec.IP
			}
		}
		if ip == nil {
			m.Rcode = dns.RcodeNameError
			break
		}
		if q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET},
				A:   ip.To4(),
			})
		}
	}
	_ = w.WriteMsg(m)
}
