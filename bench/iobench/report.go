//go:build linux

package main

import (
	"fmt"
	"io"
	"math"
	"os/exec"
	"slices"
	"strings"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/bench/internal/ioproto"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// metric is one row of the table: a figure computed from one guest result
// (or, for guest->host, from what the host received).
type metric struct {
	Name string `json:"name"`
	Unit string `json:"unit"`
	test string // the guest's ioproto.Result.Test
}

var metrics = map[string][]metric{
	ioproto.ModeBlk: {
		{"seq write 1 MiB", "MB/s", "seq-write-1m"},
		{"seq write 4 KiB", "MB/s", "seq-write-4k"},
		{"seq read 1 MiB", "MB/s", "seq-read-1m"},
		{"seq read 4 KiB", "MB/s", "seq-read-4k"},
		{"rand read 4 KiB", "IOPS", "rand-read-4k"},
	},
	ioproto.ModeNet: {
		{"TCP guest->host", "Mbit/s", "tcp-send"},
		{"TCP host->guest", "Mbit/s", "tcp-recv"},
	},
}

// metricValues turns one run's results into the value of each metric of
// mode: MB/s (10^6 bytes/s), IOPS, or Mbit/s. guest->host is what the host
// received over the host's time; the guest's and the host's byte counts
// must agree.
func metricValues(mode string, guest []ioproto.Result, host *hostNet) (map[string]float64, error) {
	byTest := map[string]ioproto.Result{}
	for _, r := range guest {
		byTest[r.Test] = r
	}
	v := map[string]float64{}
	for _, m := range metrics[mode] {
		r, ok := byTest[m.test]
		if !ok {
			return nil, fmt.Errorf("the guest printed no %s result", m.test)
		}
		switch {
		case m.test == "tcp-send":
			if host == nil || host.RecvSeconds <= 0 {
				return nil, fmt.Errorf("guest->host: no host measurement")
			}
			if host.RecvBytes != r.Bytes {
				return nil, fmt.Errorf("guest->host: the guest sent %d bytes, the host received %d", r.Bytes, host.RecvBytes)
			}
			v[m.Name] = float64(host.RecvBytes) * 8 / host.RecvSeconds / 1e6
		case m.test == "tcp-recv":
			if host == nil || host.SentBytes != r.Bytes {
				return nil, fmt.Errorf("host->guest: the host sent %v bytes, the guest received %d", sent(host), r.Bytes)
			}
			v[m.Name] = float64(r.Bytes) * 8 / r.Seconds / 1e6
		case m.Unit == "IOPS":
			v[m.Name] = float64(r.Ops) / r.Seconds
		default:
			v[m.Name] = float64(r.Bytes) / r.Seconds / 1e6
		}
	}
	return v, nil
}

func sent(h *hostNet) any {
	if h == nil {
		return "no"
	}
	return h.SentBytes
}

// stat summarises one metric's values for one VMM.
type stat struct {
	N      int          `json:"n"`
	Median benchenv.Num `json:"median"`
	Min    benchenv.Num `json:"min"`
	Max    benchenv.Num `json:"max"`
	Values []float64    `json:"values"`
}

// summarise is the median (the mean of the two middle values for an even
// count), minimum and maximum of v; NaN for no values.
func summarise(v []float64) stat {
	s := stat{N: len(v), Values: v}
	if len(v) == 0 {
		nan := benchenv.Num(math.NaN())
		s.Median, s.Min, s.Max = nan, nan, nan
		return s
	}
	sorted := slices.Sorted(slices.Values(v))
	m := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		m = (sorted[len(sorted)/2-1] + m) / 2
	}
	s.Median, s.Min, s.Max = benchenv.Num(m), benchenv.Num(sorted[0]), benchenv.Num(sorted[len(sorted)-1])
	return s
}

// row is one metric for both VMMs.
type row struct {
	metric
	Microvm stat         `json:"microvm"`
	QEMU    stat         `json:"qemu"`
	Ratio   benchenv.Num `json:"microvm_over_qemu"`
}

// runRecord is one VM run.
type runRecord struct {
	VMM       string             `json:"vmm"`
	Iteration int                `json:"iteration"`
	WallS     float64            `json:"wall_s"`
	Values    map[string]float64 `json:"values,omitempty"`
	Guest     []ioproto.Result   `json:"guest,omitempty"`
	Host      *hostNet           `json:"host,omitempty"`
	Error     string             `json:"error,omitempty"`
}

// report is the whole benchmark, as printed and as JSON.
type report struct {
	Mode        string              `json:"mode"`
	Host        map[string]string   `json:"host"`
	InBox       bool                `json:"in_box"`
	QEMUVersion string              `json:"qemu_version"`
	RunsPerVMM  int                 `json:"runs_per_vmm"`
	Seconds     float64             `json:"seconds_per_test"`
	CPUs        int                 `json:"cpus"`
	Memory      string              `json:"memory"`
	DiskBytes   int64               `json:"disk_bytes,omitempty"`
	Kernel      string              `json:"kernel"`
	Argv        map[string][]string `json:"argv"`
	Skipped     []string            `json:"skipped,omitempty"`
	Rows        []row               `json:"rows"`
	Runs        []runRecord         `json:"runs"`
}

func newReport(cfg *config) *report {
	rep := &report{
		Mode: cfg.mode, Host: benchenv.HostInfo(), InBox: testenv.InBox(), QEMUVersion: qemuVersion(cfg.qemu),
		RunsPerVMM: cfg.n, Seconds: cfg.seconds, CPUs: cfg.cpus, Memory: cfg.memory, Kernel: absPath(cfg.kernel),
		Argv: map[string][]string{},
	}
	if cfg.mode == ioproto.ModeBlk {
		rep.DiskBytes = cfg.diskSize
	}
	return rep
}

// qemuVersion is the first line of `qemu --version`, or why there is none.
func qemuVersion(qemu string) string {
	out, err := exec.Command(qemu, "--version").Output()
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}

// summarise fills the rows from the runs that counted.
func (rep *report) summarise() {
	rep.Rows = nil
	for _, m := range metrics[rep.Mode] {
		var mv, qv []float64
		for _, r := range rep.Runs {
			v, ok := r.Values[m.Name]
			switch {
			case !ok || r.Error != "":
			case r.VMM == string(kindMicrovm):
				mv = append(mv, v)
			default:
				qv = append(qv, v)
			}
		}
		r := row{metric: m, Microvm: summarise(mv), QEMU: summarise(qv)}
		r.Ratio = r.Microvm.Median / r.QEMU.Median
		if r.QEMU.Median == 0 {
			r.Ratio = benchenv.Num(math.NaN())
		}
		rep.Rows = append(rep.Rows, r)
	}
}

// allOK reports whether every run counted and no VMM was skipped.
func (rep *report) allOK() bool {
	if len(rep.Skipped) > 0 {
		return false
	}
	for _, r := range rep.Runs {
		if r.Error != "" {
			return false
		}
	}
	return true
}

// print writes the table, what it means and the failed runs.
func (rep *report) print(w io.Writer) {
	fmt.Fprintln(w)
	if rep.Mode == ioproto.ModeBlk {
		fmt.Fprintf(w, "virtio-blk: %d MiB raw image as /dev/vda, O_DIRECT, 1 request in flight, %g s per test;\n",
			rep.DiskBytes>>20, rep.Seconds)
	} else {
		fmt.Fprintf(w, "virtio-net: TCP over a TAP in a private network namespace, 64 KiB writes and reads, %g s each way;\n", rep.Seconds)
	}
	fmt.Fprintf(w, "%d vCPU, %s, %d runs of each VMM, interleaved (host: %s, %s)\n", rep.CPUs, rep.Memory, rep.RunsPerVMM, rep.Host["cpu"], rep.Host["kvm"])
	if rep.InBox {
		fmt.Fprintln(w, "IN THE NESTED-KVM BOX: both VMMs on the box's KVM, whose guests run under QEMU TCG with emulated SVM.")
		fmt.Fprintln(w, "These are TCG/nested figures: a functional comparison of microvm and QEMU doing the same work, NOT performance.")
	}
	fmt.Fprintf(w, "qemu: %s\n\n", rep.QEMUVersion)
	fmt.Fprintf(w, "  %-16s  %-6s  %10s  %-19s  %10s  %-19s  %12s\n", "test", "unit", "microvm", "(min-max)", "qemu", "(min-max)", "microvm/qemu")
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "  %-16s  %-6s  %10s  %-19s  %10s  %-19s  %12s\n", r.Name, r.Unit,
			fmtNum(r.Microvm.Median), fmtRange(r.Microvm), fmtNum(r.QEMU.Median), fmtRange(r.QEMU), fmtRatio(r.Ratio))
	}
	fmt.Fprintln(w, "\nmedians over the runs that counted, (min-max) of those runs; MB/s is 10^6 bytes/s.")
	if rep.Mode == ioproto.ModeNet {
		fmt.Fprintln(w, "guest->host is timed by the host as it receives, host->guest by the guest as it receives.")
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(w, "SKIPPED %s\n", s)
	}
	for _, r := range rep.Runs {
		if r.Error != "" {
			fmt.Fprintf(w, "FAILED %s run %d: %s\n", r.VMM, r.Iteration, r.Error)
		}
	}
}

func fmtNum(n benchenv.Num) string {
	if math.IsNaN(float64(n)) {
		return "-"
	}
	return fmtVal(float64(n))
}

// fmtVal keeps three significant figures for small values (4 KiB MB/s in
// the box are below 1).
func fmtVal(v float64) string {
	if math.Abs(v) < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func fmtRatio(n benchenv.Num) string {
	if math.IsNaN(float64(n)) || math.IsInf(float64(n), 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(n))
}

func fmtRange(s stat) string {
	if s.N == 0 {
		return ""
	}
	return "(" + fmtVal(float64(s.Min)) + "-" + fmtVal(float64(s.Max)) + ")"
}
