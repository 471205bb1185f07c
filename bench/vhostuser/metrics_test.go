package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm/bench/internal/vhufront"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// metricsClient is an HTTP client of the Unix socket path.
func metricsClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}}
}

// scrapeCounter GETs /metrics and returns the value of series (a name
// with its labels, as written).
func scrapeCounter(c *http.Client, series string) (uint64, error) {
	resp, err := c.Get("http://localhost/metrics")
	if err != nil {
		return 0, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s, %v", resp.Status, err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\d+)$`).FindSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("no %s in:\n%s", series, body)
	}
	return strconv.ParseUint(string(m[1]), 10, 64)
}

// scraper reads a counter over and over while a transfer runs.
type scraper struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	seen []uint64
	err  error
}

func startScraper(c *http.Client, series string) *scraper {
	s := &scraper{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			v, err := scrapeCounter(c, series)
			s.mu.Lock()
			s.seen, s.err = append(s.seen, v), err
			s.mu.Unlock()
			if err != nil {
				return
			}
			select {
			case <-s.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return s
}

// end stops the scraper and returns what it read.
func (s *scraper) end() ([]uint64, error) {
	close(s.stop)
	<-s.done
	return s.seen, s.err
}

// checkScrapes: the readings taken during a transfer of total bytes never
// go down nor past total, and at least one was taken mid-transfer.
func checkScrapes(t *testing.T, what string, seen []uint64, total uint64) {
	t.Helper()
	mid := 0
	for i, v := range seen {
		if v > total || (i > 0 && v < seen[i-1]) {
			t.Errorf("%s: readings %v: not monotonic up to %d", what, seen, total)
			return
		}
		if v > 0 && v < total {
			mid++
		}
	}
	if mid == 0 {
		t.Errorf("%s: none of %d readings was taken mid-transfer (0 < n < %d): %v", what, len(seen), total, seen)
	}
	t.Logf("%s: %d readings, %d mid-transfer, final %d", what, len(seen), mid, total)
}

// TestVhostUserMetrics: `microvm vhost-user-vsock --metrics-socket`
// (bin/microvm, under its seccomp filter) serves the device's counters
// while the Go front-end moves data each way; the byte counters read
// mid-transfer grow, and at the end equal exactly what the host side
// counted. The socket is removed when the back-end stops.
func TestVhostUserMetrics(t *testing.T) {
	bin := testenv.Binary(t)
	mdir, err := os.MkdirTemp("", "vhum")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(mdir)
	msock := filepath.Join(mdir, "m.sock")
	b, err := startBackend([]string{"{bin}", "vhost-user-vsock", "--socket", "{socket}", "--guest-cid", "{cid}",
		"--uds-path", "{uds}", "--metrics-socket", msock}, bin, "", 3, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			b.stop()
		}
	}()
	g, err := b.connect(vhufront.Config{CID: 3}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	client := metricsClient(msock)
	defer client.CloseIdleConnections()
	const (
		payload = 32 << 10
		dur     = 400 * time.Millisecond
		timeout = 30 * time.Second
	)

	t.Run("guest to host", func(t *testing.T) {
		ln, err := vhufront.ListenUnix(b.uds + "_5000")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		sunk := hostSinkAsync(ln, timeout)
		s := startScraper(client, `microvm_vsock_tx_bytes_total{device="vsock0"}`)
		sent, err := g.Source(5000, payload, dur, time.Now().Add(timeout))
		host := <-sunk
		seen, serr := s.end()
		if err != nil || host.err != nil || serr != nil {
			t.Fatalf("guest source: %v; host sink: %v; scrape: %v", err, host.err, serr)
		}
		if sent.Bytes != host.tr.Bytes || sent.Bytes == 0 {
			t.Fatalf("guest sent %d bytes, host received %d", sent.Bytes, host.tr.Bytes)
		}
		final, err := scrapeCounter(client, `microvm_vsock_tx_bytes_total{device="vsock0"}`)
		if err != nil || final != uint64(host.tr.Bytes) {
			t.Errorf("microvm_vsock_tx_bytes_total = %d, %v; the host received %d", final, err, host.tr.Bytes)
		}
		checkScrapes(t, "tx bytes", seen, uint64(host.tr.Bytes))
	})

	t.Run("host to guest", func(t *testing.T) {
		sourced := hostSourceAsync(b.uds, 5001, payload, dur, timeout)
		s := startScraper(client, `microvm_vsock_rx_bytes_total{device="vsock0"}`)
		got, err := g.Sink(5001, time.Now().Add(timeout))
		host := <-sourced
		seen, serr := s.end()
		if err != nil || host.err != nil || serr != nil {
			t.Fatalf("guest sink: %v; host source: %v; scrape: %v", err, host.err, serr)
		}
		if got.Bytes != host.tr.Bytes || got.Bytes == 0 {
			t.Fatalf("host sent %d bytes, guest received %d", host.tr.Bytes, got.Bytes)
		}
		final, err := scrapeCounter(client, `microvm_vsock_rx_bytes_total{device="vsock0"}`)
		if err != nil || final != uint64(host.tr.Bytes) {
			t.Errorf("microvm_vsock_rx_bytes_total = %d, %v; the host sent %d", final, err, host.tr.Bytes)
		}
		checkScrapes(t, "rx bytes", seen, uint64(host.tr.Bytes))
	})

	for series, want := range map[string]uint64{
		`microvm_vhost_user_frontends_total`:                              1,
		`microvm_vhost_user_frontend_errors_total`:                        0,
		`microvm_vsock_connections_established_total{device="vsock0"}`:    2,
		`microvm_vsock_guest_errors_total{device="vsock0",kind="header"}`: 0,
	} {
		if got, err := scrapeCounter(client, series); err != nil || got != want {
			t.Errorf("%s = %d, %v; want %d", series, got, err, want)
		}
	}
	client.CloseIdleConnections()
	stopped = true
	if err := b.stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	if _, err := os.Lstat(msock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("metrics socket after the back-end stopped: %v, want it removed", err)
	}
}

// hostResult is what a host end of a transfer measured.
type hostResult struct {
	tr  vhufront.Transfer
	err error
}

// hostSinkAsync accepts one connection on ln and reads it to its end, in
// a goroutine of its own; the channel gets the result.
func hostSinkAsync(ln *net.UnixListener, timeout time.Duration) <-chan hostResult {
	sunk := make(chan hostResult, 1)
	go func() {
		c, err := vhufront.AcceptOne(ln, timeout)
		if err != nil {
			sunk <- hostResult{err: err}
			return
		}
		defer c.Close()
		tr, err := vhufront.HostSink(c, 64<<10, timeout)
		sunk <- hostResult{tr, err}
	}()
	return sunk
}

// hostSourceAsync CONNECTs to the back-end's socket uds for the guest's
// port and sends payload-sized writes for dur, in a goroutine of its own.
func hostSourceAsync(uds string, port uint32, payload int, dur, timeout time.Duration) <-chan hostResult {
	sourced := make(chan hostResult, 1)
	go func() {
		c, _, err := vhufront.DialVsock(uds, port, timeout)
		if err != nil {
			sourced <- hostResult{err: err}
			return
		}
		defer c.Close()
		tr, err := vhufront.HostSource(c, payload, dur, timeout)
		sourced <- hostResult{tr, err}
	}()
	return sourced
}
