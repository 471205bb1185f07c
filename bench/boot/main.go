// Command boot measures how fast microvm boots and ends the bundled test
// guest, next to QEMU's microvm machine doing the same, and next to a
// baseline microvm binary (make bench-boot builds 41d2896~1, the last before
// the guest agent: docs/benchmarks.md, "Start-up"), in one run.
//
//	go run ./bench/boot [-n 20] [-baseline PATH] [-json build/bench/boot.json]
//
// Each iteration runs both VMMs once, alternating which goes first. A run
// counts only if the guest printed "testguest: hello" and the VMM exited as
// expected (microvm 0; QEMU 1, its isa-debug-exit encoding of 0); any other
// run is reported as failed and not timed. For each VMM it reports wall time
// from fork to exit, CPU time (user+sys of the child, from rusage) and peak
// RSS (ru_maxrss), as median and 90th percentile, and the microvm/QEMU ratio
// of the medians; then the targets and whether this run met them. Peak RSS
// is also read as VmHWM at the VMM's exit, in -rss-runs runs under ptrace
// apart from the timed ones (hwm.go says why wait4's figure alone can
// mislead); the targets use VmHWM. It is a measurement, not a test: it
// exits 1 only when runs failed.
//
// Two more rows show where the time goes. microvm-kirq is microvm with
// --irqchip kernel (KVM's full in-kernel irqchip and PIT, Firecracker's
// model) instead of the default split irqchip. kvm-floor and kvm-floor-kirq
// are this program re-executed to do only what any KVM VMM must with each
// irqchip model: open /dev/kvm, create a VM, register the same amount of
// guest memory, create the interrupt controllers and one vCPU, run a
// three-instruction guest to its debug-exit write, and tear it all down.
// Their time is what the host kernel charges for a VM's life; floor/QEMU is
// the lowest wall-time ratio a VMM using that model could reach on this host.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

// Targets: microvm's boot-to-exit wall time at most 0.34x
// QEMU's; its peak RSS (VmHWM) at most 6 MiB with a 64 MiB guest; and wall
// time and peak RSS at most the baseline's (medians of one run).
const (
	targetWallRatio = 0.34
	targetRSSMiB    = 6.0
)

// vmm is one command under test.
type vmm struct {
	Name       string   `json:"name"`
	Argv       []string `json:"argv"`
	WantStatus int      `json:"want_status"`
	WantOutput string   `json:"want_output"`
}

// sample is one timed run.
type sample struct {
	WallMS float64 `json:"wall_ms"`
	CPUMS  float64 `json:"cpu_ms"`
	RSSKiB int64   `json:"rss_kib"`
}

// stat summarises one metric over the successful runs.
type stat struct {
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

type vmmResult struct {
	VMM      vmm      `json:"vmm"`
	Runs     []sample `json:"runs"`
	Failures []string `json:"failures,omitempty"`
	Skipped  string   `json:"skipped,omitempty"`
	WallMS   stat     `json:"wall_ms"`
	CPUMS    stat     `json:"cpu_ms"`
	RSSMiB   stat     `json:"rss_mib"` // wait4's ru_maxrss of the timed runs
	// HWM holds the ptraced runs: VmHWM at exit (HWMMiB), and wait4's
	// figure for the same runs.
	HWM      []hwmSample `json:"hwm_runs"`
	HWMMiB   stat        `json:"vmhwm_mib"`
	HWMFails []string    `json:"hwm_failures,omitempty"`
}

type target struct {
	What  string  `json:"what"`
	Limit float64 `json:"limit"`
	Got   float64 `json:"got"`
	Met   bool    `json:"met"`
	Note  string  `json:"note,omitempty"`
}

// report is everything one run of the benchmark found; main stores it as JSON.
type report struct {
	Time    time.Time
	Host    map[string]string
	N       int
	Results []*vmmResult
	Ratios  map[string]float64 // microvm median / QEMU median, by metric; "base_*": microvm / baseline
	Targets []target
	byName  map[string]*vmmResult
}

// floorFlag runs the kvm-floor child (see the package comment).
const floorFlag = "-kvm-floor-child"

func main() {
	if len(os.Args) == 4 && os.Args[1] == floorFlag {
		os.Exit(kvmFloor(os.Args[2], os.Args[3] == "split"))
	}
	n := flag.Int("n", 20, "timed runs of each VMM")
	microvmBin := flag.String("microvm", "bin/microvm", "microvm binary")
	baseline := flag.String("baseline", "", "a baseline microvm binary to measure beside it (empty: none)")
	rssRuns := flag.Int("rss-runs", 5, "untimed runs of each VMM under ptrace, reading VmHWM at exit")
	guest := flag.String("guest", "bin/testguest", "test guest ELF")
	qemu := flag.String("qemu", "qemu-system-x86_64", "QEMU binary (skipped when not found)")
	mem := flag.String("memory", "64M", "guest memory for both VMMs")
	jsonOut := flag.String("json", "build/bench/boot.json", "write the results here as JSON (empty: don't)")
	timeout := flag.Duration("timeout", 30*time.Second, "a run taking longer is killed and counts as failed")
	flag.Parse()

	for _, p := range []string{*microvmBin, *guest} {
		if _, err := os.Stat(p); err != nil {
			fmt.Fprintf(os.Stderr, "bench-boot: %v (run `make` first)\n", err)
			os.Exit(2)
		}
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-boot: %v\n", err)
		os.Exit(2)
	}
	vmms := []vmm{{
		Name:       "microvm",
		Argv:       []string{*microvmBin, "run", "--kernel", *guest, "--cmdline", "testguest.mode=hello", "--memory", *mem},
		WantStatus: 0,
		WantOutput: "testguest: hello",
	}, {
		Name: "qemu",
		Argv: []string{*qemu, "-M", "microvm,acpi=off", "-enable-kvm", "-cpu", "host,-arch-capabilities",
			"-m", *mem, "-kernel", *guest, "-append", "testguest.mode=hello",
			"-device", "isa-debug-exit,iobase=0xf4,iosize=4", "-nodefaults", "-nographic", "-serial", "stdio"},
		WantStatus: 1,
		WantOutput: "testguest: hello",
	}}
	if *baseline != "" {
		// The baseline has none of the rng device, the ACPI tables and the
		// seccomp filter that microvm adds by default: microvm-bare is
		// microvm doing the baseline's work.
		vmms = append(vmms, vmm{
			Name:       "baseline",
			Argv:       []string{*baseline, "run", "--kernel", *guest, "--cmdline", "testguest.mode=hello", "--memory", *mem},
			WantStatus: 0,
			WantOutput: "testguest: hello",
		}, vmm{
			Name: "microvm-bare",
			Argv: []string{*microvmBin, "run", "--kernel", *guest, "--cmdline", "testguest.mode=hello", "--memory", *mem,
				"--rng=off", "--acpi=off", "--seccomp=off"},
			WantStatus: 0,
			WantOutput: "testguest: hello",
		})
	}
	vmms = append(vmms, []vmm{{
		Name:       "microvm-kirq",
		Argv:       []string{*microvmBin, "run", "--kernel", *guest, "--cmdline", "testguest.mode=hello", "--memory", *mem, "--irqchip", "kernel"},
		WantStatus: 0,
		WantOutput: "testguest: hello",
	}, {
		Name:       "kvm-floor",
		Argv:       []string{self, floorFlag, *mem, "split"},
		WantStatus: 0,
		WantOutput: floorOK,
	}, {
		Name:       "kvm-floor-kirq",
		Argv:       []string{self, floorFlag, *mem, "kernel"},
		WantStatus: 0,
		WantOutput: floorOK,
	}}...)
	rep := &report{Time: time.Now().UTC(), Host: benchenv.HostInfo(), N: *n, byName: map[string]*vmmResult{}}
	var active []*vmmResult
	for _, v := range vmms {
		r := &vmmResult{VMM: v}
		rep.Results = append(rep.Results, r)
		rep.byName[v.Name] = r
		if _, err := exec.LookPath(v.Argv[0]); err != nil {
			r.Skipped = err.Error()
			continue
		}
		active = append(active, r)
	}

	// One untimed run each so that neither pays for a cold page cache.
	for _, r := range active {
		if _, err := runOnce(r.VMM, *timeout); err != nil {
			fmt.Fprintf(os.Stderr, "bench-boot: warm-up %s: %v\n", r.VMM.Name, err)
		}
	}
	for i := 0; i < *n; i++ {
		order := active
		if i%2 == 1 { // alternate who goes first
			order = append([]*vmmResult(nil), active...)
			for a, b := 0, len(order)-1; a < b; a, b = a+1, b-1 {
				order[a], order[b] = order[b], order[a]
			}
		}
		for _, r := range order {
			s, err := runOnce(r.VMM, *timeout)
			if err != nil {
				r.Failures = append(r.Failures, fmt.Sprintf("run %d: %v", i+1, err))
				continue
			}
			r.Runs = append(r.Runs, s)
		}
	}
	for i := 0; i < *rssRuns; i++ {
		for _, r := range active {
			h, err := hwmRun(r.VMM, *timeout)
			if err != nil {
				r.HWMFails = append(r.HWMFails, fmt.Sprintf("ptraced run %d: %v", i+1, err))
				continue
			}
			r.HWM = append(r.HWM, h)
		}
	}
	for _, r := range rep.Results {
		r.HWMMiB = summariseHWM(r.HWM)
		r.WallMS = summarise(r.Runs, func(s sample) float64 { return s.WallMS })
		r.CPUMS = summarise(r.Runs, func(s sample) float64 { return s.CPUMS })
		r.RSSMiB = summarise(r.Runs, func(s sample) float64 { return float64(s.RSSKiB) / 1024 })
	}
	rep.evaluate()
	rep.print(os.Stdout)
	if *jsonOut != "" {
		if err := benchenv.WriteJSON(*jsonOut, sanitize(rep)); err != nil {
			fmt.Fprintf(os.Stderr, "bench-boot: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", *jsonOut)
	}
	for _, r := range rep.Results {
		if len(r.Failures) > 0 || len(r.HWMFails) > 0 || (r.Skipped == "" && len(r.Runs) == 0) {
			os.Exit(1)
		}
	}
}

// runOnce runs v and checks that the guest really said hello and the VMM
// exited with the expected status.
func runOnce(v vmm, timeout time.Duration) (sample, error) {
	var out bytes.Buffer
	cmd := exec.Command(v.Argv[0], v.Argv[1:]...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.Stdin = nil // /dev/null
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return sample{}, err
	}
	timer := time.AfterFunc(timeout, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	wall := time.Since(start)
	timer.Stop()
	st := cmd.ProcessState
	if st == nil {
		return sample{}, err
	}
	ws := st.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		return sample{}, fmt.Errorf("killed by %v after %v; output %q", ws.Signal(), wall.Round(time.Millisecond), tail(out.String()))
	case ws.ExitStatus() != v.WantStatus:
		return sample{}, fmt.Errorf("exit status %d, want %d; output %q", ws.ExitStatus(), v.WantStatus, tail(out.String()))
	case !strings.Contains(out.String(), v.WantOutput):
		return sample{}, fmt.Errorf("no %q in the output %q", v.WantOutput, tail(out.String()))
	}
	ru := st.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return sample{
		WallMS: float64(wall.Microseconds()) / 1000,
		CPUMS:  float64(cpu.Microseconds()) / 1000,
		RSSKiB: ru.Maxrss, // kilobytes on Linux
	}, nil
}

func tail(s string) string {
	if len(s) > 300 {
		return "..." + s[len(s)-300:]
	}
	return s
}

// summarise computes median and p90 (nearest rank) of f over runs.
func summarise(runs []sample, f func(sample) float64) stat {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	return summary(v)
}

// summariseHWM summarises the VmHWM of the ptraced runs, in MiB.
func summariseHWM(runs []hwmSample) stat {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = float64(r.HWMKiB) / 1024
	}
	return summary(v)
}

// summary is the median, p90 (nearest rank), min and max of v.
func summary(v []float64) stat {
	if len(v) == 0 {
		return stat{Median: math.NaN(), P90: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	sort.Float64s(v)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(v)))) - 1
		return v[max(0, min(i, len(v)-1))]
	}
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return stat{Median: med, P90: rank(0.9), Min: v[0], Max: v[len(v)-1]}
}

func (rep *report) evaluate() {
	m, q := rep.byName["microvm"], rep.byName["qemu"]
	ok := func(r *vmmResult) bool { return r != nil && len(r.Runs) > 0 }
	if ok(m) && ok(q) {
		rep.Ratios = map[string]float64{
			"wall":     m.WallMS.Median / q.WallMS.Median,
			"wall_min": m.WallMS.Min / q.WallMS.Min,
			"cpu":      m.CPUMS.Median / q.CPUMS.Median,
			"rss":      m.RSSMiB.Median / q.RSSMiB.Median,
		}
		if math.IsInf(rep.Ratios["cpu"], 0) || math.IsNaN(rep.Ratios["cpu"]) {
			delete(rep.Ratios, "cpu") // QEMU's CPU time rounded to 0
		}
		if f := rep.byName["kvm-floor"]; ok(f) {
			rep.Ratios["floor_wall"] = f.WallMS.Median / q.WallMS.Median
		}
		if f := rep.byName["kvm-floor-kirq"]; ok(f) {
			rep.Ratios["floor_kirq_wall"] = f.WallMS.Median / q.WallMS.Median
		}
		if k := rep.byName["microvm-kirq"]; ok(k) {
			rep.Ratios["kirq_wall"] = k.WallMS.Median / q.WallMS.Median
		}
	}
	b := rep.byName["baseline"]
	if ok(m) && ok(b) {
		if rep.Ratios == nil {
			rep.Ratios = map[string]float64{}
		}
		rep.Ratios["base_wall"] = m.WallMS.Median / b.WallMS.Median
		rep.Ratios["base_wall_min"] = m.WallMS.Min / b.WallMS.Min
		rep.Ratios["base_cpu"] = m.CPUMS.Median / b.CPUMS.Median
		if len(m.HWM) > 0 && len(b.HWM) > 0 {
			rep.Ratios["base_hwm"] = m.HWMMiB.Median / b.HWMMiB.Median
		}
		if bare := rep.byName["microvm-bare"]; ok(bare) {
			rep.Ratios["bare_wall"] = bare.WallMS.Median / b.WallMS.Median
			if len(bare.HWM) > 0 && len(b.HWM) > 0 {
				rep.Ratios["bare_hwm"] = bare.HWMMiB.Median / b.HWMMiB.Median
			}
		}
	}
	wall := target{What: "microvm wall time / QEMU wall time (medians)", Limit: targetWallRatio, Got: math.NaN()}
	if r, found := rep.Ratios["wall"]; found {
		wall.Got, wall.Met = r, r <= targetWallRatio
	} else {
		wall.Note = "not measured: needs successful runs of both VMMs"
	}
	rss := target{What: "microvm peak RSS (VmHWM), MiB (median)", Limit: targetRSSMiB, Got: math.NaN()}
	if m != nil && len(m.HWM) > 0 {
		rss.Got, rss.Met = m.HWMMiB.Median, m.HWMMiB.Median <= targetRSSMiB
	} else {
		rss.Note = "not measured: no successful ptraced microvm run"
	}
	rep.Targets = []target{wall, rss}
	for _, t := range []struct{ key, what string }{
		{"base_wall", "microvm wall / baseline wall (medians)"},
		{"base_hwm", "microvm VmHWM / baseline VmHWM (medians)"},
		{"bare_wall", "microvm-bare wall / baseline wall (medians)"},
		{"bare_hwm", "microvm-bare VmHWM / baseline VmHWM"},
	} {
		tg := target{What: t.what, Limit: 1, Got: math.NaN()}
		if v, found := rep.Ratios[t.key]; found {
			tg.Got, tg.Met = v, v <= 1
		} else {
			tg.Note = "not measured: no baseline (-baseline) or no successful runs"
		}
		rep.Targets = append(rep.Targets, tg)
	}
}

func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "boot to guest exit: testguest.mode=hello, %d runs each, interleaved (host: %s, %s)\n\n", rep.N, rep.Host["cpu"], rep.Host["kvm"])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "vmm\tok\tfailed\twall median ms\twall p90 ms\twall min ms\tcpu median ms\tcpu p90 ms\tVmHWM median MiB\tVmHWM max MiB\twait4 RSS median MiB\t")
	for _, r := range rep.Results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\tskipped: %s\t\t\t\t\t\t\t\t\t\t\n", r.VMM.Name, r.Skipped)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t\n", r.VMM.Name, len(r.Runs), len(r.Failures),
			r.WallMS.Median, r.WallMS.P90, r.WallMS.Min, r.CPUMS.Median, r.CPUMS.P90, r.HWMMiB.Median, r.HWMMiB.Max, r.RSSMiB.Median)
	}
	if rep.Ratios != nil {
		cpu := "n/a"
		if v, ok := rep.Ratios["cpu"]; ok {
			cpu = fmt.Sprintf("%.2f", v)
		}
		if _, found := rep.Ratios["wall"]; found {
			fmt.Fprintf(tw, "microvm/qemu\t\t\t%.2f\t\t%.2f\t%s\t\t\t\t%.2f\t\n", rep.Ratios["wall"], rep.Ratios["wall_min"], cpu, rep.Ratios["rss"])
		}
		if _, found := rep.Ratios["base_wall"]; found {
			hwm := "n/a"
			if v, ok := rep.Ratios["base_hwm"]; ok {
				hwm = fmt.Sprintf("%.2f", v)
			}
			fmt.Fprintf(tw, "microvm/baseline\t\t\t%.2f\t\t%.2f\t%.2f\t\t%s\t\t\t\n", rep.Ratios["base_wall"], rep.Ratios["base_wall_min"], rep.Ratios["base_cpu"], hwm)
		}
		if v, found := rep.Ratios["bare_wall"]; found {
			fmt.Fprintf(tw, "microvm-bare/baseline\t\t\t%.2f\t\t\t\t\t%.2f\t\t\t\n", v, rep.Ratios["bare_hwm"])
		}
		for _, x := range []struct{ key, name string }{
			{"kirq_wall", "microvm-kirq/qemu"}, {"floor_wall", "kvm-floor/qemu"}, {"floor_kirq_wall", "kvm-floor-kirq/qemu"},
		} {
			if f, ok := rep.Ratios[x.key]; ok {
				fmt.Fprintf(tw, "%s\t\t\t%.2f\t\t\t\t\t\t\t\n", x.name, f)
			}
		}
	}
	tw.Flush()
	if m, f := rep.byName["microvm"], rep.byName["kvm-floor"]; len(m.Runs) > 0 && len(f.Runs) > 0 {
		fmt.Fprintf(w, "\nmicrovm minus kvm-floor (microvm's own work plus the test guest's, which QEMU runs too): %.1f ms wall, %.1f ms CPU (medians)\n",
			m.WallMS.Median-f.WallMS.Median, m.CPUMS.Median-f.CPUMS.Median)
	}
	for _, r := range rep.Results {
		for _, f := range append(append([]string(nil), r.Failures...), r.HWMFails...) {
			fmt.Fprintf(w, "FAILED %s %s\n", r.VMM.Name, f)
		}
	}
	fmt.Fprintln(w, "\nVmHWM: the VMM's own peak RSS, read at its exit under ptrace (untimed runs); wait4 RSS: ru_maxrss of the timed runs,\n"+
		"which also counts the spawning process's memory before exec (bench/boot/hwm.go).")
	fmt.Fprintln(w, "\ntargets:")
	for _, t := range rep.Targets {
		verdict := "missed"
		if t.Met {
			verdict = "met"
		}
		got := fmt.Sprintf("%.2f", t.Got)
		if t.Note != "" {
			verdict, got = t.Note, "-"
		}
		fmt.Fprintf(w, "  %-46s <= %-5g got %-6s %s\n", t.What, t.Limit, got, verdict)
	}
	if f, ok := rep.Ratios["floor_wall"]; ok && f > targetWallRatio {
		fmt.Fprintf(w, "  (the kvm floor alone is %.2fx QEMU here: the host kernel's cost of a VM's life puts the wall target out of reach on this host)\n", f)
	}
}

// sanitize round-trips rep through a generic form with NaN replaced by nil,
// since encoding/json refuses NaN.
func sanitize(rep *report) any {
	fix := func(f float64) any {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil
		}
		return f
	}
	st := func(s stat) map[string]any {
		return map[string]any{"median": fix(s.Median), "p90": fix(s.P90), "min": fix(s.Min), "max": fix(s.Max)}
	}
	var results []map[string]any
	for _, r := range rep.Results {
		results = append(results, map[string]any{
			"vmm": r.VMM, "runs": r.Runs, "failures": r.Failures, "skipped": r.Skipped,
			"wall_ms": st(r.WallMS), "cpu_ms": st(r.CPUMS), "rss_mib": st(r.RSSMiB),
			"vmhwm_mib": st(r.HWMMiB), "hwm_runs": r.HWM, "hwm_failures": r.HWMFails,
		})
	}
	var targets []map[string]any
	for _, t := range rep.Targets {
		targets = append(targets, map[string]any{"what": t.What, "limit": t.Limit, "got": fix(t.Got), "met": t.Met, "note": t.Note})
	}
	return map[string]any{
		"time": rep.Time, "host": rep.Host, "n": rep.N, "results": results,
		"ratios_microvm_over_qemu": rep.Ratios, "targets": targets,
	}
}
