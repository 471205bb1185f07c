package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func testGuestConfig() *guestConfig {
	return &guestConfig{microvm: "bin/microvm", guest: "bin/testguest", sizes: []uint64{256 << 20, 4 << 30},
		restores: 3, snaps: 2, clones: 2, cloneSize: 256 << 20, timeout: time.Minute}
}

// fill gives every row of s samples: restores taking base ms (answering
// 5 ms later), snapshots taking 100 ms.
func fill(s *sizeResult, base float64) {
	s.Restore.Samples = []float64{base, base + 2, base + 1}
	s.Answered.Samples = []float64{base + 5, base + 7, base + 6}
	for _, r := range []*row{s.New, s.BootAnswered, s.FirstCall, s.SnapshotCall, s.Write, s.Paused, s.StopCall} {
		r.Samples = []float64{100, 100}
	}
	s.Pause.Samples, s.Resume.Samples = []float64{0.02, 0.03}, []float64{0.004, 0.004}
	s.Disk = diskUse{MemoryBytes: 1 << 20, MemoryLength: int64(s.MemoryBytes), TotalBytes: 2 << 20}
}

func TestGuestReport(t *testing.T) {
	rep := newGuestReport(testGuestConfig(), "pvm", false)
	fill(rep.addSize(256<<20), 10)
	fill(rep.addSize(4<<30), 12)
	c := rep.Clones
	c.Answered.Samples = []float64{40, 50}
	c.Alone = memUse{RSS: 16 << 20, PSS: 16 << 20}
	c.Each = []memUse{{RSS: 16 << 20, PSS: 10 << 20, PSSAnon: 3 << 20, PSSFile: 7 << 20}, {RSS: 18 << 20, PSS: 12 << 20}}
	rep.summarise()

	if rep.FlatRestore != 13.0/11 || rep.FlatAnswered != 18.0/16 {
		t.Errorf("flatness: restore %v, answered %v; want 13/11 and 18/16 (p50s)", rep.FlatRestore, rep.FlatAnswered)
	}
	if c.Sum.RSS != 34<<20 || c.Sum.PSS != 22<<20 || c.MaxRSS != 18<<20 {
		t.Errorf("clone sums: %+v, max RSS %d", c.Sum, c.MaxRSS)
	}
	if c.PSSOverOne != 22.0/16 || c.RSSOverOne != 34.0/16 {
		t.Errorf("clone ratios: PSS %v, RSS %v; want 22/16 and 34/16", c.PSSOverOne, c.RSSOverOne)
	}
	if rep.failed() {
		t.Error("failed() for a report with every figure")
	}

	var out bytes.Buffer
	rep.print(&out)
	for _, s := range []string{
		"native (KVM: pvm)", "4G/256M", "1.18", "target: flat",
		"first Snapshot()", "0.78%", // 2 MiB of 256 MiB
		"2 clones of the 256M snapshot", "one clone alone", "2 clones, sum", "sum of PSS / one clone's RSS: 1.38 (target: well under 2)",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
	if strings.Contains(out.String(), "FAILED") || strings.Contains(out.String(), "NESTED-KVM BOX") {
		t.Errorf("table of a native run without failures:\n%s", out.String())
	}

	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatalf("JSON: %v", err)
	}
	for _, s := range []string{`"where":"native (KVM: pvm)"`, `"sum_pss_over_one_rss":1.375`, `"memory_allocated_bytes":1048576`,
		`"restore_to_guest_answered":{"name":"guest answered","unit":"ms","samples":[15,17,16]`} {
		if !bytes.Contains(b, []byte(s)) {
			t.Errorf("JSON lacks %s:\n%s", s, b)
		}
	}
}

func TestGuestReportFailed(t *testing.T) {
	cfg := testGuestConfig()
	cfg.clones = 0
	rep := newGuestReport(cfg, "none", true)
	s := rep.addSize(256 << 20)
	rep.summarise()
	if !rep.failed() {
		t.Error("a size without restores must count as a failure")
	}
	fill(s, 1)
	s.Answered.Failures = []string{`echo: read: EOF; console: "boom"`}
	rep.summarise()
	if !rep.failed() {
		t.Error("a row with a failure must count as a failure")
	}
	var out bytes.Buffer
	rep.print(&out)
	for _, want := range []string{"TCG (nested-KVM box)", "IN THE NESTED-KVM BOX", "FAILED 256M guest answered: echo: read: EOF\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "boom") {
		t.Errorf("the table shows the console tail (the JSON keeps it):\n%s", out.String())
	}
	// One size: no flatness ratio, and NaN figures encode as null.
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if !bytes.Contains(b, []byte(`"largest_over_smallest_restore_p50":null`)) {
		t.Errorf("JSON: want a null flatness ratio for one size:\n%s", b)
	}
}

func TestLinuxReport(t *testing.T) {
	cfg := &linuxConfig{kernel: "k", agent: "a", busybox: "b", n: 3, cpus: 1, memory: 256 << 20,
		dirty: []uint64{0, 64 << 20}, dirtyMemory: 1 << 30, prefault: true, dropCache: true, timeout: time.Minute}
	rep := newLinuxReport(cfg, "hardware", false)
	var names []string
	for _, w := range rep.Restores {
		names = append(names, w.Name)
	}
	if got := strings.Join(names, "|"); got != "restore|restore --prefault|restore, page cache dropped|restore --prefault, page cache dropped" {
		t.Errorf("restore ways: %s", got)
	}
	rep.Cold.Samples = []float64{300, 320, 310}
	for i, w := range rep.Restores {
		f := float64(i + 1)
		w.Answered.Samples = []float64{10 * f, 30 * f, 20 * f}
		w.Call.Samples = []float64{5, 6, 7}
	}
	rep.SnapshotStop.Samples = []float64{80}
	rep.SnapshotDisk = &diskUse{MemoryBytes: 30 << 20, MemoryLength: 256 << 20, TotalBytes: 31 << 20}
	rep.Dirty = []*dirtyResult{
		{TouchedBytes: 0, GuestUsedBytes: 40 << 20, Disk: diskUse{MemoryBytes: 30 << 20, TotalBytes: 31 << 20}, SnapshotMS: 90, FillMS: nan},
		{TouchedBytes: 64 << 20, GuestUsedBytes: 105 << 20, Disk: diskUse{MemoryBytes: 95 << 20, TotalBytes: 96 << 20}, SnapshotMS: 120, FillMS: 700},
	}
	rep.summarise()
	if rep.ColdOverWarmP50 != 15.5 || rep.ColdOverWarmP99 != 320.0/30 {
		t.Errorf("cold/restore: p50 %v, p99 %v; want 15.5 and 320/30", rep.ColdOverWarmP50, rep.ColdOverWarmP99)
	}
	if rep.failed() {
		t.Error("failed() for a report with every figure")
	}
	var out bytes.Buffer
	rep.print(&out)
	for _, s := range []string{"cold boot to agent answering", "restore to agent answering", "p50 15.50, p99 10.67",
		"restore --prefault, page cache dropped to agent answering", "restore --prefault, page cache dropped: Restore() returned",
		"restore, page cache dropped / restore (p50): 3.00",
		"the snapshot restored: 31.00 MiB on disk", "snapshot size against memory touched", "32.00" /* 96-64 MiB */} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if !bytes.Contains(b, []byte(`"cold_over_restore_p50":15.5`)) || !bytes.Contains(b, []byte(`"fill_ms":null`)) {
		t.Errorf("JSON lacks the ratio or a null fill time:\n%s", b)
	}

	rep.Dirty[1].Failure = "fill /tmp/fill-1: exit 1"
	rep.Restores[1].Answered.Samples = nil
	rep.summarise()
	if !rep.failed() {
		t.Error("no restores and a failed fill: want failed()")
	}
	out.Reset()
	rep.print(&out)
	if !strings.Contains(out.String(), "FAILED touched 64.00 MiB: fill /tmp/fill-1: exit 1") {
		t.Errorf("failure not listed:\n%s", out.String())
	}
}

func TestFmtNum(t *testing.T) {
	for _, tc := range []struct {
		n    num
		want string
	}{
		{num(math.NaN()), "-"}, {num(math.Inf(1)), "-"}, {0, "0"}, {0.0234, "0.023"}, {1.234, "1.23"}, {123.45, "123.5"},
	} {
		if got := fmtNum(tc.n); got != tc.want {
			t.Errorf("fmtNum(%v) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestPercent(t *testing.T) {
	for _, tc := range []struct {
		part, whole int64
		want        string
	}{
		{1, 0, "-"}, {50, 100, "50%"}, {1, 3, "33.3%"}, {1, 1000, "0.10%"},
	} {
		if got := percent(tc.part, tc.whole); got != tc.want {
			t.Errorf("percent(%d, %d) = %q, want %q", tc.part, tc.whole, got, tc.want)
		}
	}
}

func TestFirstLine(t *testing.T) {
	for in, want := range map[string]string{
		`echo: EOF (the VM ended: triple-fault); console: "x"; log: "y"`: "echo: EOF (the VM ended: triple-fault)",
		`Restore: bad; log: "z"`: "Restore: bad",
		"plain":                  "plain",
	} {
		if got := firstLine(in); got != want {
			t.Errorf("firstLine(%q) = %q, want %q", in, got, want)
		}
	}
}
