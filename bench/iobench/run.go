//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/microvm/microvm/bench/internal/ifconf"
	"github.com/microvm/microvm/bench/internal/ioproto"
)

// run prepares the guest image, the disk image or the TAP, and does the
// runs, alternating which VMM goes first.
func run(ctx context.Context, cfg *config, dir string) (*report, error) {
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := writeInitrd(initrd, cfg.guest); err != nil {
		return nil, err
	}
	image := filepath.Join(dir, "disk.img")
	var srv *netServer
	if cfg.mode == ioproto.ModeBlk {
		if err := writeImage(image, cfg.diskSize); err != nil {
			return nil, err
		}
	} else {
		var err error
		if srv, err = newNetServer(cfg.params().Duration); err != nil {
			return nil, err
		}
		defer srv.close()
	}
	rep := newReport(cfg)
	var kinds []vmmKind
	for _, k := range []vmmKind{kindMicrovm, kindQEMU} {
		argv := cfg.argv(k, initrd, image)
		if _, err := exec.LookPath(argv[0]); err != nil {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		rep.Argv[string(k)] = argv
		kinds = append(kinds, k)
	}
	for i := range cfg.n {
		order := kinds
		if i%2 == 1 && len(kinds) == 2 {
			order = []vmmKind{kinds[1], kinds[0]}
		}
		for _, k := range order {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			fmt.Fprintf(os.Stderr, "%s: %s run %d of %d\n", prog, k, i+1, cfg.n)
			r := runRecord{VMM: string(k), Iteration: i + 1}
			r.Values, r.Guest, r.Host, r.WallS, r.Error = measureOnce(cfg, rep.Argv[string(k)], srv)
			if r.Error != "" {
				fmt.Fprintf(os.Stderr, "%s: %s run %d FAILED: %s\n", prog, k, i+1, r.Error)
			}
			rep.Runs = append(rep.Runs, r)
		}
	}
	rep.summarise()
	return rep, nil
}

// measureOnce runs argv once and turns what the guest (and, for net, the
// host) measured into the metrics' values; errMsg is why the run does not
// count.
func measureOnce(cfg *config, argv []string, srv *netServer) (values map[string]float64, guest []ioproto.Result, host *hostNet, wallS float64, errMsg string) {
	var served chan hostNetResult
	if srv != nil {
		served = make(chan hostNetResult, 1)
		go func() { served <- srv.serve(time.Now().Add(cfg.timeout)) }()
	}
	guest, wall, err := runOnce(argv, cfg.timeout)
	wallS = wall.Seconds()
	if srv != nil {
		srv.stop() // a guest that never connected leaves serve waiting
		hr := <-served
		host = &hr.hostNet
		if err == nil && hr.err != nil {
			err = fmt.Errorf("host side: %w", hr.err)
		}
	}
	if err == nil {
		values, err = metricValues(cfg.mode, guest, host)
	}
	if err != nil {
		return nil, guest, host, wallS, err.Error()
	}
	return values, guest, host, wallS, ""
}

// hostNet is what the host side of a net run measured.
type hostNet struct {
	// RecvBytes came from the guest in RecvSeconds, from the accept to
	// EOF (guest->host).
	RecvBytes   int64   `json:"recv_bytes"`
	RecvSeconds float64 `json:"recv_seconds"`
	// SentBytes went to the guest (host->guest).
	SentBytes int64 `json:"sent_bytes"`
}

type hostNetResult struct {
	hostNet
	err error
}

// netServer is the host's end of the TCP transfers: listeners on the
// host's address on the TAP, one connection on each per run. Only the
// goroutine running serve accepts; stop may be called from another.
type netServer struct {
	send, recv *net.TCPListener
	d          time.Duration
}

// newNetServer makes the persistent TAP both VMMs attach to, gives it the
// host's address and listens on it. It runs in the program's own network
// namespace.
func newNetServer(d time.Duration) (*netServer, error) {
	if err := ifconf.PersistentTAP(tapName); err != nil {
		return nil, err
	}
	if err := ifconf.Up(tapName, netip.PrefixFrom(netip.MustParseAddr(hostAddr), netip.MustParsePrefix(guestAddr).Bits())); err != nil {
		return nil, err
	}
	listen := func(port int) (*net.TCPListener, error) {
		return net.ListenTCP("tcp4", &net.TCPAddr{IP: net.ParseIP(hostAddr), Port: port})
	}
	s := &netServer{d: d}
	var err error
	if s.send, err = listen(sendPort); err != nil {
		return nil, err
	}
	if s.recv, err = listen(recvPort); err != nil {
		s.send.Close()
		return nil, err
	}
	return s, nil
}

func (s *netServer) close() {
	s.send.Close()
	s.recv.Close()
}

// stop makes a pending Accept return.
func (s *netServer) stop() {
	now := time.Now()
	_ = s.send.SetDeadline(now)
	_ = s.recv.SetDeadline(now)
}

// serve takes one run's two connections: it reads what the guest sends to
// EOF, timing it, then sends to the guest for s.d and closes. Nothing
// blocks past deadline.
func (s *netServer) serve(deadline time.Time) (res hostNetResult) {
	_ = s.send.SetDeadline(deadline)
	_ = s.recv.SetDeadline(deadline)
	buf := make([]byte, 64<<10)
	c, err := s.send.Accept()
	if err != nil {
		res.err = fmt.Errorf("guest->host: accept: %w", err)
		return res
	}
	start := time.Now()
	_ = c.SetDeadline(deadline)
	for {
		n, err := c.Read(buf)
		res.RecvBytes += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			c.Close()
			res.err = fmt.Errorf("guest->host: read after %d bytes: %w", res.RecvBytes, err)
			return res
		}
	}
	res.RecvSeconds = time.Since(start).Seconds()
	c.Close()

	if c, err = s.recv.Accept(); err != nil {
		res.err = fmt.Errorf("host->guest: accept: %w", err)
		return res
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	for end := time.Now().Add(s.d); time.Now().Before(end); {
		n, err := c.Write(buf)
		res.SentBytes += int64(n)
		if err != nil {
			res.err = fmt.Errorf("host->guest: write after %d bytes: %w", res.SentBytes, err)
			return res
		}
	}
	return res
}
