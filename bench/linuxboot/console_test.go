package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseKernelLine(t *testing.T) {
	tests := []struct {
		line   string
		ts     float64
		msg    string
		kernel bool
	}{
		{"[    0.123456] Run /init as init process", 0.123456, "Run /init as init process", true},
		{"[12345.000001] x", 12345.000001, "x", true},
		{"[    1.500000]", 1.5, "", true},
		{"[    0.000000] Linux version 6.1.0 (microvm@microvm)", 0, "Linux version 6.1.0 (microvm@microvm)", true},
		{"init: ready", 0, "", false},
		{"", 0, "", false},
		{"[", 0, "", false},
		{"[]", 0, "", false},
		{"[  ] empty", 0, "", false},
		{"[ 1.2.3] two dots", 0, "", false},
		{"[ 12] no dot", 0, "", false},
		{"[ 1e3.0] exponent", 0, "", false},
		{"[   NaN.] not a number", 0, "", false},
		{"[    0.1 no bracket", 0, "", false},
		{"  [    0.100000] indented", 0, "", false},
	}
	for _, tc := range tests {
		ts, msg, ok := parseKernelLine(tc.line)
		if ok != tc.kernel || ts != tc.ts || msg != tc.msg {
			t.Errorf("parseKernelLine(%q) = %v, %q, %v; want %v, %q, %v", tc.line, ts, msg, ok, tc.ts, tc.msg, tc.kernel)
		}
	}
}

func TestIsRunInit(t *testing.T) {
	tests := []struct {
		msg  string
		want bool
	}{
		{"Run /init as init process", true},
		{"Run /sbin/init as init process", true},
		{"Run /init as init process ", true},
		{"Run init as init process", false}, // not a path
		{"Run /init as init", false},
		{"Trying to run /init as init process", false},
		{"Run /a b as init process", false},
		{"Run  as init process", false},
	}
	for _, tc := range tests {
		if got := isRunInit(tc.msg); got != tc.want {
			t.Errorf("isRunInit(%q) = %v, want %v", tc.msg, got, tc.want)
		}
	}
}

// fakeClock hands out times one millisecond apart, starting 1 ms after
// start.
func fakeClock(start time.Time) func() time.Time {
	n := 0
	return func() time.Time {
		n++
		return start.Add(time.Duration(n) * time.Millisecond)
	}
}

// feed writes chunks to a console with a fake clock: chunk i arrives at
// i+1 ms.
func feed(chunks ...string) *console {
	start := time.Unix(1000, 0)
	c := newConsole(start)
	c.now = fakeClock(start)
	for _, ch := range chunks {
		_, _ = c.Write([]byte(ch))
	}
	return c
}

func TestConsoleBoot(t *testing.T) {
	c := feed(
		"[    0.000000] Linux version 6.1.0\r\n[    0.412345] Freeing unused kernel image memory: 1000K\r\n",
		"[    0.523456] Run /init as init process\r\n",
		"init: re",       // the ready line split across two writes
		"ady\r\ninit: v", // complete at 4 ms
		"sock unavailable: no device\r\ninit: no scenarios\r\ninit: done ok\r\n",
		"[    0.900000] reboot: Restarting system\r\n",
	)
	if c.ready != 4*time.Millisecond {
		t.Errorf("ready = %v, want 4ms (the write that completed the line)", c.ready)
	}
	if !c.hasRunInit || c.runInit != 0.523456 {
		t.Errorf("runInit = %v (seen %v), want 0.523456", c.runInit, c.hasRunInit)
	}
	if c.done != "ok" {
		t.Errorf("done = %q, want ok", c.done)
	}
	if c.panicked != "" {
		t.Errorf("panicked = %q, want none", c.panicked)
	}
	if !strings.HasSuffix(c.all.String(), "Restarting system\r\n") {
		t.Errorf("console lost output: %q", c.all.String())
	}
}

func TestConsoleReadyWithoutNewline(t *testing.T) {
	c := feed("[    0.5] Run /init as init process\n", "init: ready")
	if c.ready != 2*time.Millisecond {
		t.Errorf("ready = %v, want 2ms", c.ready)
	}
	// The line's '\n' arriving later must not move the time.
	_, _ = c.Write([]byte("\n"))
	if c.ready != 2*time.Millisecond {
		t.Errorf("after newline: ready = %v, want 2ms", c.ready)
	}
}

func TestConsoleFirstMilestoneWins(t *testing.T) {
	c := feed("init: ready\n", "[ 1.000000] Run /init as init process\n", "init: ready\n",
		"[ 2.000000] Run /init as init process\ninit: done fail\ninit: done ok\n")
	if c.ready != time.Millisecond || c.runInit != 1 || c.done != "fail" {
		t.Errorf("ready %v runInit %v done %q; want 1ms, 1, fail", c.ready, c.runInit, c.done)
	}
}

func TestConsolePanic(t *testing.T) {
	c := feed("[    0.700000] Kernel panic - not syncing: No working init found.\r\n",
		"[    0.700001] Kernel panic - again\r\n")
	if c.panicked != "[    0.700000] Kernel panic - not syncing: No working init found." {
		t.Errorf("panicked = %q", c.panicked)
	}
	if c.ready != 0 || c.hasRunInit || c.done != "" {
		t.Errorf("milestones after a panic only: ready %v runInit %v done %q", c.ready, c.hasRunInit, c.done)
	}
}

func TestSummarise(t *testing.T) {
	runs := []sample{
		{ReadyMS: 30, KernelRunInitMS: num(math.NaN())},
		{ReadyMS: 10, KernelRunInitMS: 5},
		{ReadyMS: 40, KernelRunInitMS: 7},
		{ReadyMS: 20, KernelRunInitMS: 6},
	}
	got := summarise(runs, func(s sample) float64 { return s.ReadyMS })
	want := stat{N: 4, Median: 25, Min: 10, Max: 40, P10: 10, P90: 40}
	if got != want {
		t.Errorf("ready: got %+v, want %+v", got, want)
	}
	got = summarise(runs, func(s sample) float64 { return float64(s.KernelRunInitMS) })
	want = stat{N: 3, Median: 6, Min: 5, Max: 7, P10: 5, P90: 7}
	if got != want {
		t.Errorf("kernel ts (NaN left out): got %+v, want %+v", got, want)
	}
	empty := summarise(nil, func(s sample) float64 { return s.ReadyMS })
	if empty.N != 0 || !math.IsNaN(float64(empty.Median)) {
		t.Errorf("no runs: got %+v, want N 0 and NaN", empty)
	}
}

func TestNumJSON(t *testing.T) {
	b, err := json.Marshal([]num{1.5, num(math.NaN()), num(math.Inf(1)), 0})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "[1.5,null,null,0]"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
