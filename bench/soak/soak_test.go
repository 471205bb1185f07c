package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestMain lets the connection soak start this test binary again as its
// device process.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(envDevice); cfg != "" {
		os.Exit(deviceMain(cfg))
	}
	os.Exit(m.Run())
}

// The short soaks: the same runs as make soak at a size that takes seconds.

// TestSoakConnsShort: 200 connections (half opened by the guest) open at
// once through one device whose limit is 200; the 201st is refused; all
// close and the device gives back every descriptor and goroutine.
func TestSoakConnsShort(t *testing.T) {
	r, err := runConns(connsConfig{Conns: 200, GuestInitiated: 100, Payload: 4096, Hold: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Failures {
		t.Error(f)
	}
	if !r.ExtraTried {
		t.Error("the connection past the limit was not tried")
	}
	var b bytes.Buffer
	printConns(&b, r)
	t.Logf("\n%s", b.String())
}

// TestSoakConnsTightBudget: 200 connections echo 4 KiB each with
// buffer-total room for only 8 full 256 KiB windows. Regression:
// the first connections of the burst took full windows and kept them idle,
// and the rest never got credit to echo.
func TestSoakConnsTightBudget(t *testing.T) {
	r, err := runConns(connsConfig{Conns: 200, GuestInitiated: 100, Payload: 4096, ConnBuffer: 256 << 10, MaxBuffered: 2 << 20, Hold: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Failures {
		t.Error(f)
	}
}

// TestSoakBytesShort: 64 MiB each way per leg, echo over two connections,
// SHA-256 intact.
func TestSoakBytesShort(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	r, err := runBytes(bytesConfig{Guest: guest, Bytes: 64 << 20, Conns: 2, Legs: []string{"echo", "connect"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Legs) != 2 || len(r.Legs[0].SHA256) != 2 {
		t.Fatalf("legs %+v: want echo with 2 digests, then connect", r.Legs)
	}
	var b bytes.Buffer
	printBytes(&b, r)
	t.Logf("\n%s", b.String())
}

// TestSoakCyclesShort: 20 VMs started and stopped without descriptors or
// goroutines left behind.
func TestSoakCyclesShort(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	r, err := runCycles(cyclesConfig{Guest: guest, Cycles: 20, Every: 10, Payload: 64 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Failures {
		t.Error(f)
	}
	if r.Exited != 10 || r.Canceled != 10 || len(r.Samples) != 3 {
		t.Errorf("%d exits, %d cancels, %d samples; want 10, 10, 3", r.Exited, r.Canceled, len(r.Samples))
	}
	var b bytes.Buffer
	printCycles(&b, r)
	t.Logf("\n%s", b.String())
}

func TestParseStatus(t *testing.T) {
	const status = "Name:\tsoak\nVmSize:\t  123456 kB\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nThreads:\t7\n"
	tests := []struct {
		name, in string
		want     usage
		wantErr  bool
	}{
		{"full", status, usage{RSS: 1024 << 10, PeakRSS: 2048 << 10, VmSize: 123456 << 10, Threads: 7}, false},
		{"no threads", strings.Replace(status, "Threads:\t7\n", "", 1), usage{}, true},
		{"no VmHWM", strings.Replace(status, "VmHWM", "VmPeak", 1), usage{}, true},
		{"unit", strings.Replace(status, "1024 kB", "1024 MB", 1), usage{}, true},
		{"not a number", strings.Replace(status, "1024 kB", "x kB", 1), usage{}, true},
	}
	for _, tc := range tests {
		var got usage
		err := parseStatus([]byte(tc.in), &got)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v, want error %v", tc.name, err, tc.wantErr)
			continue
		}
		if err == nil {
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("%s: (-want +got)\n%s", tc.name, d)
			}
		}
	}
}

// TestProcUsageSeesDescriptors: a descriptor opened shows in the count, and
// closing it takes it back out.
func TestProcUsageSeesDescriptors(t *testing.T) {
	u0, err := procUsage(0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	u1, err := procUsage(0)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	u2, _ := procUsage(0)
	if u1.FDs != u0.FDs+1 || u2.FDs != u0.FDs {
		t.Errorf("fds %d, open one: %d, closed: %d", u0.FDs, u1.FDs, u2.FDs)
	}
	if u0.RSS == 0 || u0.PeakRSS < u0.RSS || u0.Goroutines < 1 || u0.HeapAlloc == 0 {
		t.Errorf("usage %+v", u0)
	}
}

func TestCycleLeaks(t *testing.T) {
	s := func(cycle, fds, gor int, rss uint64) cycleSample {
		return cycleSample{cycle, usage{FDs: fds, Goroutines: gor, RSS: rss, VmSize: 1 << 30}}
	}
	tests := []struct {
		name    string
		samples []cycleSample
		memory  bool
		want    int
	}{
		{"flat", []cycleSample{s(0, 10, 5, 50<<20), s(500, 10, 5, 80<<20), s(1000, 11, 6, 81<<20)}, true, 0},
		{"fd per cycle", []cycleSample{s(0, 10, 5, 0), s(10, 20, 5, 0), s(20, 30, 5, 0)}, false, 1},
		{"goroutine per cycle", []cycleSample{s(0, 10, 5, 0), s(10, 10, 15, 0), s(20, 10, 25, 0)}, false, 1},
		{"RSS in the second half", []cycleSample{s(0, 10, 5, 50<<20), s(500, 10, 5, 80<<20), s(1000, 10, 5, 200<<20)}, true, 1},
		{"RSS not checked", []cycleSample{s(0, 10, 5, 50<<20), s(500, 10, 5, 80<<20), s(1000, 10, 5, 200<<20)}, false, 0},
		{"one sample", []cycleSample{s(0, 10, 5, 0)}, true, 0},
	}
	for _, tc := range tests {
		if got := cycleLeaks(tc.samples, tc.memory); len(got) != tc.want {
			t.Errorf("%s: %q, want %d failures", tc.name, got, tc.want)
		}
	}
}

func TestConnsBounds(t *testing.T) {
	base := func() *connsResult {
		r := &connsResult{Config: connsConfig{MaxBuffered: 64 << 20}}
		r.Base.Usage = usage{FDs: 20, Goroutines: 10}
		r.Open.Stats.BufferGranted = 64 << 20
		r.After.Usage = usage{FDs: 20, Goroutines: 10}
		return r
	}
	if got := connsBounds(base()); len(got) != 0 {
		t.Errorf("clean run: %q", got)
	}
	for name, f := range map[string]func(*connsResult){
		"granted past the bound": func(r *connsResult) { r.Held.Stats.BufferGranted = 64<<20 + 1 },
		"connection left":        func(r *connsResult) { r.After.Stats.ConnsOpen = 1 },
		"grant left":             func(r *connsResult) { r.After.Stats.BufferGranted = 4096 },
		"descriptors left":       func(r *connsResult) { r.After.Usage.FDs = 30 },
		"goroutines left":        func(r *connsResult) { r.After.Usage.Goroutines = 13 },
		"guest errors":           func(r *connsResult) { r.After.Stats.GuestErrors = 1 },
	} {
		r := base()
		f(r)
		if got := connsBounds(r); len(got) != 1 {
			t.Errorf("%s: %q, want one failure", name, got)
		}
	}
}

// TestPatternSHA256 checks the digest of the guest's pattern, fed a period
// at a time, against the documented formula byte by byte.
func TestPatternSHA256(t *testing.T) {
	for _, n := range []int64{0, 1, 255, 256, patternPeriod - 1, patternPeriod, 3*patternPeriod + 1000} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte((i*7 + (i >> 8)) & 0xff)
		}
		want := sha256.Sum256(b)
		if got := patternSHA256(n); got != hex.EncodeToString(want[:]) {
			t.Errorf("n %d: %s, want %x", n, got, want)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"10G": 10 << 30, "64MiB": 64 << 20, "4K": 4096, "4096": 4096, "1T": 1 << 40, "2KB": 2048} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1X", "99999999999T"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
}

func TestSizeName(t *testing.T) {
	for n, want := range map[int64]string{4096: "4 KiB", 10 << 30: "10 GiB", 64 << 20: "64 MiB", 40960000: "39.06 MiB",
		2147702912: "2.00 GiB", 3 << 29: "1536 MiB", 100: "100 B", 1<<20 + 1: "1.00 MiB"} {
		if got := sizeName(n); got != want {
			t.Errorf("sizeName(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestRollupRSS(t *testing.T) {
	const rollup = "55e2182c1000-7ffc3e376000 ---p 00000000 00:00 0                          [rollup]\nRss:                1692 kB\nPss:                 240 kB\n"
	if got, ok := rollupRSS([]byte(rollup)); !ok || got != 1692<<10 {
		t.Errorf("rollupRSS = %d, %v; want %d", got, ok, 1692<<10)
	}
	for _, bad := range []string{"Pss: 240 kB\n", "Rss: 12 MB\n", "Rss: x kB\n"} {
		if _, ok := rollupRSS([]byte(bad)); ok {
			t.Errorf("rollupRSS(%q): ok", bad)
		}
	}
}
