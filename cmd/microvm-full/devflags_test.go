package main

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
)

func TestDeviceFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		disks   int
		shares  int
		root    string
		rng     *microvm.RNGConfig
		metrics string
		usage   bool
	}{
		{args: nil, rng: &microvm.RNGConfig{}},
		{args: []string{"--rng=off"}},
		{args: []string{"--rng", "--rng-rate", "64K/s"}, rng: &microvm.RNGConfig{Rate: 64 << 10}},
		{args: []string{"--rng-rate", "100"}, rng: &microvm.RNGConfig{Rate: 100}},
		{args: []string{"--disk", "path=a", "--disk", "path=b,readonly", "--root", "/dev/vdb"}, disks: 2, root: "/dev/vdb", rng: &microvm.RNGConfig{}},
		{args: []string{"--root", "/dev/vda"}, usage: true},
		{args: []string{"--rng=off", "--rng-rate", "1K"}, usage: true},
		{args: []string{"--rng-rate", "2G"}, usage: true},
		{args: []string{"--rng-rate", "fast"}, usage: true},
		{args: []string{"--metrics-socket", "/run/m.sock"}, rng: &microvm.RNGConfig{}, metrics: "/run/m.sock"},
		{args: []string{"--metrics-socket="}, usage: true},
		{args: []string{"--share", "tag=a,path=/x", "--share", "tag=b,path=/y,readonly"}, shares: 2, rng: &microvm.RNGConfig{}},
		{args: []string{"--share", "tag=a"}, usage: true},
		{args: []string{"--share", "path=/x"}, usage: true},
		{args: []string{"--share", "tag=a,path=/x,mode=rw"}, usage: true},
	} {
		var cfg microvm.Config
		var got error
		app := newApp(nil, nil, nil)
		app.Commands[0].Action = func(c *cli.Context) error {
			got = clibase.ReadDeviceFlags(c, &cfg)
			return nil
		}
		if err := app.Run(append([]string{"microvm", "run"}, tc.args...)); err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if tc.usage {
			var ue clibase.UsageError
			if !errors.As(got, &ue) && !errors.Is(got, microvm.ErrConfig) {
				t.Errorf("%v: %v; want a usage error", tc.args, got)
			}
			continue
		}
		if got != nil {
			t.Errorf("%v: %v", tc.args, got)
			continue
		}
		if len(cfg.Shares) != tc.shares {
			t.Errorf("%v: shares %+v; want %d", tc.args, cfg.Shares, tc.shares)
		}
		if len(cfg.Disks) != tc.disks || cfg.Root != tc.root || !cmp.Equal(cfg.RNG, tc.rng) || cfg.MetricsSocket != tc.metrics {
			t.Errorf("%v: disks %v root %q rng %+v metrics %q; want %d disks, root %q, rng %+v, metrics %q",
				tc.args, cfg.Disks, cfg.Root, cfg.RNG, cfg.MetricsSocket, tc.disks, tc.root, tc.rng, tc.metrics)
		}
	}
}

// TestNetUsageErrors: a bad --net is a usage error on run and exec, found
// before any KVM or TAP is touched.
func TestNetUsageErrors(t *testing.T) {
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "tap=a,bogus=1"}, "unknown key")
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "mac=02:00:00:00:00:01"}, "want user or tap=NAME")
	wantError(t, microvm.StatusUsage, []string{"exec", "--net", "tap=", "--", "true"}, "want user[,host-loopback][,egress=SPEC][,mac=M] or tap=NAME")
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "user,tap=t0"}, "not both")
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "user", "--net", "user"}, "at most one")
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--publish", "8080:80"}, "--publish needs --net user")
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "user", "--publish", "80"}, "want [HOSTIP:]HOSTPORT:GUESTPORT")
	wantError(t, microvm.StatusUsage, []string{"exec", "--net", "user", "--publish", "8080:80/sctp", "--", "true"}, "want tcp or udp")
	wantError(t, microvm.StatusUsage, []string{"run", "--kernel", "k", "--net", "user,egress=10.0.0.1"}, "want a CIDR with its /LEN")
	wantError(t, microvm.StatusUsage, []string{"exec", "--net", "user,egress=10.0.0.0/8:0", "--", "true"}, "want 1-65535")
	wantError(t, microvm.StatusUsage, []string{"exec", "--net", "tap=t0,host-loopback", "--", "true"}, "are --net user's")
	five := []string{"run", "--kernel", "k"}
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		five = append(five, "--net", "tap="+n)
	}
	wantError(t, microvm.StatusUsage, five, "at most 4")
}
