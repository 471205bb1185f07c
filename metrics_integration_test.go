package microvm_test

// KVM integration tests of the metrics: a vsock transfer through the test
// guest read through the Go API and the Unix socket while it runs, and the
// vCPU exit counters of a tiny guest.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/promtext/promtexttest"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/kvm"
)

// vsockBytes reads the vsock byte counters from an exposition.
func vsockBytes(tb testing.TB, e promtexttest.Exposition) (tx, rx uint64) {
	tb.Helper()
	return uint64(e.Get(tb, `microvm_vsock_tx_bytes_total{device="vsock0"}`)),
		uint64(e.Get(tb, `microvm_vsock_rx_bytes_total{device="vsock0"}`))
}

// TestMetricsVsockTransfer: N bytes echoed through the test guest show as
// exactly N in both vsock byte counters, read through Machine.Metrics and
// through GET /metrics on Config.MetricsSocket while the VM runs: halfway
// (the connection open, N/2 each way) and at the end. A scraper polls the
// socket all along; every reading is well-formed and no counter goes
// down. The transport's interrupt count covers the device's own, the exit
// counters moved, and the socket goes away with Close.
func TestMetricsVsockTransfer(t *testing.T) {
	const n = 16 << 20
	sock := filepath.Join(testenv.ShortDir(t), "m.sock")
	g := newVsockGuestConfig(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort),
		func(c *microvm.Config) { c.MetricsSocket = sock })
	g.start()

	// The scraper: as fast as it can until the transfer is done.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var scrapes, midway int
	var scrapeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var lastTx, lastRx uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			text, resp := scrapeNoFail(sock)
			if resp == nil {
				scrapeErr = errors.New(text)
				return
			}
			ft := &testenv.FakeTB{}
			var tx, rx uint64
			func() {
				defer func() { _ = recover() }()
				tx, rx = vsockBytes(ft, promtexttest.Parse(ft, text))
			}()
			switch {
			case ft.Failed():
				scrapeErr = fmt.Errorf("scrape %d is malformed or lacks the vsock byte counters:\n%s", scrapes, text)
				return
			case tx < lastTx || rx < lastRx:
				scrapeErr = fmt.Errorf("scrape %d: bytes went down: tx %d -> %d, rx %d -> %d", scrapes, lastTx, tx, lastRx, rx)
				return
			case tx > n || rx > n:
				scrapeErr = fmt.Errorf("scrape %d: tx %d rx %d bytes, more than the %d sent", scrapes, tx, rx, n)
				return
			}
			if (tx > 0 && tx < n) || (rx > 0 && rx < n) {
				midway++
			}
			lastTx, lastRx = tx, rx
			scrapes++
		}
	}()

	g.waitListening(vsockTestPort)
	c, err := g.connect(vsockTestPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := randomBytes(t, n)
	// check reads both counters both ways and wants want in each.
	check := func(when string, want uint64) {
		t.Helper()
		api := g.m.Metrics().Vsock
		if api.TxBytes != want || api.RxBytes != want {
			t.Errorf("%s: Metrics().Vsock tx %d rx %d bytes, want %d each", when, api.TxBytes, api.RxBytes, want)
		}
		text, _ := promtexttest.Scrape(t, sock)
		tx, rx := vsockBytes(t, promtexttest.Parse(t, text))
		if tx != want || rx != want {
			t.Errorf("%s: GET /metrics tx %d rx %d bytes, want %d each", when, tx, rx, want)
		}
	}
	// First half: written and read back, the connection stays open.
	half := data[:n/2]
	werr := make(chan error, 1)
	go func() { _, err := c.Write(half); werr <- err }()
	back := make([]byte, len(half))
	if _, err := readFull(c, back); err != nil {
		t.Fatalf("reading the first half's echo: %v; console:\n%s", err, g.console)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if string(back) != string(half) {
		t.Fatal("the first half came back different")
	}
	check("halfway, connection open", n/2)
	// Second half, then the end of the stream.
	rest := data[n/2:]
	go func() {
		_, err := c.Write(rest)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	back = make([]byte, len(rest))
	if _, err := readFull(c, back); err != nil {
		t.Fatalf("reading the second half's echo: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if string(back) != string(rest) {
		t.Fatal("the second half came back different")
	}
	check("all echoed", n)
	close(stop)
	wg.Wait()
	if scrapeErr != nil {
		t.Fatal(scrapeErr)
	}
	t.Logf("%d scrapes during the transfer, %d of them saw it under way", scrapes, midway)
	if scrapes == 0 {
		t.Error("the scraper read nothing during the transfer")
	}

	c.Close()
	g.wait(0, 30*time.Second)
	// The machine has stopped but is not closed: the socket still
	// serves, with the final values.
	check("after Run returned", n)
	m := g.m.Metrics()
	v := m.Vsock
	if v.ConnsEstablished != 1 || v.ConnsRefused != 0 || v.ConnsReset != 0 || v.GuestErrors != 0 {
		t.Errorf("connections established %d refused %d reset %d, guest errors %d; want 1, 0, 0, 0",
			v.ConnsEstablished, v.ConnsRefused, v.ConnsReset, v.GuestErrors)
	}
	if v.Interrupts == 0 || v.Transport.UsedBufferInterrupts < v.Interrupts {
		t.Errorf("transport counted %d used-buffer interrupts, the device %d RX ones: want the transport's to cover the device's",
			v.Transport.UsedBufferInterrupts, v.Interrupts)
	}
	if v.TxKicks == 0 || v.Transport.Activations != 1 {
		t.Errorf("tx kicks %d, activations %d; want some, 1", v.TxKicks, v.Transport.Activations)
	}
	if v.Transport.NotifyExits != 0 {
		t.Errorf("%d queue notifications exited to microvm; want 0: every one through the ioeventfds bound at DRIVER_OK",
			v.Transport.NotifyExits)
	}
	if len(m.VCPUs) != 1 || m.VCPUs[0].Exits[kvm.ExitIO] == 0 || m.VCPUs[0].CPUTime <= 0 {
		t.Errorf("vCPUs %+v: want one, with port I/O exits and CPU time", m.VCPUs)
	}
	text, _ := promtexttest.Scrape(t, sock)
	e := promtexttest.Parse(t, text)
	if got := e.Get(t, `microvm_vcpu_exits_total{vcpu="0",reason="io"}`); uint64(got) != m.VCPUs[0].Exits[kvm.ExitIO] {
		t.Errorf("io exits: %v through the socket, %d through Metrics, of a stopped machine", got, m.VCPUs[0].Exits[kvm.ExitIO])
	}

	if err := g.m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("metrics socket after Close: %v, want it removed", err)
	}
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Error("the metrics socket still answers after Close")
	}
}

// scrapeNoFail is scrape for a goroutine other than the test's: an error
// comes back as the text, with a nil response.
func scrapeNoFail(path string) (string, *struct{}) {
	c := testenv.UnixClient(path)
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://microvm/metrics")
	if err != nil {
		return err.Error(), nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error(), nil
	}
	if resp.StatusCode != 200 {
		return "status " + resp.Status, nil
	}
	return string(b), &struct{}{}
}

// readFull reads len(p) bytes from c.
func readFull(c *hostConn, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := c.Read(p[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestMetricsExits: a tiny guest that writes K console bytes (one port I/O
// exit each) and then its exit status makes at least K+1 io exits, the
// same number through Metrics and the socket, and CPU time.
func TestMetricsExits(t *testing.T) {
	testenv.RequireKVM(t)
	const k = 300
	sock := filepath.Join(testenv.ShortDir(t), "m.sock")
	m, err := microvm.New(microvm.Config{Kernel: testenv.TinyGuest(t, testenv.Program{}.Print(strings.Repeat("x", k)).Exit(0).Halt()),
		MemoryBytes: 16 << 20, Log: quietLog(), MetricsSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	before := m.Metrics().VCPUs[0]
	if len(before.Exits) != 0 || before.CPUTime != 0 {
		t.Errorf("before Run: %+v, want no exits and no CPU time", before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := m.Run(ctx)
	if err != nil || res.Kind != microvm.ExitDebugPort {
		t.Fatalf("Run: %v, %v", res, err)
	}
	after := m.Metrics().VCPUs[0]
	if io := after.Exits[kvm.ExitIO]; io < k+1 {
		t.Errorf("%d io exits, want at least %d (one per console byte, one for the exit port)", io, k+1)
	}
	if after.CPUTime <= 0 {
		t.Errorf("CPU time %v, want some", after.CPUTime)
	}
	text, _ := promtexttest.Scrape(t, sock)
	e := promtexttest.Parse(t, text)
	if got := e.Get(t, `microvm_vcpu_exits_total{vcpu="0",reason="io"}`); uint64(got) != after.Exits[kvm.ExitIO] {
		t.Errorf("io exits: %v through the socket, %d through Metrics", got, after.Exits[kvm.ExitIO])
	}
	if got := e.Get(t, `microvm_vcpu_cpu_seconds_total{vcpu="0"}`); got != after.CPUTime.Seconds() {
		t.Errorf("CPU seconds: %v through the socket, %v through Metrics (the thread has ended: it should not move)", got, after.CPUTime.Seconds())
	}
	t.Logf("vCPU 0: %v, CPU time %v", after.Exits, after.CPUTime)
}
