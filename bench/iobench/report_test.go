//go:build linux

package main

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/microvm/microvm/bench/internal/ioproto"
)

func TestSummarise(t *testing.T) {
	for _, tc := range []struct {
		in            []float64
		med, min, max float64
	}{
		{[]float64{5}, 5, 5, 5},
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
	} {
		s := summarise(tc.in)
		if float64(s.Median) != tc.med || float64(s.Min) != tc.min || float64(s.Max) != tc.max || s.N != len(tc.in) {
			t.Errorf("summarise(%v) = %+v, want median %g min %g max %g", tc.in, s, tc.med, tc.min, tc.max)
		}
	}
	if s := summarise(nil); s.N != 0 || !math.IsNaN(float64(s.Median)) {
		t.Errorf("summarise(nil) = %+v, want NaN median", s)
	}
}

func TestMetricValuesBlk(t *testing.T) {
	var guest []ioproto.Result
	for _, m := range metrics[ioproto.ModeBlk] {
		guest = append(guest, ioproto.Result{Test: m.test, Ops: 500, Bytes: 2e6, Seconds: 0.5})
	}
	v, err := metricValues(ioproto.ModeBlk, guest, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := v["seq read 1 MiB"]; got != 4 {
		t.Errorf("seq read 1 MiB = %g MB/s, want 4", got)
	}
	if got := v["rand read 4 KiB"]; got != 1000 {
		t.Errorf("rand read 4 KiB = %g IOPS, want 1000", got)
	}
	if _, err := metricValues(ioproto.ModeBlk, guest[1:], nil); err == nil || !strings.Contains(err.Error(), "seq-write-1m") {
		t.Errorf("a missing result: err %v, want one naming seq-write-1m", err)
	}
}

func TestMetricValuesNet(t *testing.T) {
	guest := []ioproto.Result{
		{Test: "tcp-send", Bytes: 1e6, Seconds: 1.9},
		{Test: "tcp-recv", Bytes: 3e6, Seconds: 2},
	}
	host := &hostNet{RecvBytes: 1e6, RecvSeconds: 2, SentBytes: 3e6}
	v, err := metricValues(ioproto.ModeNet, guest, host)
	if err != nil {
		t.Fatal(err)
	}
	// guest->host on the host's clock, host->guest on the guest's.
	if v["TCP guest->host"] != 4 || v["TCP host->guest"] != 12 {
		t.Errorf("values %v, want guest->host 4 and host->guest 12 Mbit/s", v)
	}
	for _, bad := range []*hostNet{nil, {RecvBytes: 999, RecvSeconds: 2, SentBytes: 3e6}, {RecvBytes: 1e6, RecvSeconds: 2, SentBytes: 1}} {
		if _, err := metricValues(ioproto.ModeNet, guest, bad); err == nil {
			t.Errorf("host %+v: no error, want a disagreement", bad)
		}
	}
}

func TestConsole(t *testing.T) {
	c := &console{}
	r := ioproto.Result{Test: "seq-read-4k", Ops: 3, Bytes: 12288, Seconds: 1}
	// Lines split across writes, with CRs, among kernel messages.
	for _, w := range []string{"[ 1.0] virtio_blk\r\n" + r.Line()[:10], r.Line()[10:] + "\r\n", ioproto.DoneLine, "\r\n"} {
		c.Write([]byte(w))
	}
	if !c.done || len(c.results) != 1 || c.results[0] != r || len(c.bad) != 0 {
		t.Errorf("console: done %v results %+v bad %v", c.done, c.results, c.bad)
	}
	c = &console{}
	c.Write([]byte(ioproto.ErrorPrefix + "open /dev/vda: ENOENT\n[ 2.0] Kernel panic - not syncing: x\n"))
	if c.guestErr != "open /dev/vda: ENOENT" || !strings.HasPrefix(c.panicked, "[ 2.0] Kernel panic") || c.done {
		t.Errorf("console: guestErr %q panicked %q done %v", c.guestErr, c.panicked, c.done)
	}
}

func TestArgv(t *testing.T) {
	cfg := &config{mode: ioproto.ModeBlk, cpus: 1, memory: "256M", acpi: "off", seconds: 2,
		microvm: "bin/microvm", qemu: "qemu-system-x86_64", kernel: "K"}
	m := cfg.argv(kindMicrovm, "I", "IMG")
	q := cfg.argv(kindQEMU, "I", "IMG")
	if !slices.Contains(m, "path=IMG") || !slices.Contains(q, "file=IMG,if=none,id=d0,format=raw") {
		t.Errorf("blk argv without the image:\n%q\n%q", m, q)
	}
	// Same guest parameters for both; only the reboot method differs.
	mc, qc := m[slices.Index(m, "--cmdline")+1], q[slices.Index(q, "-append")+1]
	if strings.Replace(mc, "reboot=k", "reboot=t", 1) != qc {
		t.Errorf("command lines differ beyond reboot=:\n%s\n%s", mc, qc)
	}
	if p, err := ioproto.ParseCmdline(mc); err != nil || p.Dev != "/dev/vda" {
		t.Errorf("guest parameters %q: %+v, %v", mc, p, err)
	}
	cfg.mode = ioproto.ModeNet
	m, q = cfg.argv(kindMicrovm, "I", ""), cfg.argv(kindQEMU, "I", "")
	if !slices.Contains(m, "tap="+tapName+",mac="+guestMAC) || !slices.Contains(q, "virtio-net-device,netdev=n0,mac="+guestMAC) {
		t.Errorf("net argv without the TAP:\n%q\n%q", m, q)
	}
}
