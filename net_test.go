package microvm

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/microvm/microvm/devices/virtionet/usernet/netpolicy"
)

// TestNetConfigErrors: bad network devices are configuration errors,
// reported before KVM or a TAP is opened.
func TestNetConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		nets []NetConfig
	}{
		{"no tap", []NetConfig{{}}},
		{"long name", []NetConfig{{TAP: "sixteen-bytes-xx"}}},
		{"multicast mac", []NetConfig{{TAP: "t0", MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}}}},
		{"short mac", []NetConfig{{TAP: "t0", MAC: net.HardwareAddr{2, 0, 0}}}},
		{"too many", []NetConfig{{TAP: "a"}, {TAP: "b"}, {TAP: "c"}, {TAP: "d"}, {TAP: "e"}}},
		{"host-loopback on a tap", []NetConfig{{TAP: "t0", HostLoopback: true}}},
		{"egress on a tap", []NetConfig{{TAP: "t0", Egress: netpolicy.Egress{Restrict: true}}}},
		{"egress rule with host bits", []NetConfig{{User: true, Egress: netpolicy.Egress{Restrict: true,
			Allow: []netpolicy.Rule{{Prefix: netip.MustParsePrefix("10.0.0.1/8"), Lo: 1, Hi: 65535}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Kernel: "/nonexistent", Nets: tc.nets})
			if !errors.Is(err, ErrConfig) {
				t.Errorf("New: %v, want ErrConfig", err)
			}
		})
	}
}

func TestParseNet(t *testing.T) {
	for _, tc := range []struct {
		in      string
		tap     string
		mac     string
		netns   string
		wantErr bool
	}{
		{in: "tap=tap0", tap: "tap0"},
		{in: "tap=tap0,mac=02:00:00:00:00:01", tap: "tap0", mac: "02:00:00:00:00:01"},
		{in: "mac=52:54:00:00:00:01,tap=vm-eth", tap: "vm-eth", mac: "52:54:00:00:00:01"},
		{in: "tap=tap0,netns=/var/run/netns/pod1", tap: "tap0", netns: "/var/run/netns/pod1"},
		{in: "tap=a,netns=/x,netns=/y", wantErr: true},
		{in: "user,netns=/x", wantErr: true},
		{in: "tap=a,netns=", wantErr: true},
		{in: "", wantErr: true},
		{in: "tap=", wantErr: true},
		{in: "tap0", wantErr: true},
		{in: "mac=02:00:00:00:00:01", wantErr: true},
		{in: "tap=a,tap=b", wantErr: true},
		{in: "tap=a,mac=01:00:5e:00:00:01", wantErr: true}, // multicast
		{in: "tap=a,mac=02:00", wantErr: true},
		{in: "tap=a,mtu=9000", wantErr: true},
		{in: "tap=sixteen-bytes-xx", wantErr: true},
		{in: "tap=a/b", wantErr: true},
	} {
		nc, err := ParseNet(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("ParseNet(%q) = %+v, want an error", tc.in, nc)
			}
			continue
		}
		if err != nil || nc.TAP != tc.tap || nc.NetNS != tc.netns || (tc.mac == "") != (nc.MAC == nil) || (nc.MAC != nil && nc.MAC.String() != tc.mac) {
			t.Errorf("ParseNet(%q) = %+v, %v; want tap %q mac %q", tc.in, nc, err, tc.tap, tc.mac)
		}
	}
}

// TestParseNetUserPolicy: --net user's host-loopback and egress=SPEC,
// and the one-line usage errors for bad ones.
func TestParseNetUserPolicy(t *testing.T) {
	for _, tc := range []struct {
		in           string
		hostLoopback bool
		egress       string // Egress.String()
		err          string // a usage error saying this
	}{
		{in: "user", egress: "all"},
		{in: "user,host-loopback", hostLoopback: true, egress: "all"},
		{in: "user,egress=none", egress: "none"},
		{in: "user,egress=10.0.0.0/8:443+192.0.2.0/24,host-loopback,mac=02:00:00:00:00:01", hostLoopback: true, egress: "10.0.0.0/8:443+192.0.2.0/24"},
		{in: "user,egress=public:443", egress: "public:443"},
		{in: "user,egress=dns+public:443", egress: "public:443+dns"},
		{in: "user,egress=10.0.0.1", err: "want a CIDR with its /LEN"},
		{in: "user,egress=10.0.0.0/8:99999", err: "want 1-65535"},
		{in: "user,egress=", err: "want user["},
		{in: "user,egress=none,egress=all", err: "egress given twice"},
		{in: "user,host-loopback,host-loopback", err: "host-loopback given twice"},
		{in: "user,host-loopback=yes", err: "unknown key"},
		{in: "tap=t0,host-loopback", err: "are --net user's"},
		{in: "tap=t0,egress=none", err: "are --net user's"},
	} {
		nc, err := ParseNet(tc.in)
		if tc.err != "" {
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "\n") {
				t.Errorf("ParseNet(%q) = %+v, %v; want one ErrConfig line saying %q", tc.in, nc, err, tc.err)
			}
			continue
		}
		if err != nil || !nc.User || nc.HostLoopback != tc.hostLoopback || nc.Egress.String() != tc.egress {
			t.Errorf("ParseNet(%q) = %+v, %v; want host-loopback %v, egress %q", tc.in, nc, err, tc.hostLoopback, tc.egress)
		}
	}
}
