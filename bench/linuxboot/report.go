package main

import (
	"fmt"
	"io"
	"math"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

// num is a figure that encodes as JSON null when it is missing.
type num = benchenv.Num

// sample is one successful run. Times are milliseconds from just before the
// VMM's process started, but KernelRunInitMS, which is guest time.
type sample struct {
	ReadyMS         float64 `json:"ready_ms"`           // "init: ready" on the console
	ExitMS          float64 `json:"exit_ms"`            // the VMM's exit
	KernelRunInitMS num     `json:"kernel_run_init_ms"` // printk time of "Run /init as init process"; null if not seen
	CPUMS           float64 `json:"cpu_ms"`             // user+sys of the VMM process
	RSSKiB          int64   `json:"rss_kib"`            // its peak RSS
}

// stat summarises one figure over a row's runs.
type stat struct {
	N      int `json:"n"`
	Median num `json:"median"`
	Min    num `json:"min"`
	Max    num `json:"max"`
	P10    num `json:"p10"`
	P90    num `json:"p90"`
}

// row is one VMM booting one kernel.
type row struct {
	Kernel     string   `json:"kernel"` // the kernel file's base name
	KernelPath string   `json:"kernel_path"`
	VMM        vmmKind  `json:"vmm"`
	Argv       []string `json:"argv"`
	Skipped    string   `json:"skipped,omitempty"`
	Runs       []sample `json:"runs"`
	Failures   []string `json:"failures,omitempty"`

	Ready         stat `json:"ready_ms"`
	Exit          stat `json:"exit_ms"`
	KernelRunInit stat `json:"kernel_run_init_ms"`
	CPU           stat `json:"cpu_ms"`
	RSSMiB        stat `json:"rss_mib"`
}

// ratio is microvm's median over QEMU's for one kernel.
type ratio struct {
	Kernel        string `json:"kernel"`
	Ready         num    `json:"ready"`
	Exit          num    `json:"exit"`
	KernelRunInit num    `json:"kernel_run_init"`
	CPU           num    `json:"cpu"`
}

// report is everything one run of the benchmark found; main stores it as
// JSON.
type report struct {
	Time        time.Time         `json:"time"`
	Host        map[string]string `json:"host"`
	InBox       bool              `json:"in_nested_kvm_box"`
	QEMUVersion string            `json:"qemu_version,omitempty"`
	N           int               `json:"n"`
	Warmup      int               `json:"warmup"`
	CPUs        int               `json:"cpus"`
	Memory      string            `json:"memory"`
	Initrd      string            `json:"initrd"`
	Rows        []*row            `json:"rows"`
	Ratios      []ratio           `json:"ratios_microvm_over_qemu"`
}

func newReport(cfg config) *report {
	rep := &report{
		Time: time.Now().UTC(), Host: benchenv.HostInfo(), InBox: inBox(),
		QEMUVersion: qemuVersion(cfg.qemu),
		N:           cfg.n, Warmup: cfg.warmup, CPUs: cfg.cpus, Memory: cfg.memory, Initrd: cfg.initrd,
	}
	for _, k := range cfg.kernels {
		for _, kind := range []vmmKind{kindMicrovm, kindQEMU} {
			rep.Rows = append(rep.Rows, &row{Kernel: filepath.Base(k), KernelPath: k, VMM: kind, Argv: cfg.argv(kind, k)})
		}
	}
	return rep
}

// qemuVersion is the first line of `qemu --version`, or "" if it fails.
func qemuVersion(qemu string) string {
	out, err := exec.Command(qemu, "--version").Output()
	if err != nil {
		return ""
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}

// summarise fills in each row's statistics and the ratios.
func (rep *report) summarise() {
	for _, r := range rep.Rows {
		r.Ready = summarise(r.Runs, func(s sample) float64 { return s.ReadyMS })
		r.Exit = summarise(r.Runs, func(s sample) float64 { return s.ExitMS })
		r.KernelRunInit = summarise(r.Runs, func(s sample) float64 { return float64(s.KernelRunInitMS) })
		r.CPU = summarise(r.Runs, func(s sample) float64 { return s.CPUMS })
		r.RSSMiB = summarise(r.Runs, func(s sample) float64 { return float64(s.RSSKiB) / 1024 })
	}
	rep.Ratios = nil
	for _, p := range pairs(rep.Rows) {
		m, q := p[0], p[1]
		if m == nil || q == nil || m.Ready.N == 0 || q.Ready.N == 0 {
			continue
		}
		rep.Ratios = append(rep.Ratios, ratio{
			Kernel:        m.Kernel,
			Ready:         m.Ready.Median / q.Ready.Median,
			Exit:          m.Exit.Median / q.Exit.Median,
			KernelRunInit: m.KernelRunInit.Median / q.KernelRunInit.Median,
			CPU:           m.CPU.Median / q.CPU.Median,
		})
	}
}

// summarise computes the statistics of f over runs, leaving out NaN values
// (a figure a run did not have). Percentiles are nearest rank; the median of
// an even count is the mean of the middle two.
func summarise(runs []sample, f func(sample) float64) stat {
	var v []float64
	for _, r := range runs {
		if x := f(r); !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		nan := num(math.NaN())
		return stat{Median: nan, Min: nan, Max: nan, P10: nan, P90: nan}
	}
	sort.Float64s(v)
	rank := func(p float64) num {
		i := int(math.Ceil(p*float64(len(v)))) - 1
		return num(v[max(0, min(i, len(v)-1))])
	}
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return stat{N: len(v), Median: num(med), Min: num(v[0]), Max: num(v[len(v)-1]), P10: rank(0.1), P90: rank(0.9)}
}

// allOK reports whether every row that ran had only successful runs.
func (rep *report) allOK() bool {
	for _, r := range rep.Rows {
		if len(r.Failures) > 0 || (r.Skipped == "" && len(r.Runs) == 0) {
			return false
		}
	}
	return true
}

func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "Linux boot to /init: %d vCPU, %s, %d runs each, interleaved ABAB after %d warm-up (host: %s, %s)\n",
		rep.CPUs, rep.Memory, rep.N, rep.Warmup, rep.Host["cpu"], rep.Host["kvm"])
	if rep.InBox {
		fmt.Fprintln(w, "IN THE NESTED-KVM BOX: L1 under QEMU TCG with emulated SVM. Everything runs at TCG speed;")
		fmt.Fprintln(w, "this compares the two VMMs on the same emulated machine, it does not measure boot times to quote.")
	}
	if rep.QEMUVersion != "" {
		fmt.Fprintf(w, "qemu: %s\n", rep.QEMUVersion)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kernel\tvmm\tok\tfailed\tready ms\t(min-max)\texit ms\t(min-max)\tkernel Run /init ms\t(min-max)\tCPU ms\tRSS MiB\t")
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\tskipped: %s\t\t\t\t\t\t\t\t\t\t\n", r.Kernel, r.VMM, r.Skipped)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Kernel, r.VMM, len(r.Runs), len(r.Failures),
			fmtNum(r.Ready.Median), fmtRange(r.Ready), fmtNum(r.Exit.Median), fmtRange(r.Exit),
			fmtNum(r.KernelRunInit.Median), fmtRange(r.KernelRunInit), fmtNum(r.CPU.Median), fmtNum(r.RSSMiB.Median))
	}
	for _, q := range rep.Ratios {
		fmt.Fprintf(tw, "%s\tmicrovm/qemu\t\t\t%s\t\t%s\t\t%s\t\t%s\t\t\n", q.Kernel,
			fmtRatio(q.Ready), fmtRatio(q.Exit), fmtRatio(q.KernelRunInit), fmtRatio(q.CPU))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nready: process start to \"init: ready\" on the serial console; exit: to the VMM's exit after /init rebooted;")
	fmt.Fprintln(w, "kernel Run /init: the guest kernel's printk time of \"Run /init as init process\"; medians, (min-max) of the runs.")
	for _, r := range rep.Rows {
		for _, f := range r.Failures {
			fmt.Fprintf(w, "FAILED %s %s %s\n", r.Kernel, r.VMM, f)
		}
	}
}

func fmtNum(n num) string {
	if math.IsNaN(float64(n)) {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(n))
}

func fmtRatio(n num) string {
	if math.IsNaN(float64(n)) || math.IsInf(float64(n), 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(n))
}

func fmtRange(s stat) string {
	if s.N == 0 {
		return ""
	}
	return fmt.Sprintf("(%.0f-%.0f)", float64(s.Min), float64(s.Max))
}
