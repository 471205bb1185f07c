//go:build !microvm_lean

package main

import (
	"io"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
)

// `microvm restore DIR`: the machine a snapshot holds (microvm snapshot,
// docs/snapshot.md), run in the foreground from where it was saved, as
// `microvm run` runs a booted one: the console on stdin and stdout, the
// exit status the guest's end. The flags name the host resources the new
// process owns; the machine itself (CPUs, memory, devices and their
// settings) is the snapshot's.

// restoreCommand is `microvm restore`.
func restoreCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	opts := []opt{
		uint64Opt("vsock-cid", "the restored guest's vsock CID (default: the snapshot's); a clone beside its original needs its own"),
		stringOpt("vsock-uds", "", "host Unix socket of the vsock device (default: the snapshot's)"),
		stringOpt("metrics-socket", "", "serve Prometheus metrics on this Unix socket"),
	}
	return &cli.Command{
		Name:         "restore",
		Usage:        "run a VM from a snapshot (microvm snapshot): it goes on where it was saved",
		UsageText:    "microvm restore [--vsock-cid N] [--vsock-uds PATH] [--disk PATH]... [--metrics-socket PATH] [--seccomp=off] [--log-level LEVEL] DIR",
		OnUsageError: onUsageError,
		Flags: append(cliFlags(opts, []opt{seccompFlag()}, logFlags()), &cli.StringSliceFlag{Name: "disk",
			Usage: "disk image path in place of the snapshot's, one per disk in order (each checked against the size and modification time the snapshot saw)"}),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("restore: want one snapshot directory")
			}
			log, err := setupLog(c, stderr)
			if err != nil {
				return err
			}
			host := microvm.Config{Log: log, Console: stdout, ConsoleInput: stdin, MetricsSocket: c.String("metrics-socket")}
			if c.IsSet("vsock-cid") || c.IsSet("vsock-uds") {
				host.Vsock = &microvm.VsockConfig{CID: c.Uint64("vsock-cid"), UDSPath: c.String("vsock-uds")}
			}
			for _, p := range c.StringSlice("disk") {
				host.Disks = append(host.Disks, microvm.DiskConfig{Path: p})
			}
			m, err := microvm.Restore(c.Args().First(), host)
			if err != nil {
				return err
			}
			return runBuilt(m, log, func() error { return confine(c, vmmPolicy(m.Config()), log) })
		},
	}
}
