package main

import (
	"testing"

	"github.com/microvm/microvm"
)

func TestParseNet(t *testing.T) {
	for _, tc := range []struct {
		in      string
		tap     string
		mac     string
		wantErr bool
	}{
		{in: "tap=tap0", tap: "tap0"},
		{in: "tap=tap0,mac=02:00:00:00:00:01", tap: "tap0", mac: "02:00:00:00:00:01"},
		{in: "mac=52:54:00:00:00:01,tap=vm-eth", tap: "vm-eth", mac: "52:54:00:00:00:01"},
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
		nc, err := parseNet(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("parseNet(%q) = %+v, want an error", tc.in, nc)
			}
			continue
		}
		if err != nil || nc.TAP != tc.tap || (tc.mac == "") != (nc.MAC == nil) || (nc.MAC != nil && nc.MAC.String() != tc.mac) {
			t.Errorf("parseNet(%q) = %+v, %v; want tap %q mac %q", tc.in, nc, err, tc.tap, tc.mac)
		}
	}
}

// TestNetUsageErrors: a bad --net is a usage error on run and exec, found
// before any KVM or TAP is touched.
func TestNetUsageErrors(t *testing.T) {
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "tap=a,bogus=1"}, "unknown key")
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "mac=02:00:00:00:00:01"}, "tap=NAME is required")
	wantError(t, microvm.StatusUsage, []string{"exec", "--net", "tap=", "--", "true"}, "want tap=NAME")
	five := []string{"run", "--kernel", "k"}
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		five = append(five, "--net", "tap="+n)
	}
	wantError(t, microvm.StatusUsage, five, "at most 4")
}
