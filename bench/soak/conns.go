package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/microvm/microvm/bench/internal/vhufront"
	"github.com/microvm/microvm/vsock"
)

// connsConfig is one connection soak: Conns connections open at once
// through one vsock device.
type connsConfig struct {
	Conns int `json:"conns"` // connections open at once
	// GuestInitiated is how many of them the guest opens (to a host
	// listener on "<uds>_5000"); the rest the host opens through the
	// Unix socket's CONNECT handshake.
	GuestInitiated int `json:"guest_initiated"`
	Payload        int `json:"payload"` // bytes each connection moves each way (echoed and compared)
	// The device's limits (vsock.Config; microvm's --vsock-max-conns,
	// --vsock-conn-buffer, --vsock-buffer-total).
	MaxConns       int           `json:"max_conns"`
	ConnBuffer     uint32        `json:"conn_buffer"`
	MaxBuffered    uint64        `json:"max_buffered"`
	ConnectTimeout time.Duration `json:"connect_timeout"`
	Parallel       int           `json:"parallel"` // connection handshakes in flight at once, each side
	Hold           time.Duration `json:"hold"`     // how long all stay open, the guest serving (measured again at the end)
}

// connsResult is what a connection soak measured. The device figures are
// the device process's own (see envDevice).
type connsResult struct {
	Config connsConfig `json:"config"`
	// Base is the device process with the guest driver attached and no
	// connection; Open with every connection open and its bytes echoed;
	// Held after Hold more; After once every connection closed.
	Base, Open, Held, After deviceReport
	// Per connection, (Open or Held, the larger) less Base, over Conns.
	RSSPerConn     float64 `json:"rss_per_conn"`
	HeapPerConn    float64 `json:"heap_per_conn"`
	FDsPerConn     float64 `json:"fds_per_conn"`
	GrantedPerConn float64 `json:"buffer_granted_per_conn"` // Stats.BufferGranted over Conns: the guest->host bytes each may make the device buffer
	PeakRSS        uint64  `json:"device_peak_rss"`         // the device process's most RSS: VmHWM at the end, or a larger sample
	// Soak is this process (guest driver and host clients) with every
	// connection open.
	Soak         usage    `json:"soak_process"`
	OpenSeconds  float64  `json:"open_s"`  // opening every connection and echoing its bytes
	CloseSeconds float64  `json:"close_s"` // from the host closing them to the device's table empty
	BytesChecked int64    `json:"bytes_checked"`
	ExtraTried   bool     `json:"extra_tried"`             // a connection past MaxConns was tried (Conns == MaxConns)
	ExtraRefused string   `json:"extra_refused,omitempty"` // how it was refused
	Failures     []string `json:"failures,omitempty"`
	NoFile       uint64   `json:"rlimit_nofile"`
	Notes        []string `json:"notes,omitempty"`
}

// connectPortHost is the host port the guest-initiated connections go to.
const connectPortHost = 5000

// runConns opens cfg.Conns connections through one vsock device and holds
// them open together. The device runs in its own process (envDevice), wired
// as `microvm vhost-user-vsock` wires it; the guest is bench/internal/
// vhufront's virtio-vsock driver in this process, attached over vhost-user
// with shared memory (no KVM: a real guest kernel is the one thing not in
// the path). Host-initiated connections CONNECT through the device's Unix
// socket; guest-initiated ones make the device dial "<uds>_5000", where
// this process listens. On each, the host writes Payload bytes of a ChaCha8
// stream seeded per connection (so data crossing between connections shows),
// the guest echoes them, and the host compares what comes back. With every
// connection open the device process is measured, and, when Conns is
// MaxConns, one more host connection must be refused. Then the host closes
// them all, the guest resets each on the device's SHUTDOWN, and the device
// must end with no connection, no granted buffer, and the descriptors and
// goroutines it started with.
func runConns(cfg connsConfig, progress io.Writer) (*connsResult, error) {
	if cfg.MaxConns == 0 {
		cfg.MaxConns = cfg.Conns
	}
	if cfg.ConnBuffer == 0 {
		cfg.ConnBuffer = vsock.DefaultConnBuffer
	}
	if cfg.MaxBuffered == 0 {
		// The device's default (what vsock.New picks for 0), named so
		// that the report and the bound check use it.
		cfg.MaxBuffered = vsock.DefaultMaxBufferedFor(cfg.MaxConns, cfg.ConnBuffer)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 128
	}
	if cfg.GuestInitiated < 0 || cfg.GuestInitiated > cfg.Conns {
		return nil, fmt.Errorf("%d guest-initiated connections of %d", cfg.GuestInitiated, cfg.Conns)
	}
	res := &connsResult{Config: cfg}
	var err error
	// This process holds the host end of every connection.
	if res.NoFile, err = raiseNoFile(uint64(cfg.Conns) + 1024); err != nil {
		return nil, err
	}
	if res.NoFile < uint64(cfg.Conns)+256 {
		return nil, fmt.Errorf("RLIMIT_NOFILE is %d: too low for %d connections (raise the hard limit)", res.NoFile, cfg.Conns)
	}
	dir, err := socketDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	uds := socketPath(dir, "v.sock")
	dev, err := startDevice(deviceConfig{Sock: socketPath(dir, "vhu.sock"), UDS: uds, MaxConns: cfg.MaxConns,
		ConnBuffer: cfg.ConnBuffer, MaxBuffered: cfg.MaxBuffered, ConnectTimeout: cfg.ConnectTimeout})
	if err != nil {
		return nil, err
	}
	devClosed := false
	defer func() {
		if !devClosed {
			dev.kill()
		}
	}()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("%s_%d", uds, connectPortHost), Net: "unix"})
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	g, err := vhufront.Start(socketPath(dir, "vhu.sock"), vhufront.Config{CID: 3})
	if err != nil {
		return nil, fmt.Errorf("guest driver: %w (device: %s)", err, dev.stderr.String())
	}
	gClosed := false
	defer func() {
		if !gClosed {
			g.Close()
		}
	}()
	if res.Base, err = dev.report(); err != nil {
		return nil, err
	}
	s := newConnsSoak(g, cfg)
	defer s.releaseAll() // on an early return too: no host end waits for ever
	go s.acceptLoop(ln)

	// Open: host dials and guest connects, Parallel at a time each; every
	// host end echoes its bytes and then waits for release.
	start := time.Now()
	hostN := cfg.Conns - cfg.GuestInitiated
	go s.dialLoop(uds, hostN)
	g.Listen(guestPort, s.guestAdd)
	last := time.Now()
	openLimit := time.Now().Add(time.Duration(max(cfg.Conns/50, 60)) * time.Second)
	err = g.Run(openLimit, s.openWork, func() bool {
		if progress != nil && time.Since(last) > 5*time.Second {
			last = time.Now()
			fmt.Fprintf(progress, "soak conns: %d of %d open and echoed\n", s.verified.Load(), cfg.Conns)
		}
		return s.verified.Load()+s.failed.Load() == int64(cfg.Conns) || s.failed.Load() > 0
	})
	if err == nil {
		err = s.firstErr()
	}
	if err != nil {
		d, derr := dev.report()
		return res, fmt.Errorf("opening: %d of %d open and echoed (guest: %d asked for, %d unanswered, %d in its table, %d owing echo bytes; driver %+v; device %d open, %d bytes granted, %d credit stalls, %v): %w%s",
			s.verified.Load(), cfg.Conns, s.opened, len(s.connecting), g.Conns(), len(s.sending), g.Stats(),
			d.Stats.ConnsOpen, d.Stats.BufferGranted, d.Stats.CreditStalls, derr, err, dev.stderrTail())
	}
	res.OpenSeconds = time.Since(start).Seconds()
	res.BytesChecked = int64(cfg.Conns) * int64(cfg.Payload)
	if res.Open, err = dev.report(); err != nil {
		return res, err
	}
	if res.Soak, err = procUsage(0); err != nil {
		return res, err
	}
	if progress != nil {
		fmt.Fprintf(progress, "soak conns: %d open in %.1f s; device RSS %s MiB (%s MiB before)\n",
			cfg.Conns, res.OpenSeconds, mib(res.Open.Usage.RSS), mib(res.Base.Usage.RSS))
	}
	if got := res.Open.Stats.ConnsOpen; got != int64(cfg.Conns) {
		res.Failures = append(res.Failures, fmt.Sprintf("device has %d connections open, want %d", got, cfg.Conns))
	}
	if g.Conns() != cfg.Conns {
		res.Failures = append(res.Failures, fmt.Sprintf("the guest has %d connections open, want %d", g.Conns(), cfg.Conns))
	}

	// One past the limit must be refused, the guest still serving.
	if cfg.MaxConns == cfg.Conns {
		res.ExtraTried = true
		extra := make(chan error, 1)
		go func() {
			c, _, err := vhufront.DialVsock(uds, guestPort, 10*time.Second)
			if err == nil {
				c.Close()
			}
			extra <- err
		}()
		var xerr error
		got := false
		if err := g.Run(time.Now().Add(15*time.Second), s.openWork, func() bool {
			select {
			case xerr = <-extra:
				got = true
			default:
			}
			return got
		}); err != nil {
			return res, fmt.Errorf("connection past the limit: %w", err)
		}
		if xerr == nil {
			res.Failures = append(res.Failures, fmt.Sprintf("connection %d, past --vsock-max-conns %d, was accepted", cfg.Conns+1, cfg.MaxConns))
		} else {
			res.ExtraRefused = xerr.Error()
		}
	}

	// Hold, the guest serving, then measure again.
	holdEnd := time.Now().Add(cfg.Hold)
	if err := g.Run(holdEnd.Add(time.Second), s.openWork, func() bool { return !time.Now().Before(holdEnd) }); err != nil {
		return res, fmt.Errorf("holding: %w", err)
	}
	if res.Held, err = dev.report(); err != nil {
		return res, err
	}

	// Close: the host closes every connection; the guest resets each on
	// the device's SHUTDOWN; the device's table must empty.
	t0 := time.Now()
	s.releaseAll()
	closeLimit := time.Now().Add(time.Duration(max(cfg.Conns/100, 60)) * time.Second)
	if err := g.Run(closeLimit, s.closeWork, func() bool { return g.Conns() == 0 && s.hostOpen.Load() == 0 }); err != nil {
		return res, fmt.Errorf("closing: %d guest connections, %d host ends left: %w", g.Conns(), s.hostOpen.Load(), err)
	}
	settleLimit := time.Now().Add(10 * time.Second)
	for {
		if res.After, err = dev.report(); err != nil {
			return res, err
		}
		// Sockets close before the table's count drops, and workers
		// (dial goroutines) end within milliseconds: what is still
		// there 10 s after the guest's last connection went is a leak.
		if res.After.Stats.ConnsOpen == 0 && len(afterBounds(res)) == 0 || time.Now().After(settleLimit) {
			break
		}
		_ = g.Run(time.Now().Add(50*time.Millisecond), s.closeWork, func() bool { return false })
	}
	res.CloseSeconds = time.Since(t0).Seconds()

	peak := res.Open
	if res.Held.Usage.RSS > peak.Usage.RSS {
		peak = res.Held
	}
	n := float64(cfg.Conns)
	res.RSSPerConn = (float64(peak.Usage.RSS) - float64(res.Base.Usage.RSS)) / n
	res.HeapPerConn = (float64(peak.Usage.HeapAlloc) - float64(res.Base.Usage.HeapAlloc)) / n
	res.FDsPerConn = float64(peak.Usage.FDs-res.Base.Usage.FDs) / n
	res.GrantedPerConn = float64(peak.Stats.BufferGranted) / n
	// VmHWM is updated lazily: a peak between two updates shows only in
	// the samples.
	res.PeakRSS = max(res.After.Usage.PeakRSS, res.Open.Usage.RSS, res.Held.Usage.RSS)
	res.Failures = append(res.Failures, connsBounds(res)...)

	gClosed = true
	if err := g.Close(); err != nil {
		return res, fmt.Errorf("guest driver close: %w", err)
	}
	devClosed = true
	if err := dev.close(); err != nil {
		return res, err
	}
	return res, nil
}

// connsBounds checks the device's bounds and that closing gave everything
// back.
func connsBounds(r *connsResult) []string {
	var out []string
	cfg := r.Config
	for _, d := range []struct {
		what string
		rep  deviceReport
	}{{"open", r.Open}, {"held", r.Held}} {
		if d.rep.Stats.BufferGranted > cfg.MaxBuffered {
			out = append(out, fmt.Sprintf("%s: device granted %d bytes of buffer, above its bound %d", d.what, d.rep.Stats.BufferGranted, cfg.MaxBuffered))
		}
	}
	return append(out, afterBounds(r)...)
}

// afterBounds checks that closing every connection gave back what they
// held.
func afterBounds(r *connsResult) []string {
	var out []string
	a, b := r.After, r.Base
	if a.Stats.ConnsOpen != 0 || a.Stats.BufferGranted != 0 {
		out = append(out, fmt.Sprintf("after closing: %d connections open, %d bytes of buffer granted; want 0", a.Stats.ConnsOpen, a.Stats.BufferGranted))
	}
	if a.Usage.FDs > b.Usage.FDs+leakSlackFDs {
		out = append(out, fmt.Sprintf("after closing: device process has %d descriptors open (%v), %d before (%v)", a.Usage.FDs, a.Usage.FDKinds, b.Usage.FDs, b.Usage.FDKinds))
	}
	if a.Usage.Goroutines > b.Usage.Goroutines+leakSlackGoroutines {
		out = append(out, fmt.Sprintf("after closing: device process has %d goroutines, %d before", a.Usage.Goroutines, b.Usage.Goroutines))
	}
	if a.Stats.GuestErrors != 0 {
		out = append(out, fmt.Sprintf("device counted %d guest errors", a.Stats.GuestErrors))
	}
	return out
}

// connsSoak is the state of one connection soak. The guest side (guest*,
// open, closing fields) belongs to the soak goroutine, which runs the
// guest driver; host ends run on goroutines of their own and share only
// the atomics, release and the error list.
type connsSoak struct {
	g   *vhufront.Guest
	cfg connsConfig

	// Guest side: every connection, the bytes each owes the host (echo),
	// those with bytes owed, and guest-initiated connections not yet
	// answered.
	conns      []*vhufront.Conn
	owed       map[*vhufront.Conn][]byte
	sending    []*vhufront.Conn
	connecting []*vhufront.Conn
	opened     int // guest-initiated connections asked for
	lastScan   time.Time

	// Host side.
	seeds    atomic.Uint64 // seeds handed to host ends: unique data per connection
	verified atomic.Int64  // host ends whose echo came back equal
	failed   atomic.Int64
	hostOpen atomic.Int64  // host ends not yet closed
	release  chan struct{} // closed (releaseAll): host ends close
	released sync.Once
	errMu    sync.Mutex
	errs     []error
}

func newConnsSoak(g *vhufront.Guest, cfg connsConfig) *connsSoak {
	return &connsSoak{g: g, cfg: cfg, owed: map[*vhufront.Conn][]byte{}, release: make(chan struct{})}
}

// releaseAll lets every host end close its connection.
func (s *connsSoak) releaseAll() { s.released.Do(func() { close(s.release) }) }

func (s *connsSoak) fail(err error) {
	s.errMu.Lock()
	s.errs = append(s.errs, err)
	s.errMu.Unlock()
	s.failed.Add(1)
}

func (s *connsSoak) firstErr() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	if len(s.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%d host ends failed, first: %w", len(s.errs), s.errs[0])
}

// guestAdd makes c an echoing guest connection (Listen's accept, and
// guest-initiated connections as they are asked for).
func (s *connsSoak) guestAdd(c *vhufront.Conn) {
	s.conns = append(s.conns, c)
	c.OnData = func(p []byte) {
		if len(s.owed[c]) == 0 {
			s.sending = append(s.sending, c)
		}
		s.owed[c] = append(s.owed[c], p...)
	}
}

// echo sends what the guest owes, as far as credit and TX slots allow.
func (s *connsSoak) echo() bool {
	progress := false
	keep := s.sending[:0]
	for i, c := range s.sending {
		if s.g.CtlQueued() >= 1024 {
			// A connection without credit asks for it (CREDIT_REQUEST)
			// from Send: thousands starved at once would overflow the
			// driver's control queue. The rest wait for the next turn.
			keep = append(keep, s.sending[i:]...)
			break
		}
		b := s.owed[c]
		n := c.Send(b)
		if n > 0 {
			progress = true
		}
		if n < len(b) && !c.Closed() {
			s.owed[c] = b[n:]
			keep = append(keep, c)
			continue
		}
		delete(s.owed, c)
	}
	clear(s.sending[len(keep):])
	s.sending = keep
	return progress
}

// openWork is the guest's work while connections open: echo, and open
// guest-initiated connections, Parallel unanswered at most.
func (s *connsSoak) openWork() bool {
	progress := s.echo()
	keep := s.connecting[:0]
	for _, c := range s.connecting {
		switch {
		case c.Established():
			progress = true
		case c.Closed():
			s.fail(fmt.Errorf("guest connection %d -> host port %d reset by the device", c.Local, c.Peer))
			progress = true
		default:
			keep = append(keep, c)
		}
	}
	clear(s.connecting[len(keep):])
	s.connecting = keep
	for s.opened < s.cfg.GuestInitiated && len(s.connecting) < s.cfg.Parallel && s.g.CtlQueued() < 256 {
		// OnData from the start: the host's first bytes may come in the
		// same pass as the device's RESPONSE.
		c := s.g.Connect(connectPortHost)
		s.guestAdd(c)
		s.connecting = append(s.connecting, c)
		s.opened++
		progress = true
	}
	return progress
}

// closeWork is the guest's work while the host closes: a connection the
// device shut down is reset (a guest application closing its socket at end
// of stream), keeping the driver's control queue short.
func (s *connsSoak) closeWork() bool {
	progress := s.echo()
	if time.Since(s.lastScan) < 2*time.Millisecond {
		return progress
	}
	s.lastScan = time.Now()
	keep := s.conns[:0]
	for _, c := range s.conns {
		switch {
		case c.Closed():
		case c.PeerShut != 0 && s.g.CtlQueued() < 1024:
			c.Reset()
			delete(s.owed, c)
			progress = true
		default:
			keep = append(keep, c)
		}
	}
	clear(s.conns[len(keep):])
	s.conns = keep
	return progress
}

// dialLoop opens n host-initiated connections, Parallel at a time.
func (s *connsSoak) dialLoop(uds string, n int) {
	sem := make(chan struct{}, s.cfg.Parallel)
	for range n {
		sem <- struct{}{}
		s.hostOpen.Add(1)
		go func() {
			c, _, err := vhufront.DialVsock(uds, guestPort, 30*time.Second)
			if err != nil {
				<-sem
				s.hostOpen.Add(-1)
				s.fail(fmt.Errorf("host connect: %w", err))
				return
			}
			s.hostEnd(c, func() { <-sem })
		}()
	}
}

// acceptLoop takes the guest-initiated connections on the host listener.
func (s *connsSoak) acceptLoop(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.fail(fmt.Errorf("host accept: %w", err))
			}
			return
		}
		s.hostOpen.Add(1)
		go s.hostEnd(c, nil)
	}
}

// hostEnd is one connection's host end: write Payload bytes unique to it,
// read them back and compare, then (calling echoed) hold the connection
// until release and close it.
func (s *connsSoak) hostEnd(c *net.UnixConn, echoed func()) {
	defer s.hostOpen.Add(-1)
	defer c.Close()
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], s.seeds.Add(1))
	data := make([]byte, s.cfg.Payload)
	_, _ = rand.NewChaCha8(key).Read(data)
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	err := echoOnce(c, data)
	if echoed != nil {
		echoed()
	}
	if err != nil {
		s.fail(err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	s.verified.Add(1)
	<-s.release
}
