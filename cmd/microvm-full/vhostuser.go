package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/seccomp"
	"github.com/microvm/microvm/internal/vhostuservsock"
	"github.com/microvm/microvm/vsock"
)

// vhostUserVsockCommand serves microvm's vsock device to QEMU over
// vhost-user (vhostuservsock.Serve). Its flag names are those of rust-vmm's
// vhost-device-vsock, so it is a drop-in replacement.
func vhostUserVsockCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "vhost-user-vsock",
		Usage:        vhostUserUsage,
		UsageText:    "microvm vhost-user-vsock --socket PATH --guest-cid N --uds-path PATH [--vsock-opt LIST] [--metrics-socket PATH] [--chroot DIR] [--seccomp=off] [--cpuprofile FILE]",
		OnUsageError: onUsageError,
		Flags: concatFlags([]cli.Flag{
			&cli.StringFlag{Name: "socket", Usage: "vhost-user socket QEMU connects to (required)"},
			&cli.Uint64Flag{Name: "guest-cid", Value: 3, Usage: "the guest's CID (>= 3)"},
			&cli.StringFlag{Name: "uds-path", Usage: "host Unix socket: clients send CONNECT <port>; guest connections to port P go to PATH_P (required)"},
			&cli.StringFlag{Name: "metrics-socket", Usage: "serve the device's counters in the Prometheus text format over HTTP on this Unix socket (docs/metrics.md)"},
		}, cliFlags(clibase.VsockLimitFlags(""), []clibase.Opt{clibase.VsockOptFlag(), clibase.ChrootFlag(), clibase.SeccompFlag(), clibase.CPUProfileFlag()}, clibase.LogFlags())),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return clibase.Usagef("vhost-user-vsock: unexpected argument %q", c.Args().First())
			}
			log, err := clibase.SetupLog(c, stderr)
			if err != nil {
				return err
			}
			sock, uds := c.String("socket"), c.String("uds-path")
			if sock == "" || uds == "" {
				return clibase.Usagef("vhost-user-vsock: --socket and --uds-path are required")
			}
			cid := c.Uint64("guest-cid")
			if cid < 3 || cid >= 0xffffffff {
				return clibase.Usagef("--guest-cid %d: must be at least 3 (0-2 are reserved) and below 2^32-1", cid)
			}
			lim, err := clibase.ReadVsockLimits(c, "")
			if err != nil {
				return err
			}
			opts, err := clibase.ParseVsockOpt(c.String("vsock-opt"))
			if err != nil {
				return err
			}
			if err := vsock.CheckUDSPath(uds); err != nil {
				return clibase.UsageError{Err: err}
			}
			root, err := clibase.ReadChroot(c)
			if err != nil {
				return err
			}
			if err := clibase.ChrootPath(root, &sock, "--socket"); err != nil {
				return err
			}
			if err := clibase.ChrootPath(root, &uds, "--uds-path"); err != nil {
				return err
			}
			msock := c.String("metrics-socket")
			if clibase.IsSet(c, "metrics-socket") && msock == "" {
				return clibase.Usagef("--metrics-socket needs a path")
			}
			if err := microvm.CheckMetricsSocket(msock); err != nil {
				return clibase.UsageError{Err: err}
			}
			if err := clibase.ChrootPath(root, &msock, "--metrics-socket"); err != nil {
				return err
			}
			if err := needProc(root); err != nil {
				return err
			}
			if opts.Dgram {
				if err := vsock.CheckDgramPath(uds); err != nil {
					return clibase.UsageError{Err: err}
				}
			}
			err = vhostuservsock.Serve(context.Background(), vhostuservsock.Config{
				Socket:        sock,
				UDS:           uds,
				MetricsSocket: msock,
				Device: vsock.Config{
					CID:            cid,
					MaxConns:       lim.MaxConns,
					ConnBuffer:     lim.ConnBuffer,
					MaxBuffered:    lim.BufferTotal,
					ConnectTimeout: lim.ConnectTimeout,
					Options:        &opts.Options,
					Dgram:          opts.Dgram,
				},
				VsockOpt: formatVsockOpt(opts),
			}, vhostuservsock.Options{
				Log:             log,
				StartCPUProfile: func() (func(), error) { return startCPUProfile(c, log) },
				Interruptible:   clibase.Interruptible,
				Confine: func() error {
					if err := clibase.EnterChroot(root, log); err != nil {
						return err
					}
					return clibase.Confine(c, clibase.Profiled(c, seccomp.VhostUserVsock()), log)
				},
				Listening: stderr,
			})
			var ce vhostuservsock.ConfigError
			if errors.As(err, &ce) {
				return clibase.UsageError{Err: err}
			}
			return err
		},
	}
}

// needProc checks that dir holds a mounted /proc, which vhost-user-vsock
// reads at run time (it tells eventfds by their /proc/self/fd link).
func needProc(dir string) error {
	if dir == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "proc", "self", "fd")); err != nil {
		return clibase.Usagef("--chroot %s: vhost-user-vsock needs /proc mounted inside it (it checks the front-end's descriptors through /proc/self/fd): %s/proc/self/fd: %v", dir, dir, errors.Unwrap(err))
	}
	return nil
}

// formatVsockOpt is the --vsock-opt value that selects o.
func formatVsockOpt(o clibase.VsockOpt) string {
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	return fmt.Sprintf("kick-suppress=%s,direct-enqueue=%s,batch=%s,short-read=%s,sndbuf=%s,ready-gate=%s,irq-coalesce=%s,dgram=%s",
		onOff(o.KickSuppress), onOff(o.DirectEnqueue), onOff(o.BatchLock), onOff(o.ShortReadDrains), onOff(o.SendBuffer), onOff(o.ReadinessGate), onOff(o.IRQCoalesce), onOff(o.Dgram))
}
