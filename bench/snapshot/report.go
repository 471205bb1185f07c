package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/agentguest"
	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/bench/internal/benchstat"
)

// row is one measurement: its samples (ms unless Unit says otherwise) and
// their summary.
type row struct {
	Name     string            `json:"name"`
	Unit     string            `json:"unit"`
	Samples  []float64         `json:"samples"`
	Failures []string          `json:"failures,omitempty"`
	Stat     benchstat.Summary `json:"stat"`
}

func newRow(name string) *row { return &row{Name: name, Unit: "ms", Samples: []float64{}} }

func (r *row) summarise() { r.Stat = benchstat.Summarise(r.Samples) }

// env is where a report's figures come from.
type env struct {
	Time    time.Time         `json:"time"`
	Host    map[string]string `json:"host"`
	HostKVM string            `json:"host_kvm"`
	InBox   bool              `json:"in_nested_kvm_box"`
	// Where labels the figures: native on this host's KVM, or TCG in
	// the nested-KVM box.
	Where string `json:"where"`
}

// boxLabel is how figures measured in the nested-KVM box are labelled.
const boxLabel = "TCG (nested-KVM box)"

func newEnv(hostKVM string, inBox bool) env {
	where := "native (KVM: " + hostKVM + ")"
	if inBox {
		where = boxLabel
	}
	return env{Time: time.Now().UTC(), Host: benchenv.HostInfo(), HostKVM: hostKVM, InBox: inBox, Where: where}
}

// header prints the host and what the figures are.
func (e env) header(w io.Writer) {
	fmt.Fprintf(w, "host: %s, %s CPUs, %s; figures: %s\n", e.Host["cpu"], e.Host["cpus"], e.Host["kvm"], e.Where)
	if e.InBox {
		fmt.Fprintln(w, "IN THE NESTED-KVM BOX: L1 under QEMU TCG with emulated SVM; every figure is TCG's.")
		fmt.Fprintln(w, "Read the ratios within this run, not the times.")
	}
}

// ---- the test guest: restore by size, snapshot size and time, clones ----

// sizeResult is everything measured of one guest memory size.
type sizeResult struct {
	MemoryBytes uint64 `json:"memory_bytes"`
	// New is microvm.New of the booted machine (with Run started), and
	// BootAnswered from just before it to the guest's first echo back:
	// one boot, for reference.
	New          *row `json:"boot_new"`
	BootAnswered *row `json:"boot_to_guest_answered"`
	// Restore is the Restore call; Answered from just before it to the
	// guest's first echo back.
	Restore  *row `json:"restore_call"`
	Answered *row `json:"restore_to_guest_answered"`
	// FirstCall is the machine's first Snapshot call (live), which reads
	// guest memory never read before.
	FirstCall *row `json:"first_snapshot_live_call"`
	// SnapshotCall is a later live Snapshot call (it pauses and resumes the
	// guest itself); Pause, Write, Resume the steps of one made with the
	// guest paused apart, Paused their sum.
	SnapshotCall *row `json:"snapshot_live_call"`
	Pause        *row `json:"pause"`
	Write        *row `json:"snapshot_while_paused"`
	Resume       *row `json:"resume"`
	Paused       *row `json:"paused_window"`
	// StopCall is the Snapshot with Stop whose directory was restored.
	StopCall *row    `json:"snapshot_stop_call"`
	Disk     diskUse `json:"snapshot_disk"`
	// LiveDisk is the last live snapshot's.
	LiveDisk *diskUse `json:"live_snapshot_disk,omitempty"`
	Failures []string `json:"failures,omitempty"`
}

func (s *sizeResult) rows() []*row {
	return []*row{s.New, s.BootAnswered, s.Restore, s.Answered, s.FirstCall, s.SnapshotCall, s.Pause, s.Write, s.Resume, s.Paused, s.StopCall}
}

// cloneResult is the memory of several restore processes of one snapshot.
type cloneResult struct {
	N           int    `json:"clones"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// Answered is each process's time from its start to its guest's
	// first echo back.
	Answered *row `json:"process_start_to_guest_answered"`
	// Alone is the first clone's once it answered, before the second
	// started; Each every clone's once all answered, Sum their sum.
	Alone  memUse   `json:"one_clone_alone"`
	Each   []memUse `json:"each"`
	Sum    memUse   `json:"sum"`
	MaxRSS int64    `json:"max_rss_bytes"`
	// PSSOverOne is Sum.PSS / Alone.RSS: 1 if the clones shared
	// everything, N if they shared nothing. RSSOverOne is the same for
	// RSS, which counts shared pages in each.
	PSSOverOne num      `json:"sum_pss_over_one_rss"`
	RSSOverOne num      `json:"sum_rss_over_one_rss"`
	Failures   []string `json:"failures,omitempty"`
}

func (c *cloneResult) guestSize() string { return microvm.FormatSize(c.MemoryBytes) }

// guestReport is what the testguest subcommand found.
type guestReport struct {
	env
	Microvm  string        `json:"microvm"`
	Guest    string        `json:"guest"`
	Cmdline  string        `json:"cmdline"`
	Restores int           `json:"restores_per_size"`
	Snaps    int           `json:"live_snapshots_per_size"`
	Sizes    []*sizeResult `json:"sizes"`
	// Flat is the largest guest's p50 over the smallest's, of Restore
	// and of restore to answer: 1 when restore time does not grow with
	// memory.
	FlatRestore  num          `json:"largest_over_smallest_restore_p50"`
	FlatAnswered num          `json:"largest_over_smallest_answered_p50"`
	Clones       *cloneResult `json:"clones,omitempty"`
	Failures     []string     `json:"failures,omitempty"`
}

func newGuestReport(cfg *guestConfig, hostKVM string, inBox bool) *guestReport {
	rep := &guestReport{env: newEnv(hostKVM, inBox), Microvm: cfg.microvm, Guest: cfg.guest, Cmdline: guestCmdline,
		Restores: cfg.restores, Snaps: cfg.snaps, FlatRestore: nan, FlatAnswered: nan}
	if cfg.clones > 0 {
		rep.Clones = &cloneResult{N: cfg.clones, MemoryBytes: cfg.cloneSize, Answered: newRow("process start to guest answered"),
			PSSOverOne: nan, RSSOverOne: nan}
	}
	return rep
}

// addSize appends the empty result of a memory size.
func (rep *guestReport) addSize(size uint64) *sizeResult {
	s := &sizeResult{MemoryBytes: size, New: newRow("New() (boot)"), BootAnswered: newRow("boot to guest answered"), Restore: newRow("Restore() returned"), Answered: newRow("guest answered"),
		FirstCall: newRow("first Snapshot()"), SnapshotCall: newRow("Snapshot() live"), Pause: newRow("Pause()"), Write: newRow("Snapshot() while paused"),
		Resume: newRow("Resume()"), Paused: newRow("paused window"), StopCall: newRow("Snapshot() stop")}
	rep.Sizes = append(rep.Sizes, s)
	return s
}

// summarise fills in every summary and ratio.
func (rep *guestReport) summarise() {
	for _, s := range rep.Sizes {
		for _, r := range s.rows() {
			r.summarise()
		}
	}
	if n := len(rep.Sizes); n > 1 {
		lo, hi := rep.Sizes[0], rep.Sizes[n-1]
		rep.FlatRestore = benchstat.Ratio(hi.Restore.Stat.P50, lo.Restore.Stat.P50)
		rep.FlatAnswered = benchstat.Ratio(hi.Answered.Stat.P50, lo.Answered.Stat.P50)
	}
	if c := rep.Clones; c != nil {
		c.Answered.summarise()
		c.Sum, c.MaxRSS = memUse{}, 0
		for _, u := range c.Each {
			c.Sum.add(u)
			c.MaxRSS = max(c.MaxRSS, u.RSS)
		}
		c.PSSOverOne, c.RSSOverOne = nan, nan
		if len(c.Each) > 0 && c.Alone.RSS > 0 {
			c.PSSOverOne = num(float64(c.Sum.PSS) / float64(c.Alone.RSS))
			c.RSSOverOne = num(float64(c.Sum.RSS) / float64(c.Alone.RSS))
		}
	}
}

// failed reports whether anything failed or could not be measured.
func (rep *guestReport) failed() bool {
	if len(rep.Failures) > 0 {
		return true
	}
	for _, s := range rep.Sizes {
		if len(s.Failures) > 0 || (rep.Restores > 0 && len(s.Answered.Samples) == 0) {
			return true
		}
		for _, r := range s.rows() {
			if len(r.Failures) > 0 {
				return true
			}
		}
	}
	if c := rep.Clones; c != nil && (len(c.Failures) > 0 || len(c.Each) != c.N) {
		return true
	}
	return false
}

// print writes the tables.
func (rep *guestReport) print(w io.Writer) {
	fmt.Fprintf(w, "snapshot and restore: the test guest (%s), 1 vCPU; %d restores and %d+%d live snapshots per size\n",
		rep.Cmdline, rep.Restores, rep.Snaps, rep.Snaps)
	rep.header(w)

	fmt.Fprintf(w, "\nrestore by guest memory [%s], ms from just before Restore(); p99 is the max under 100 samples\n", rep.Where)
	tw := table(w)
	fmt.Fprintln(tw, "memory\trestores\tfailed\tRestore() p50\tRestore() p99\tguest answered p50\tguest answered p99\tanswered min\tanswered max\tNew() (boot)\tboot to answered\t")
	for _, s := range rep.Sizes {
		a := s.Answered.Stat
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", microvm.FormatSize(s.MemoryBytes), a.N,
			len(s.Restore.Failures)+len(s.Answered.Failures), fmtNum(s.Restore.Stat.P50), fmtNum(s.Restore.Stat.P99),
			fmtNum(a.P50), fmtNum(a.P99), fmtNum(a.Min), fmtNum(a.Max), fmtNum(s.New.Stat.P50), fmtNum(s.BootAnswered.Stat.P50))
	}
	if n := len(rep.Sizes); n > 1 {
		lo, hi := rep.Sizes[0], rep.Sizes[n-1]
		fmt.Fprintf(tw, "%s/%s\t\t\t%s\t\t%s\t\t\t\t%s\t%s\t\n", microvm.FormatSize(hi.MemoryBytes), microvm.FormatSize(lo.MemoryBytes),
			fmtNum(rep.FlatRestore), fmtNum(rep.FlatAnswered), fmtNum(benchstat.Ratio(hi.New.Stat.P50, lo.New.Stat.P50)),
			fmtNum(benchstat.Ratio(hi.BootAnswered.Stat.P50, lo.BootAnswered.Stat.P50)))
	}
	tw.Flush()
	fmt.Fprintln(w, "target: flat, restore time does not grow with guest memory (largest/smallest p50 near 1). New() and boot to")
	fmt.Fprintln(w, "answered: the one boot of each size that was snapshotted, for reference (KVM's memory slot set-up is in both).")

	fmt.Fprintf(w, "\nsnapshot on disk (allocated blocks) and its time [%s], ms, p50 of the live snapshots\n", rep.Where)
	tw = table(w)
	fmt.Fprintln(tw, "memory\tmemory file MiB\tsnapshot MiB\tof guest memory\tfirst Snapshot()\tSnapshot() live\tpaused window\tPause()\twrite\tResume()\tSnapshot() stop\t")
	for _, s := range rep.Sizes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", microvm.FormatSize(s.MemoryBytes),
			fmtNum(mib(s.Disk.MemoryBytes)), fmtNum(mib(s.Disk.TotalBytes)), percent(s.Disk.TotalBytes, int64(s.MemoryBytes)),
			fmtNum(s.FirstCall.Stat.P50), fmtNum(s.SnapshotCall.Stat.P50), fmtNum(s.Paused.Stat.P50), fmtNum(s.Pause.Stat.P50), fmtNum(s.Write.Stat.P50),
			fmtNum(s.Resume.Stat.P50), fmtNum(s.StopCall.Stat.P50))
	}
	tw.Flush()
	fmt.Fprintln(w, "first Snapshot(): the machine's first, one call on the running guest, which goes on (it reads memory never read")
	fmt.Fprintln(w, "before); Snapshot() live: the later ones; paused window: Pause(), Snapshot() and Resume() called apart, the")
	fmt.Fprintln(w, "longest the guest can have been stopped; stop: the Snapshot with Stop that was restored (the size columns).")

	if c := rep.Clones; c != nil {
		rep.printClones(w, c)
	}
	rep.printFailures(w)
}

func (rep *guestReport) printClones(w io.Writer, c *cloneResult) {
	fmt.Fprintf(w, "\n%d clones of the %s snapshot [%s]: `microvm restore` processes, each answered one echo\n", c.N, c.guestSize(), rep.Where)
	tw := table(w)
	fmt.Fprintln(tw, "processes\tRSS MiB\tPSS MiB\tPSS anon MiB\tPSS file MiB\t")
	line := func(name string, u memUse) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name, fmtNum(mib(u.RSS)), fmtNum(mib(u.PSS)),
			fmtNum(mib(u.PSSAnon)), fmtNum(mib(u.PSSFile)))
	}
	line("one clone alone", c.Alone)
	line(fmt.Sprintf("%d clones, sum", len(c.Each)), c.Sum)
	tw.Flush()
	fmt.Fprintf(w, "sum of PSS / one clone's RSS: %s (target: well under %d); sum of RSS / one clone's RSS: %s; largest RSS %s MiB\n",
		fmtNum(c.PSSOverOne), c.N, fmtNum(c.RSSOverOne), fmtNum(mib(c.MaxRSS)))
	a := c.Answered.Stat
	fmt.Fprintf(w, "`microvm restore` process start to guest answered: p50 %s ms, min %s, max %s (n %d)\n",
		fmtNum(a.P50), fmtNum(a.Min), fmtNum(a.Max), a.N)
}

func (rep *guestReport) printFailures(w io.Writer) {
	var lines []string
	lines = append(lines, rep.Failures...)
	for _, s := range rep.Sizes {
		size := microvm.FormatSize(s.MemoryBytes)
		for _, f := range s.Failures {
			lines = append(lines, size+": "+f)
		}
		for _, r := range s.rows() {
			for _, f := range r.Failures {
				lines = append(lines, size+" "+r.Name+": "+f)
			}
		}
	}
	if c := rep.Clones; c != nil {
		for _, f := range c.Failures {
			lines = append(lines, "clones: "+f)
		}
	}
	printFailed(w, lines)
}

// ---- Linux with the agent: restore against cold boot, size against touched ----

// dirtyResult is one snapshot of the Linux guest after touching memory.
type dirtyResult struct {
	// TouchedBytes were written to files on the guest's /tmp (a tmpfs)
	// before the snapshot, in all.
	TouchedBytes int64 `json:"touched_bytes"`
	// GuestUsedBytes is MemTotal - MemFree in the guest (-1: unknown).
	GuestUsedBytes int64   `json:"guest_used_bytes"`
	Disk           diskUse `json:"snapshot_disk"`
	SnapshotMS     num     `json:"snapshot_live_call_ms"`
	FillMS         num     `json:"fill_ms"`
	// Retries are the failed tries to reach the agent again after the
	// snapshot (connectAgentAgain).
	Retries []string `json:"reconnect_failures,omitempty"`
	Failure string   `json:"failure,omitempty"`
}

// restoreWay is one way the Linux snapshot is restored, and its rows.
type restoreWay struct {
	Name string `json:"name"`
	// Prefault restores with Config.PrefaultMemory (restore --prefault).
	Prefault bool `json:"prefault"`
	// DropCache evicts the memory file from the page cache before each
	// restore, so that its pages come from the disk.
	DropCache bool `json:"page_cache_dropped"`
	// Call is the Restore call; Answered from just before it to the
	// agent's first answer.
	Call     *row `json:"restore_call"`
	Answered *row `json:"restore_to_agent"`
}

// linuxReport is what the linux subcommand found.
type linuxReport struct {
	env
	Kernel      string `json:"kernel"`
	Agent       string `json:"agent"`
	Busybox     string `json:"busybox"`
	Cmdline     string `json:"cmdline"`
	CPUs        int    `json:"cpus"`
	MemoryBytes uint64 `json:"memory_bytes"`
	N           int    `json:"n"`
	// Cold is microvm.New to the agent's first answer. Restores are the
	// ways the snapshot of the last cold boot was restored, the first
	// the plain one (memory mapped lazily, the file in the page cache).
	Cold         *row          `json:"cold_boot_to_agent"`
	Restores     []*restoreWay `json:"restores"`
	SnapshotStop *row          `json:"snapshot_stop_call"`
	SnapshotDisk *diskUse      `json:"snapshot_disk,omitempty"`
	// ColdOverWarm are the p50 and p99 of Cold over the plain restore's.
	ColdOverWarmP50  num            `json:"cold_over_restore_p50"`
	ColdOverWarmP99  num            `json:"cold_over_restore_p99"`
	DirtyMemoryBytes uint64         `json:"dirty_guest_memory_bytes"`
	Dirty            []*dirtyResult `json:"dirty"`
	Notes            []string       `json:"notes,omitempty"`
	Failures         []string       `json:"failures,omitempty"`
}

func newLinuxReport(cfg *linuxConfig, hostKVM string, inBox bool) *linuxReport {
	rep := &linuxReport{env: newEnv(hostKVM, inBox), Kernel: cfg.kernel, Agent: cfg.agent, Busybox: cfg.busybox,
		Cmdline: agentguest.Cmdline, CPUs: cfg.cpus, MemoryBytes: cfg.memory, N: cfg.n, DirtyMemoryBytes: cfg.dirtyMemory,
		Cold: newRow("cold boot to agent answering"), SnapshotStop: newRow("Snapshot() stop, agent ready"),
		ColdOverWarmP50: nan, ColdOverWarmP99: nan, Dirty: []*dirtyResult{}}
	for _, drop := range []bool{false, true} {
		for _, prefault := range []bool{false, true} {
			if drop && !cfg.dropCache || prefault && !cfg.prefault {
				continue
			}
			name := "restore"
			if prefault {
				name += " --prefault"
			}
			if drop {
				name += ", page cache dropped"
			}
			rep.Restores = append(rep.Restores, &restoreWay{Name: name, Prefault: prefault, DropCache: drop,
				Call: newRow(name + ": Restore() returned"), Answered: newRow(name + " to agent answering")})
		}
	}
	return rep
}

// plain is the plain restore (lazy, page cache warm).
func (rep *linuxReport) plain() *restoreWay { return rep.Restores[0] }

func (rep *linuxReport) rows() []*row {
	rows := []*row{rep.Cold}
	for _, w := range rep.Restores {
		rows = append(rows, w.Answered)
	}
	for _, w := range rep.Restores {
		rows = append(rows, w.Call)
	}
	return append(rows, rep.SnapshotStop)
}

func (rep *linuxReport) summarise() {
	for _, r := range rep.rows() {
		r.summarise()
	}
	rep.ColdOverWarmP50 = benchstat.Ratio(rep.Cold.Stat.P50, rep.plain().Answered.Stat.P50)
	rep.ColdOverWarmP99 = benchstat.Ratio(rep.Cold.Stat.P99, rep.plain().Answered.Stat.P99)
}

func (rep *linuxReport) failed() bool {
	if len(rep.Failures) > 0 || len(rep.Cold.Samples) == 0 {
		return true
	}
	for _, w := range rep.Restores {
		if len(w.Answered.Samples) == 0 {
			return true
		}
	}
	for _, r := range rep.rows() {
		if len(r.Failures) > 0 {
			return true
		}
	}
	for _, d := range rep.Dirty {
		if d.Failure != "" {
			return true
		}
	}
	return false
}

func (rep *linuxReport) print(w io.Writer) {
	fmt.Fprintf(w, "restore against cold boot, to the guest agent answering: Linux (%s) with microvm-agent as /init,\n", rep.Kernel)
	fmt.Fprintf(w, "%d vCPU, %s; %d cold boots, one snapshot (stop) of the last, %d restores of it each way\n",
		rep.CPUs, microvm.FormatSize(rep.MemoryBytes), rep.N, rep.N)
	rep.header(w)
	fmt.Fprintf(w, "\n[%s]\n", rep.Where)
	tw := table(w)
	fmt.Fprintln(tw, "measurement\tn\tfailed\tp50\tp99\tmin\tmax\tunit\t")
	for _, r := range rep.rows() {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Name, r.Stat.N, len(r.Failures),
			fmtNum(r.Stat.P50), fmtNum(r.Stat.P99), fmtNum(r.Stat.Min), fmtNum(r.Stat.Max), r.Unit)
	}
	tw.Flush()
	fmt.Fprintf(w, "cold boot / restore: p50 %s, p99 %s (target: restore far below a cold boot)\n",
		fmtNum(rep.ColdOverWarmP50), fmtNum(rep.ColdOverWarmP99))
	for _, r := range rep.Restores[1:] {
		fmt.Fprintf(w, "%s / restore (p50): %s\n", r.Name, fmtNum(benchstat.Ratio(r.Answered.Stat.P50, rep.plain().Answered.Stat.P50)))
	}
	if d := rep.SnapshotDisk; d != nil {
		fmt.Fprintf(w, "the snapshot restored: %s MiB on disk, %s MiB of it guest memory (of %s)\n",
			fmtNum(mib(d.TotalBytes)), fmtNum(mib(d.MemoryBytes)), microvm.FormatSize(uint64(d.MemoryLength)))
	}
	fmt.Fprintln(w, "cold boot: from just before microvm.New; restore: from just before microvm.Restore; to the first")
	fmt.Fprintln(w, "health check the agent answers SERVING over Machine.DialVsock (agentapi.Connect). Restores take")
	fmt.Fprintln(w, "turns way by way; --prefault: Config.PrefaultMemory; page cache dropped: the memory file evicted first.")
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "NOTE: %s\n", n)
	}

	if len(rep.Dirty) > 0 {
		fmt.Fprintf(w, "\nsnapshot size against memory touched [%s]: one Linux guest of %s; non-zero bytes written to\n",
			rep.Where, microvm.FormatSize(rep.DirtyMemoryBytes))
		fmt.Fprintln(w, "files on its /tmp (tmpfs), then a live snapshot; guest used: MemTotal - MemFree as its agent reads them")
		tw = table(w)
		fmt.Fprintln(tw, "touched MiB\tguest used MiB\tmemory file MiB\tsnapshot MiB\tsnapshot - touched MiB\tSnapshot() live ms\tfill ms\t")
		for _, d := range rep.Dirty {
			used := nan
			if d.GuestUsedBytes >= 0 {
				used = mib(d.GuestUsedBytes)
			}
			over := nan
			if d.Disk.TotalBytes > 0 {
				over = mib(d.Disk.TotalBytes - d.TouchedBytes)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", fmtNum(mib(d.TouchedBytes)), fmtNum(used),
				fmtNum(mib(d.Disk.MemoryBytes)), fmtNum(mib(d.Disk.TotalBytes)), fmtNum(over), fmtNum(d.SnapshotMS), fmtNum(d.FillMS))
		}
		tw.Flush()
		fmt.Fprintln(w, "target: the snapshot grows with the memory the guest used, not with its size")
		for _, d := range rep.Dirty {
			for _, r := range d.Retries {
				fmt.Fprintf(w, "NOTE touched %s MiB: reaching the agent after the snapshot failed, tried again: %s\n", fmtNum(mib(d.TouchedBytes)), firstLine(r))
			}
		}
	}

	var lines []string
	lines = append(lines, rep.Failures...)
	for _, r := range rep.rows() {
		for _, f := range r.Failures {
			lines = append(lines, r.Name+": "+f)
		}
	}
	for _, d := range rep.Dirty {
		if d.Failure != "" {
			lines = append(lines, fmt.Sprintf("touched %s MiB: %s", fmtNum(mib(d.TouchedBytes)), d.Failure))
		}
	}
	printFailed(w, lines)
}

// ---- formatting ----

// table is a right-aligned tabwriter.
func table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
}

// printFailed lists failures, one line each (the JSON has the console and
// log tails).
func printFailed(w io.Writer, lines []string) {
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\n(the JSON has the guest console's and the VMM log's tail for each failure)")
	for _, l := range lines {
		fmt.Fprintf(w, "FAILED %s\n", firstLine(l))
	}
}

// fmtNum prints a figure as benchstat.FmtNum does (about three
// significant digits, "-" when it is missing), but zero as "0".
func fmtNum(n num) string {
	if n == 0 {
		return "0"
	}
	return benchstat.FmtNum(n)
}

// percent is part/whole as a percentage, "-" when whole is 0.
func percent(part, whole int64) string {
	if whole <= 0 {
		return "-"
	}
	p := 100 * float64(part) / float64(whole)
	s := strconv.FormatFloat(p, 'f', 1, 64)
	if p < 1 {
		s = strconv.FormatFloat(p, 'f', 2, 64)
	}
	return strings.TrimSuffix(s, ".0") + "%"
}
