package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// bytesConfig is one bulk-transfer soak through the test guest.
type bytesConfig struct {
	Guest string `json:"guest"`
	// Bytes is what each leg moves each way.
	Bytes int64 `json:"bytes"`
	// Conns is how many connections the echo leg splits Bytes over, run
	// at once (the test guest serves up to 128).
	Conns int `json:"conns"`
	// Legs are the legs run, in order: "echo" (host-initiated, host
	// random data, the guest echoes) and "connect" (guest-initiated, the
	// guest's pattern, the host echoes).
	Legs   []string `json:"legs"`
	Memory uint64   `json:"memory"` // guest RAM
}

// chunk is the host's read and write size.
const chunk = 256 << 10

// bytesLeg is one leg's figures.
type bytesLeg struct {
	Leg string `json:"leg"`
	// ToGuest and FromGuest are the payload bytes the device moved each
	// way (its TxBytes and RxBytes counters: what crossed the rings), and
	// Checked says how each direction was verified.
	ToGuest   uint64 `json:"to_guest"`
	FromGuest uint64 `json:"from_guest"`
	Checked   string `json:"checked"`
	// SHA256 is the digest both ends agreed on (one per connection for
	// the echo leg, sent = received; for the connect leg, what the host
	// received = the digest of the guest's pattern).
	SHA256  []string `json:"sha256"`
	Seconds float64  `json:"seconds"`
	// MBps is megabytes (10^6) per second each way: Bytes over the
	// leg's wall time, the directions running at the same time.
	MBps        float64 `json:"mb_per_s_each_way"`
	GuestErrors uint64  `json:"device_guest_errors"`
	Before      usage   `json:"before"`
	After       usage   `json:"after"` // after Close
	// Guest is the test guest's own report (connect leg: "connect ok").
	Guest string `json:"guest_line,omitempty"`
}

// bytesResult is what a bulk-transfer soak measured.
type bytesResult struct {
	Config  bytesConfig `json:"config"`
	Legs    []bytesLeg  `json:"legs"`
	NoFile  uint64      `json:"rlimit_nofile"`
	HostKVM string      `json:"host_kvm"`
	Notes   []string    `json:"notes,omitempty"`
}

// runBytes runs each leg in a fresh machine (the Go API, in this process).
// It fails on any byte out of place: a digest or count that differs, a
// guest that reports a mismatch, device counters that do not add up to
// exactly the bytes sent, or guest errors counted by the device.
func runBytes(cfg bytesConfig, progress io.Writer) (*bytesResult, error) {
	if cfg.Conns <= 0 {
		cfg.Conns = 1
	}
	if cfg.Memory == 0 {
		cfg.Memory = 64 << 20
	}
	res := &bytesResult{Config: cfg, HostKVM: testenv.Host().String()}
	var err error
	if res.NoFile, err = raiseNoFile(1024); err != nil {
		return nil, err
	}
	for _, leg := range cfg.Legs {
		var l *bytesLeg
		switch leg {
		case "echo":
			l, err = echoLeg(cfg, progress)
		case "connect":
			l, err = connectLeg(cfg, progress)
		default:
			err = fmt.Errorf("unknown leg %q (want echo or connect)", leg)
		}
		if err != nil {
			return res, fmt.Errorf("%s leg: %w", leg, err)
		}
		res.Legs = append(res.Legs, *l)
	}
	return res, nil
}

// meter reports progress every tenth of total bytes counted (atomic:
// several connections' readers share one).
type meter struct {
	n, step, next atomic.Int64
	what          string
	total         int64
	out           io.Writer
	start         time.Time
}

func newMeter(what string, total int64, out io.Writer) *meter {
	m := &meter{what: what, total: total, out: out, start: time.Now()}
	m.step.Store(max(total/10, 1))
	m.next.Store(m.step.Load())
	return m
}

func (m *meter) add(k int) {
	n := m.n.Add(int64(k))
	if m.out == nil {
		return
	}
	for {
		nx := m.next.Load()
		if n < nx {
			return
		}
		if m.next.CompareAndSwap(nx, nx+m.step.Load()) {
			el := time.Since(m.start).Seconds()
			fmt.Fprintf(m.out, "soak bytes: %s: %s of %s back (%.0f MB/s)\n", m.what, sizeName(n), sizeName(m.total), float64(n)/el/1e6)
		}
	}
}

// echoLeg: the guest echoes (testguest.mode=echo); Conns host connections
// each write their share of Bytes from a ChaCha8 stream seeded by the
// connection's index, hashing what they write, and hash what comes back;
// each connection's two SHA-256 digests and counts must agree.
func echoLeg(cfg bytesConfig, progress io.Writer) (*bytesLeg, error) {
	l := &bytesLeg{Leg: "echo", Checked: "host: SHA-256 of the random bytes written = SHA-256 of the bytes echoed back, per connection (covers both directions)"}
	dir, err := socketDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if l.Before, err = procUsage(0); err != nil {
		return nil, err
	}
	cmdline := fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=%d", guestPort, cfg.Conns)
	v, err := startVM(cfg.Guest, cmdline, socketPath(dir, "v.sock"), cfg.Memory)
	if err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			_ = v.stop(10 * time.Second)
			_ = v.close()
		}
	}()
	if err := v.waitListening(guestPort, 20*time.Second); err != nil {
		return nil, err
	}
	m := newMeter("echo", cfg.Bytes, progress)
	start := time.Now()
	type out struct {
		sum string
		err error
	}
	outs := make([]out, cfg.Conns)
	var wg sync.WaitGroup
	for k := range cfg.Conns {
		share := cfg.Bytes / int64(cfg.Conns)
		if k == cfg.Conns-1 {
			share = cfg.Bytes - share*int64(cfg.Conns-1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[k].sum, outs[k].err = echoConn(v.uds, uint64(k), share, m)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	for k, o := range outs {
		if o.err != nil {
			return nil, fmt.Errorf("connection %d: %w%s", k, o.err, v.output())
		}
		l.SHA256 = append(l.SHA256, o.sum)
	}
	if err := v.wait(0, 30*time.Second); err != nil {
		return nil, err
	}
	st := v.m.VsockStats()
	l.ToGuest, l.FromGuest, l.GuestErrors = st.RxBytes, st.TxBytes, st.GuestErrors
	closed = true
	if err := v.close(); err != nil {
		return nil, err
	}
	if l.After, err = procUsage(0); err != nil {
		return nil, err
	}
	l.Seconds = el.Seconds()
	l.MBps = float64(cfg.Bytes) / el.Seconds() / 1e6
	return l, legCounters(l, cfg.Bytes)
}

// legCounters checks the device moved exactly n bytes each way, with no
// guest error.
func legCounters(l *bytesLeg, n int64) error {
	if l.ToGuest != uint64(n) || l.FromGuest != uint64(n) {
		return fmt.Errorf("device payload bytes to guest %d, from guest %d; want %d each", l.ToGuest, l.FromGuest, n)
	}
	if l.GuestErrors != 0 {
		return fmt.Errorf("device counted %d guest errors", l.GuestErrors)
	}
	return nil
}

// echoConn moves n bytes through one echo connection: see echoLeg.
func echoConn(uds string, seed uint64, n int64, m *meter) (string, error) {
	c, _, err := testenv.VsockConnect(uds, guestPort, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	src := rand.NewChaCha8(key)
	sent := sha256.New()
	werr := make(chan error, 1)
	go func() {
		buf := make([]byte, chunk)
		for left := n; left > 0; {
			b := buf[:min(left, chunk)]
			_, _ = src.Read(b) // never fails
			sent.Write(b)
			if _, err := c.Write(b); err != nil {
				werr <- err
				return
			}
			left -= int64(len(b))
		}
		werr <- c.CloseWrite()
	}()
	got := sha256.New()
	k, rerr := copyHashed(got, c, m)
	if err := <-werr; err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	if rerr != nil {
		return "", fmt.Errorf("read after %d bytes: %w", k, rerr)
	}
	if k != n {
		return "", fmt.Errorf("%d bytes echoed, %d sent", k, n)
	}
	ws, gs := hex.EncodeToString(sent.Sum(nil)), hex.EncodeToString(got.Sum(nil))
	if ws != gs {
		return "", fmt.Errorf("SHA-256 of the bytes sent %s, of those echoed %s", ws, gs)
	}
	return ws, nil
}

// copyHashed reads r to end of stream into h, counting on m.
func copyHashed(h hash.Hash, r io.Reader, m *meter) (int64, error) {
	buf := make([]byte, chunk)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			n += int64(k)
			m.add(k)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// connectPort is the host port the connect leg's guest dials.
const connectPort = 5000

// connectLeg: the guest (testguest.mode=connect) connects to a host echo
// server on "<uds>_5000", sends Bytes of its pattern and compares every
// byte echoed back with it (the guest has no SHA-256; it exits 4 on the
// first byte out of place); the host hashes what it receives before
// echoing it and compares that with the SHA-256 of Bytes of the pattern.
func connectLeg(cfg bytesConfig, progress io.Writer) (*bytesLeg, error) {
	l := &bytesLeg{Leg: "connect", Checked: "host: SHA-256 of the bytes received = SHA-256 of the guest's pattern; guest: every byte echoed compared with its pattern"}
	dir, err := socketDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	uds := socketPath(dir, "v.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("%s_%d", uds, connectPort), Net: "unix"})
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	want := make(chan string, 1)
	go func() { want <- patternSHA256(cfg.Bytes) }()
	if l.Before, err = procUsage(0); err != nil {
		return nil, err
	}
	m := newMeter("connect", cfg.Bytes, progress)
	type out struct {
		n   int64
		sum string
		err error
	}
	served := make(chan out, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			served <- out{err: err}
			return
		}
		defer c.Close()
		h := sha256.New()
		n, err := io.Copy(c, io.TeeReader(c, meterWriter{h, m}))
		if err == nil {
			err = c.CloseWrite()
		}
		served <- out{n, hex.EncodeToString(h.Sum(nil)), err}
	}()
	start := time.Now()
	cmdline := fmt.Sprintf("testguest.mode=connect testguest.port=%d testguest.bytes=%d", connectPort, cfg.Bytes)
	v, err := startVM(cfg.Guest, cmdline, uds, cfg.Memory)
	if err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			_ = v.stop(10 * time.Second)
			_ = v.close()
		}
	}()
	// The guest ends by itself: status 0 once every byte came back equal.
	limit := time.Duration(max(cfg.Bytes/(10<<20), 60)) * time.Second // 10 MiB/s at worst
	if err := v.wait(0, limit); err != nil {
		return nil, err
	}
	el := time.Since(start)
	var o out
	select {
	case o = <-served:
	case <-time.After(10 * time.Second):
		return nil, errors.New("host echo server still running after the guest exited")
	}
	if o.err != nil {
		return nil, fmt.Errorf("host echo server: %w", o.err)
	}
	line := ""
	for _, s := range strings.Split(v.console.String(), "\n") {
		if strings.HasPrefix(s, "testguest: connect ok: ") {
			line = s
		}
	}
	if !strings.HasPrefix(line, fmt.Sprintf("testguest: connect ok: %d bytes echoed", cfg.Bytes)) {
		return nil, fmt.Errorf("no 'connect ok: %d bytes' line%s", cfg.Bytes, v.output())
	}
	l.Guest = line
	if o.n != cfg.Bytes {
		return nil, fmt.Errorf("host received %d bytes, want %d", o.n, cfg.Bytes)
	}
	if w := <-want; o.sum != w {
		return nil, fmt.Errorf("SHA-256 of the bytes received %s, of the guest's pattern %s", o.sum, w)
	}
	l.SHA256 = []string{o.sum}
	st := v.m.VsockStats()
	l.ToGuest, l.FromGuest, l.GuestErrors = st.RxBytes, st.TxBytes, st.GuestErrors
	closed = true
	if err := v.close(); err != nil {
		return nil, err
	}
	if l.After, err = procUsage(0); err != nil {
		return nil, err
	}
	l.Seconds = el.Seconds()
	l.MBps = float64(cfg.Bytes) / el.Seconds() / 1e6
	return l, legCounters(l, cfg.Bytes)
}

// meterWriter hashes and counts what is written to it.
type meterWriter struct {
	h hash.Hash
	m *meter
}

func (w meterWriter) Write(p []byte) (int, error) {
	w.h.Write(p)
	w.m.add(len(p))
	return len(p), nil
}

// patternPeriod is the test guest's pattern's period: byte i is
// (i*7 + (i>>8)) & 0xff, which depends only on i mod 65536
// (docs/testguest.md, "The data pattern").
const patternPeriod = 1 << 16

// guestPattern returns one period of the test guest's stream pattern.
func guestPattern() []byte {
	b := make([]byte, patternPeriod)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// patternSHA256 is the SHA-256 of the first n bytes of the test guest's
// pattern, in hex.
func patternSHA256(n int64) string {
	p := guestPattern()
	h := sha256.New()
	for ; n >= patternPeriod; n -= patternPeriod {
		h.Write(p)
	}
	h.Write(p[:n])
	return hex.EncodeToString(h.Sum(nil))
}
