package netpolicy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func mustEgress(t *testing.T, s string) Egress {
	t.Helper()
	e, err := ParseEgress(s)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func policy(t *testing.T, hostLoopback bool, egress string) *Policy {
	return &Policy{
		Subnet:       netip.MustParsePrefix("192.168.127.0/24"),
		HostGateway:  netip.MustParseAddr("192.168.127.254"),
		HostAddrs:    []netip.Addr{netip.MustParseAddr("10.1.2.3")},
		HostLoopback: hostLoopback,
		Egress:       mustEgress(t, egress),
	}
}

// TestDecide: each row is a destination the guest asks for under a
// policy, and the address dialled ("" for a refusal).
func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name         string
		hostLoopback bool
		egress       string
		dst          string
		want         string
	}{
		// The host's loopback only with host-loopback, and only through
		// the host gateway.
		{"host gateway, default", false, "", "192.168.127.254:8000", ""},
		{"host gateway, host-loopback", true, "", "192.168.127.254:8000", "127.0.0.1:8000"},
		{"host gateway, host-loopback, egress none", true, "none", "192.168.127.254:8000", "127.0.0.1:8000"},
		{"loopback direct", false, "", "127.0.0.1:22", ""},
		{"loopback direct, host-loopback", true, "", "127.0.0.1:22", ""},
		{"loopback elsewhere in 127/8", true, "", "127.1.2.3:22", ""},
		{"loopback, rule cannot open it", true, "127.0.0.0/8", "127.0.0.1:22", ""},
		{"this-network 0.0.0.0", true, "", "0.0.0.0:22", ""},
		{"host's own address", false, "", "10.1.2.3:22", ""},
		{"host's own address, host-loopback", true, "", "10.1.2.3:22", "10.1.2.3:22"},
		// Link-local and metadata: blocked, and opened only by a rule
		// inside them.
		{"metadata", false, "", "169.254.169.254:80", ""},
		{"link-local", false, "", "169.254.1.1:80", ""},
		{"metadata, all does not open it", false, "0.0.0.0/0", "169.254.169.254:80", ""},
		{"metadata, public does not open it", false, "public", "169.254.169.254:80", ""},
		{"metadata, opened by its own rule", false, "169.254.169.254/32:80", "169.254.169.254:80", "169.254.169.254:80"},
		{"metadata, its rule's port only", false, "169.254.169.254/32:80", "169.254.169.254:443", ""},
		{"alibaba metadata", false, "", "100.100.100.200:80", ""},
		{"aws ipv6 metadata", false, "", "[fd00:ec2::254]:80", ""},
		{"ipv6 link-local", false, "", "[fe80::1]:80", ""},
		// Other spellings of a blocked address.
		{"v4-mapped metadata", false, "", "[::ffff:169.254.169.254]:80", ""},
		{"v4-mapped loopback", true, "", "[::ffff:127.0.0.1]:80", ""},
		{"v4-mapped host gateway", false, "", "[::ffff:192.168.127.254]:80", ""},
		{"v4-mapped host gateway, host-loopback", true, "", "[::ffff:192.168.127.254]:80", "127.0.0.1:80"},
		{"ipv6 loopback", true, "", "[::1]:80", ""},
		{"v4-compatible loopback", true, "", "[::127.0.0.1]:80", ""},
		{"multicast", false, "", "224.0.0.251:5353", ""},
		{"broadcast", false, "", "255.255.255.255:67", ""},
		// The network's own range.
		{"gateway (not a served port)", true, "", "192.168.127.1:22", ""},
		{"another subnet address", true, "0.0.0.0/0", "192.168.127.9:80", ""},
		// Default and egress lists.
		{"default: the internet", false, "", "198.51.100.7:443", "198.51.100.7:443"},
		{"default: the LAN", false, "", "192.168.1.10:22", "192.168.1.10:22"},
		{"none", false, "none", "198.51.100.7:443", ""},
		{"list: in", false, "10.0.0.0/8:443+192.0.2.0/24", "10.9.9.9:443", "10.9.9.9:443"},
		{"list: wrong port", false, "10.0.0.0/8:443+192.0.2.0/24", "10.9.9.9:80", ""},
		{"list: second rule", false, "10.0.0.0/8:443+192.0.2.0/24", "192.0.2.200:5000", "192.0.2.200:5000"},
		{"list: outside", false, "10.0.0.0/8:443+192.0.2.0/24", "8.8.8.8:53", ""},
		{"port range", false, "8.8.8.0/24:50-60", "8.8.8.8:53", "8.8.8.8:53"},
		{"port range, above", false, "8.8.8.0/24:50-60", "8.8.8.8:61", ""},
		{"public: internet", false, "public", "8.8.8.8:53", "8.8.8.8:53"},
		{"public: not the LAN", false, "public", "192.168.1.10:22", ""},
		{"public: not 10/8", false, "public", "10.0.0.1:22", ""},
		{"public: not CGNAT", false, "public", "100.64.0.1:22", ""},
		{"public:443", false, "public:443", "8.8.8.8:443", "8.8.8.8:443"},
		{"public:443, other port", false, "public:443", "8.8.8.8:80", ""},
		{"public and a LAN host", false, "public+192.168.1.10/32:443", "192.168.1.10:443", "192.168.1.10:443"},
		{"ipv6 rule", false, "2001:db8::/32:443", "[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"ipv6 public", false, "public", "[2606:4700::1]:443", "[2606:4700::1]:443"},
		{"ipv6 ula not public", false, "public", "[fd12::1]:443", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy(t, tc.hostLoopback, tc.egress)
			got, err := p.Decide(netip.MustParseAddrPort(tc.dst))
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("Decide(%s) = %v, want a refusal", tc.dst, got)
			case tc.want == "" && !errors.Is(err, ErrRefused):
				t.Fatalf("Decide(%s): %v, want ErrRefused", tc.dst, err)
			case tc.want != "" && err != nil:
				t.Fatalf("Decide(%s): %v, want %s", tc.dst, err, tc.want)
			case tc.want != "" && got != netip.MustParseAddrPort(tc.want):
				t.Fatalf("Decide(%s) = %v, want %s", tc.dst, got, tc.want)
			}
		})
	}
}

// TestDecideSaysHow: a refusal names the option that allows it.
func TestDecideSaysHow(t *testing.T) {
	p := policy(t, false, "")
	_, err := p.Decide(netip.MustParseAddrPort("192.168.127.254:80"))
	if err == nil || !strings.Contains(err.Error(), "host-loopback") {
		t.Errorf("host gateway: %v, want a refusal naming host-loopback", err)
	}
	_, err = p.Decide(netip.MustParseAddrPort("169.254.169.254:80"))
	if err == nil || !strings.Contains(err.Error(), "egress rule inside 169.254.0.0/16") {
		t.Errorf("metadata: %v, want a refusal saying which rule opens it", err)
	}
	p = policy(t, false, "none")
	_, err = p.Decide(netip.MustParseAddrPort("8.8.8.8:53"))
	if err == nil || !strings.Contains(err.Error(), `egress policy "none"`) {
		t.Errorf("none: %v, want a refusal naming the policy", err)
	}
}

func TestParseEgress(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "all"},
		{"all", "all"},
		{"none", "none"},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.0.0.0/8:443", "10.0.0.0/8:443"},
		{"10.0.0.0/8:1-65535", "10.0.0.0/8"},
		{"10.0.0.0/8:1000-2000+public:443", "10.0.0.0/8:1000-2000+public:443"},
		{"2001:db8::/32:443", "2001:db8::/32:443"},
		{"192.0.2.7/32", "192.0.2.7/32"},
		{"dns", "dns"},
		{"dns+public:443", "public:443+dns"},
	} {
		e, err := ParseEgress(tc.in)
		if err != nil {
			t.Errorf("ParseEgress(%q): %v", tc.in, err)
			continue
		}
		if got := e.String(); got != tc.want {
			t.Errorf("ParseEgress(%q).String() = %q, want %q", tc.in, got, tc.want)
		}
		if again, err := ParseEgress(e.String()); err != nil || again.String() != e.String() {
			t.Errorf("ParseEgress(%q) again: %v, %v", e.String(), again, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"10.0.0.1", "want a CIDR with its /LEN"},
		{"10.0.0.1/8", "host bits set"},
		{"10.0.0.0/33", "rule"},
		{"10.0.0.0/8:0", "want 1-65535"},
		{"10.0.0.0/8:65536", "want 1-65535"},
		{"10.0.0.0/8:80-20", "runs backwards"},
		{"10.0.0.0/8:http", "want 1-65535"},
		{"10.0.0.0/8+", "want a CIDR"},
		{"::ffff:10.0.0.0/104", "write IPv4 ranges as IPv4"},
		{"fe80::%eth0/64", "rule"},
		{"publicity", "want a CIDR"},
		{"none+10.0.0.0/8", "want a CIDR"},
		{"10.0.0.0/8,mac=x", "rule"},
		{"dns+dns", "dns given twice"},
		{"none+dns", "want a CIDR"},
	} {
		_, err := ParseEgress(tc.in)
		if err == nil {
			t.Errorf("ParseEgress(%q) succeeded", tc.in)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseEgress(%q): %q, want one line saying %q", tc.in, err, tc.want)
		}
	}
}

// TestLooksUpNames: DNS lookups are egress: allowed with every
// destination, and under a restricted egress only with its dns rule.
func TestLooksUpNames(t *testing.T) {
	for spec, want := range map[string]bool{"all": true, "none": false, "public:443": false, "public:443+dns": true, "dns": true} {
		e, err := ParseEgress(spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.LooksUpNames(); got != want {
			t.Errorf("egress %q: LooksUpNames = %v, want %v", spec, got, want)
		}
	}
}

func FuzzParseEgress(f *testing.F) {
	for _, s := range []string{"none", "10.0.0.0/8:443+public", "2001:db8::/32:1-2", "169.254.169.254/32:80", "dns+public:53"} {
		f.Add(s, "169.254.169.254:80")
	}
	f.Fuzz(func(t *testing.T, spec, dst string) {
		e, err := ParseEgress(spec)
		if err != nil {
			return
		}
		again, err := ParseEgress(e.String())
		if err != nil || again.String() != e.String() {
			t.Fatalf("%q -> %q -> %q, %v", spec, e.String(), again.String(), err)
		}
		ap, err := netip.ParseAddrPort(dst)
		if err != nil {
			return
		}
		p := &Policy{Subnet: netip.MustParsePrefix("192.168.127.0/24"), HostGateway: netip.MustParseAddr("192.168.127.254"), Egress: e}
		got, err := p.Decide(ap)
		if err != nil {
			return
		}
		// Whatever the rules, nothing dialled is loopback, unspecified,
		// multicast or in the network's own range.
		a := got.Addr()
		if a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() || p.Subnet.Contains(a) || a.Is4In6() {
			t.Fatalf("egress %q allowed %v -> %v", spec, ap, got)
		}
	})
}
