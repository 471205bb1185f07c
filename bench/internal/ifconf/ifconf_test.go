//go:build linux

package ifconf

import (
	"net/netip"
	"testing"
)

func TestNetmask(t *testing.T) {
	for _, tc := range []struct {
		bits int
		want string
	}{
		{-1, "0.0.0.0"}, {0, "0.0.0.0"}, {1, "128.0.0.0"}, {8, "255.0.0.0"},
		{24, "255.255.255.0"}, {30, "255.255.255.252"}, {32, "255.255.255.255"}, {33, "255.255.255.255"},
	} {
		if got := Netmask(tc.bits); got != netip.MustParseAddr(tc.want) {
			t.Errorf("Netmask(%d) = %v, want %s", tc.bits, got, tc.want)
		}
	}
}
