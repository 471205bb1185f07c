package main

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/clibase"
)

// readAll is every run flag's value as c reads it, and whether it was
// given, by name.
func readAll(c clibase.FlagValues) map[string]string {
	got := map[string]string{}
	for _, o := range clibase.RunOpts() {
		var v any
		switch o.Kind {
		case clibase.OptString:
			v = c.String(o.Name)
		case clibase.OptBool:
			v = c.Bool(o.Name)
		case clibase.OptInt:
			v = c.Int(o.Name)
		case clibase.OptInt64:
			v = c.Int64(o.Name)
		case clibase.OptUint64:
			v = c.Uint64(o.Name)
		case clibase.OptDuration:
			v = c.Duration(o.Name)
		case clibase.OptValue:
			v = c.Generic(o.Name).(clibase.FlagValue).String()
		}
		got[o.Name] = fmt.Sprintf("%v given=%v", v, clibase.IsSet(c, o.Name))
	}
	return got
}

// TestLeanFlags: the lean build's parser (the standard flag package) reads
// run's command lines as the full build's urfave/cli does: every flag's
// value, whether it was given, the arguments left, and which command
// lines are refused.
func TestLeanFlags(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--kernel", "k", "--memory", "64M", "--cpus", "2"},
		{"-kernel=k", "--cpus=0x3", "--vsock-cid", "7", "--vsock-uds", "/tmp/v.sock", "--vsock-opt", "batch=off,dgram=on"},
		{"--disk", "path=a,readonly", "--disk", "path=b", "--root", "/dev/vdb", "--rng", "--rng-rate", "1K/s"},
		{"--rng=off", "--seccomp=off", "--uid", "1000", "--gid", "1000", "--chroot", "/srv"},
		{"--seccomp", "--net", "user", "--publish", "8080:80", "--publish", "127.0.0.1:53:53/udp"},
		{"-d", "--name", "ci1", "--with-agent", "--boot-timeout", "90s", "--add", "a:/b", "--add", "c,d:/e"},
		{"--detach=false", "--idle", "--image", "debian:12", "--", "sh", "-c", "echo hi"},
		{"--image", "alpine", "echo", "--not-a-flag"},
		{"--vsock-connect-timeout", "250ms", "--vsock-max-conns", "-1", "--vsock-buffer-total", "1M"},
		{"--log-level", "debug", "--log-format", "json", "--metrics-socket", "/run/m.sock", "--acpi", "off", "--irqchip", "kernel"},
		// Refused by both.
		{"--bogus"},
		{"--cpus", "two"},
		{"--vsock-cid", "-3"},
		{"--boot-timeout", "soon"},
		{"--seccomp=maybe"},
		{"--kernel"},
		{"-h"},
		{"--help"},
	} {
		var full map[string]string
		var fullArgs []string
		app := newApp(nil, nil, nil)
		app.HideHelp = true
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		app.Commands[0].Action = func(c *cli.Context) error {
			full, fullArgs = readAll(c), c.Args().Slice()
			return nil
		}
		fullErr := app.Run(append([]string{"microvm", "run"}, args...))
		help := full == nil && fullErr == nil // urfave/cli showed its help

		c, leanArgs, leanErr := clibase.ParseLeanFlags("run", clibase.RunOpts(), args)
		switch {
		case fullErr != nil || help:
			if leanErr == nil {
				t.Errorf("%q: urfave/cli refused it (%v, help %v), the lean parser did not", args, fullErr, help)
			}
			continue
		case leanErr != nil:
			t.Errorf("%q: the lean parser refused it (%v), urfave/cli did not", args, leanErr)
			continue
		}
		if d := cmp.Diff(full, readAll(c)); d != "" {
			t.Errorf("%q: flags differ (-urfave/cli +lean):\n%s", args, d)
		}
		if strings.Join(fullArgs, "\x00") != strings.Join(leanArgs, "\x00") {
			t.Errorf("%q: arguments %q (urfave/cli) and %q (lean)", args, fullArgs, leanArgs)
		}
	}
}
