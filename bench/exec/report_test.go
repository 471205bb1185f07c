package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func testConfig() *config {
	return &config{kernel: "k", agent: "a", busybox: "b", n: 3, execs: 10, warmup: 1,
		streamBytes: 1 << 20, streamReps: 2, cpus: 1, memory: 256 << 20, timeout: time.Minute}
}

func TestReportRatios(t *testing.T) {
	rep := newReport(testConfig(), "hardware", false)
	rep.add(nameReady, viaVsock, "ms", false).Samples = []float64{100, 120, 110}
	rep.add(nameExec, viaVsock, "ms", true).Samples = []float64{4, 2, 3}
	rep.add(nameExec, viaUnix, "ms", true).Samples = []float64{1, 1, 1}
	rep.add(nameStream, viaVsock, "MB/s", false).Samples = []float64{50, 100}
	rep.add(nameStream, viaUnix, "MB/s", false).Samples = []float64{1000, 1000}
	rep.summarise()

	want := []ratioRow{
		{Name: "exec true p50", Unit: "ms", Vsock: 3, Unix: 1, Ratio: 3},
		{Name: "exec true p99", Unit: "ms", Vsock: 4, Unix: 1, Ratio: 4},
		{Name: "stdout stream median", Unit: "MB/s", Vsock: 75, Unix: 1000, Ratio: 0.075},
	}
	if len(rep.Ratios) != len(want) {
		t.Fatalf("ratios: got %+v, want %+v", rep.Ratios, want)
	}
	for i := range want {
		if rep.Ratios[i] != want[i] {
			t.Errorf("ratio %d: got %+v, want %+v", i, rep.Ratios[i], want[i])
		}
	}
	if rep.failed() {
		t.Error("failed() = true for a report with samples in every row and no failures")
	}

	var out bytes.Buffer
	rep.print(&out)
	for _, s := range []string{"boot to agent ready", "vsock/unix", "stdout stream median MB/s", "0.075"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if !bytes.Contains(b, []byte(`"vsock_over_unix":3`)) {
		t.Errorf("JSON lacks the exec p50 ratio: %s", b)
	}
}

func TestReportFailed(t *testing.T) {
	rep := newReport(testConfig(), "hardware", false)
	rep.add(nameExec, viaVsock, "ms", true).Samples = []float64{1}
	empty := rep.add(nameExec, viaUnix, "ms", true)
	rep.summarise()
	if !rep.failed() {
		t.Error("a row without samples must count as a failure")
	}
	empty.Samples = []float64{1}
	empty.Failures = []string{"call 2 of 10: broken"}
	rep.summarise()
	if !rep.failed() {
		t.Error("a row with a failure must count as a failure")
	}
	var out bytes.Buffer
	rep.print(&out)
	if !strings.Contains(out.String(), "FAILED exec true (unix): call 2 of 10: broken") {
		t.Errorf("failure not listed:\n%s", out.String())
	}
}

// TestHostReference runs the host side of the benchmark for real, small:
// the agent on a Unix socket with this host's true and head.
func TestHostReference(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := startHostAgent(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := h.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	lat, err := execTrue(ctx, h.conn.client, 1, 5, 30*time.Second)
	if err != nil || len(lat) != 5 {
		t.Fatalf("execTrue: %d samples, %v; want 5, nil", len(lat), err)
	}
	rates, err := stream(ctx, h.conn.client, 3<<20+17, 2, 30*time.Second)
	if err != nil || len(rates) != 2 || rates[0] <= 0 {
		t.Fatalf("stream: %v, %v; want 2 positive rates", rates, err)
	}
}

func TestTakeFailures(t *testing.T) {
	r := &row{Failures: []string{"a", "b", "c"}}
	got := takeFailures(r, 1)
	if strings.Join(got, ",") != "b,c" || strings.Join(r.Failures, ",") != "a" {
		t.Errorf("takeFailures(a,b,c, 1) = %q, left %q; want [b c], [a]", got, r.Failures)
	}
	if got := takeFailures(r, 1); len(got) != 0 || len(r.Failures) != 1 {
		t.Errorf("nothing to take: got %q, left %q", got, r.Failures)
	}
}

func TestFirstLine(t *testing.T) {
	for in, want := range map[string]string{
		`run 1 of 3: EOF (the VM ended: triple-fault); console: "x; console: y"`: "run 1 of 3: EOF (the VM ended: triple-fault)",
		"no console": "no console",
	} {
		if got := firstLine(in); got != want {
			t.Errorf("firstLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNumJSON(t *testing.T) {
	b, err := json.Marshal([]num{1.5, num(math.NaN()), num(math.Inf(-1)), 0})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "[1.5,null,null,0]"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
