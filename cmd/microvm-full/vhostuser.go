package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/metricsrv"
	"github.com/microvm/microvm/internal/seccomp"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/vhostuser"
	"github.com/microvm/microvm/vsock"
)

// vhostUserVsockCommand serves microvm's vsock device to QEMU over
// vhost-user. Its flag names are those of rust-vmm's vhost-device-vsock, so it
// is a drop-in replacement.
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
			dev, err := vsock.New(vsock.Config{
				CID:            cid,
				MaxConns:       lim.MaxConns,
				ConnBuffer:     lim.ConnBuffer,
				MaxBuffered:    lim.BufferTotal,
				ConnectTimeout: lim.ConnectTimeout,
				QueueSize:      virtio.MaxQueueSize, // accept any ring size the front-end picks
				Dialer:         vsock.UDSDialer{Path: uds},
				Options:        &opts.Options,
				Dgram:          opts.Dgram,
				DgramUDS:       uds,
				Log:            log.WithField("device", "vsock"),
			})
			if err != nil {
				return clibase.UsageError{Err: err}
			}
			defer dev.Close()
			log.WithField("vsock-opt", formatVsockOpt(opts)).Info("vsock device options")
			hs, err := vsock.ListenUDS(uds, dev, lim.ConnectTimeout, log.WithField("device", "vsock-uds"))
			if err != nil {
				return err
			}
			defer hs.Close()
			be, err := vhostuser.Listen(sock, vhostuser.Config{Device: dev, Rings: dev.BackendQueues, Log: log})
			if err != nil {
				return err
			}
			if msock != "" {
				// Closed (deferred) before the device: a scrape in
				// flight ends first.
				srv, err := metricsrv.Start(msock, func(w io.Writer) error {
					return vhostUserMetrics(dev, opts.Dgram, be).WritePrometheus(w)
				}, log)
				if err != nil {
					be.Close()
					return err
				}
				defer srv.Close()
			}
			stopProfile, err := startCPUProfile(c, log)
			if err != nil {
				be.Close()
				return err
			}
			defer stopProfile()
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sigs)
			if err := clibase.EnterChroot(root, log); err != nil {
				be.Close()
				return err
			}
			if err := clibase.Confine(c, clibase.Profiled(c, seccomp.VhostUserVsock()), log); err != nil {
				be.Close()
				return err
			}
			go hs.Serve()
			done := make(chan error, 1)
			go func() { done <- be.Serve() }()
			fmt.Fprintf(stderr, "microvm: vhost-user-vsock listening on %s (guest CID %d, host sockets %s)\n", sock, cid, uds)
			select {
			case s := <-sigs:
				log.Infof("stopping on %v", s)
				be.Close()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
				}
				return nil
			case err := <-done:
				be.Close()
				return err
			}
		},
	}
}

// vhostUserMetrics is a snapshot of vhost-user-vsock's counters.
func vhostUserMetrics(dev *vsock.Device, dgram bool, be *vhostuser.Backend) microvm.VhostUserVsockMetrics {
	m := microvm.VhostUserVsockMetrics{Vsock: microvm.VsockMetrics{Name: "vsock0", Dgram: dgram, Stats: dev.Stats()}}
	m.Frontends, m.FrontendErrors, m.DeviceFailures = be.Stats()
	return m
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
