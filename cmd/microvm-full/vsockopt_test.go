package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/vsock"
)

func TestParseVsockOpt(t *testing.T) {
	def := vsock.DefaultOptions
	with := func(f func(o *vsock.Options)) vsock.Options {
		o := def
		f(&o)
		return o
	}
	tests := []struct {
		in   string
		want vsock.Options
	}{
		{"", def},
		{" ", def},
		{"kick-suppress=off", with(func(o *vsock.Options) { o.KickSuppress = false })},
		{"direct-enqueue=off", with(func(o *vsock.Options) { o.DirectEnqueue = false })},
		{"batch=off", with(func(o *vsock.Options) { o.BatchLock = false })},
		{"short-read=off", with(func(o *vsock.Options) { o.ShortReadDrains = false })},
		{"sndbuf=off", with(func(o *vsock.Options) { o.SendBuffer = false })},
		{"ready-gate=off", with(func(o *vsock.Options) { o.ReadinessGate = false })},
		{"irq-coalesce=off", with(func(o *vsock.Options) { o.IRQCoalesce = false })},
		{"kick-suppress=off,direct-enqueue=on,batch=off",
			vsock.Options{KickSuppress: false, DirectEnqueue: true, BatchLock: false, ShortReadDrains: true, SendBuffer: true, ReadinessGate: true, IRQCoalesce: true}},
		{" batch = off , kick-suppress=on", with(func(o *vsock.Options) { o.BatchLock = false })},
		{"kick-suppress=off,direct-enqueue=off,batch=off,short-read=off,sndbuf=off,ready-gate=off,irq-coalesce=off", vsock.Options{}},
	}
	for _, tc := range tests {
		got, err := clibase.ParseVsockOpt(tc.in)
		if err != nil {
			t.Errorf("parseVsockOpt(%q): %v", tc.in, err)
			continue
		}
		if got.Dgram {
			t.Errorf("parseVsockOpt(%q) turned datagrams on", tc.in)
		}
		if diff := cmp.Diff(tc.want, got.Options); diff != "" {
			t.Errorf("parseVsockOpt(%q) (-want +got):\n%s", tc.in, diff)
		}
		// The canonical form selects the same options.
		back, err := clibase.ParseVsockOpt(formatVsockOpt(got))
		if err != nil || back != got {
			t.Errorf("parseVsockOpt(formatVsockOpt(%+v)) = %+v, %v", got, back, err)
		}
	}
}

// dgram=on turns datagrams on, and only that; they are off by default.
func TestParseVsockOptDgram(t *testing.T) {
	for in, want := range map[string]bool{"": false, "dgram=off": false, "dgram=on": true, "batch=off,dgram=on": true} {
		got, err := clibase.ParseVsockOpt(in)
		if err != nil || got.Dgram != want {
			t.Errorf("parseVsockOpt(%q) = %+v, %v; want Dgram %v", in, got, err, want)
		}
		if back, err := clibase.ParseVsockOpt(formatVsockOpt(got)); err != nil || back != got {
			t.Errorf("round trip of %q: %+v, %v", in, back, err)
		}
	}
	if _, err := clibase.ParseVsockOpt("dgram=yes"); err == nil {
		t.Error("dgram=yes accepted")
	}
}

// TestVsockOptUsageErrors: a bad --vsock-opt exits 2 with one line naming
// the offending pair, on both commands, before anything starts.
func TestVsockOptUsageErrors(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(kernel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(opt string) []string {
		return []string{"run", "--kernel", kernel, "--vsock-cid", "3", "--vsock-uds", "/tmp/x.sock", "--vsock-opt", opt}
	}
	vhu := func(opt string) []string {
		return []string{"vhost-user-vsock", "--socket", "/tmp/a", "--uds-path", "/tmp/b", "--vsock-opt", opt}
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown key", run("kick-supress=off"), `--vsock-opt "kick-supress=off": unknown key "kick-supress" (keys: kick-suppress, direct-enqueue, batch, short-read, sndbuf, ready-gate, irq-coalesce, dgram)`},
		{"bad boolean", run("batch=no"), `--vsock-opt "batch=no": batch=no: want on or off`},
		{"no value", run("batch"), `"batch" is not KEY=VALUE`},
		{"empty item", run("batch=off,,kick-suppress=on"), `"" is not KEY=VALUE`},
		{"empty value", run("batch="), `"batch=" is not KEY=VALUE`},
		{"repeated key", run("batch=off,batch=on"), "batch given twice"},
		{"copybreak is gone", run("copybreak=4K"), `unknown key "copybreak"`},
		{"without a vsock device", []string{"run", "--kernel", kernel, "--vsock-opt", "batch=off"}, "--vsock-opt needs a vsock device"},
		{"vhost-user-vsock unknown key", vhu("turbo=on"), `unknown key "turbo"`},
		{"vhost-user-vsock bad value", vhu("direct-enqueue=1"), "direct-enqueue=1: want on or off"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantError(t, microvm.StatusUsage, tc.args, tc.want) })
	}
}

// TestRunConfigVsockOpt: --vsock-opt reaches the machine's vsock
// configuration; without it the device runs with the defaults.
func TestRunConfigVsockOpt(t *testing.T) {
	for _, tc := range []struct {
		opt  []string
		want vsock.Options
	}{
		{nil, vsock.DefaultOptions},
		{[]string{"--vsock-opt", "kick-suppress=off"},
			vsock.Options{KickSuppress: false, DirectEnqueue: true, BatchLock: true, ShortReadDrains: true, SendBuffer: true, ReadinessGate: true, IRQCoalesce: true}},
	} {
		var got *microvm.Config
		args := append([]string{"--kernel", "k", "--vsock-cid", "3", "--vsock-uds", "/tmp/x.sock"}, tc.opt...)
		err := withRunFlags(args, func(c *cli.Context) error {
			cfg, err := clibase.RunConfig(c)
			got = &cfg
			return err
		})
		if err != nil {
			t.Fatalf("%v: %v", tc.opt, err)
		}
		if got == nil || got.Vsock == nil || got.Vsock.Options == nil {
			t.Fatalf("%v: no vsock options in %+v", tc.opt, got)
		}
		if diff := cmp.Diff(tc.want, *got.Vsock.Options); diff != "" {
			t.Errorf("%v (-want +got):\n%s", tc.opt, diff)
		}
	}
}

// TestNamedConfigVsockCID: a named VM takes --vsock-cid (and the vsock
// limits) without --vsock-uds, whose socket is its state directory's; it
// keeps exec's CID without one. An unnamed VM still needs both flags.
func TestNamedConfigVsockCID(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		wantCID   uint64
		wantConns int
		wantErr   string
	}{
		{[]string{"--name", "vm1", "--vsock-cid", "9", "--vsock-max-conns", "5"}, 9, 5, ""},
		{[]string{"--name", "vm1"}, execvm.CID, vsock.DefaultMaxConns, ""},
		{[]string{"--vsock-cid", "9"}, 0, 0, "--vsock-cid and --vsock-uds go together"},
	} {
		var got microvm.Config
		err := withRunFlags(append([]string{"--kernel", "k"}, tc.args...), func(c *cli.Context) error {
			var err error
			got, err = namedConfig(c, imageOpts{})
			return err
		})
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got.Vsock == nil || got.Vsock.CID != tc.wantCID || got.Vsock.MaxConnections != tc.wantConns {
			t.Errorf("%v: vsock %+v, want CID %d and %d connections", tc.args, got.Vsock, tc.wantCID, tc.wantConns)
		}
	}
}

// withRunFlags parses args as run's flags and calls action with them.
func withRunFlags(args []string, action cli.ActionFunc) error {
	app := newApp(nil, nil, nil)
	app.Commands = nil
	app.Flags = runCommand(nil, nil, nil).Flags
	app.Action = action
	return app.Run(append([]string{"microvm"}, args...))
}
