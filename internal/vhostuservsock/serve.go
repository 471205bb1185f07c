package vhostuservsock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/metricsrv"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/vhostuser"
	"github.com/microvm/microvm/vsock"
)

// Config is a back-end as plain data: what the command line chose,
// checked, with its paths already as the process sees them after any
// chroot.
type Config struct {
	// Socket is the vhost-user socket the front-end (QEMU) connects to.
	Socket string
	// UDS is the host side's hybrid-vsock socket: host clients send
	// "CONNECT <port>"; the guest's connections to port P go to UDS_P
	// (and, with Device.Dgram, its datagrams to UDS's .dgram sockets).
	UDS string
	// MetricsSocket, when not empty, serves the counters in the
	// Prometheus text format over HTTP (docs/metrics.md).
	MetricsSocket string
	// Device is the vsock device: CID, limits, Options and Dgram. Serve
	// sets the rest: QueueSize (any ring size the front-end picks),
	// Dialer and DgramUDS (UDS), Log.
	Device vsock.Config
	// VsockOpt is the --vsock-opt value that selects Device.Options and
	// Device.Dgram, logged once the device is made.
	VsockOpt string
}

// Options are what the calling process adds around the back-end. Every
// hook is optional.
type Options struct {
	// Log is where the device, its host sockets and the back-end log; nil
	// logs nowhere.
	Log logrus.FieldLogger
	// StartCPUProfile is called once every socket listens; the stop it
	// returns runs when Serve returns (--cpuprofile).
	StartCPUProfile func() (stop func(), err error)
	// Interruptible, when set, derives the context Serve waits on, once
	// the profile started and before Confine (the CLI's: SIGINT and
	// SIGTERM cancel it with a cause that has a Signal method), and
	// returns what stops it.
	Interruptible func(context.Context) (context.Context, func())
	// Confine is called after that, before anything is served (the
	// CLI's --chroot and seccomp filter).
	Confine func() error
	// Listening gets one line once the back-end serves: "microvm:
	// vhost-user-vsock listening on SOCKET (guest CID N, host sockets
	// UDS)". Scripts and tests wait for it.
	Listening io.Writer
}

// ConfigError is Serve's error for a device vsock.New refused (a value out
// of range, a datagram socket it could not bind): the caller's mistake,
// which the CLI reports as a usage error. Its text is vsock.New's.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// stopGrace is how long Serve waits, once ctx ends, for the back-end's
// serving goroutine to return after Close.
const stopGrace = 5 * time.Second

// Serve makes the vsock device of cfg, listens on its host socket
// (cfg.UDS), on the vhost-user socket and on the metrics socket, runs o's
// hooks, and serves front-ends one at a time until ctx ends (it returns
// nil) or the back-end fails (its error). Everything it made is closed
// when it returns.
func Serve(ctx context.Context, cfg Config, o Options) error {
	log := o.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = l
	}
	dcfg := cfg.Device
	dcfg.QueueSize = virtio.MaxQueueSize // accept any ring size the front-end picks
	dcfg.Dialer = vsock.UDSDialer{Path: cfg.UDS}
	dcfg.DgramUDS = cfg.UDS
	dcfg.Log = log.WithField("device", "vsock")
	dev, err := vsock.New(dcfg)
	if err != nil {
		return ConfigError{err}
	}
	defer dev.Close()
	log.WithField("vsock-opt", cfg.VsockOpt).Info("vsock device options")
	hs, err := vsock.ListenUDS(cfg.UDS, dev, dcfg.ConnectTimeout, log.WithField("device", "vsock-uds"))
	if err != nil {
		return err
	}
	defer hs.Close()
	be, err := vhostuser.Listen(cfg.Socket, vhostuser.Config{Device: dev, Rings: dev.BackendQueues, Log: log})
	if err != nil {
		return err
	}
	// be is closed on every way out before the deferred closes run: the
	// front-end goes first.
	fail := func(err error) error {
		be.Close()
		return err
	}
	if cfg.MetricsSocket != "" {
		// Closed (deferred) before the device: a scrape in flight ends
		// first.
		srv, err := metricsrv.Start(cfg.MetricsSocket, func(w io.Writer) error {
			return metrics(dev, dcfg.Dgram, be).WritePrometheus(w)
		}, log)
		if err != nil {
			return fail(err)
		}
		defer srv.Close()
	}
	if o.StartCPUProfile != nil {
		stopProfile, err := o.StartCPUProfile()
		if err != nil {
			return fail(err)
		}
		defer stopProfile()
	}
	if o.Interruptible != nil {
		var stop func()
		ctx, stop = o.Interruptible(ctx)
		defer stop()
	}
	if o.Confine != nil {
		if err := o.Confine(); err != nil {
			return fail(err)
		}
	}
	go hs.Serve()
	done := make(chan error, 1)
	go func() { done <- be.Serve() }()
	if o.Listening != nil {
		fmt.Fprintf(o.Listening, "microvm: vhost-user-vsock listening on %s (guest CID %d, host sockets %s)\n", cfg.Socket, dcfg.CID, cfg.UDS)
	}
	select {
	case <-ctx.Done():
		logStop(ctx, log)
		be.Close()
		select {
		case <-done:
		case <-time.After(stopGrace):
		}
		return nil
	case err := <-done:
		be.Close()
		return err
	}
}

// logStop says why ctx ended: the signal, when its cause carries one.
func logStop(ctx context.Context, log logrus.FieldLogger) {
	cause := context.Cause(ctx)
	var s interface{ Signal() syscall.Signal }
	if errors.As(cause, &s) {
		log.Infof("stopping on %v", s.Signal())
		return
	}
	log.Infof("stopping: %v", cause)
}
