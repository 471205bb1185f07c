package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
)

// row is one line of build/bench/device.json (the fields are the file's format, kept
// stable so runs compare):
// medians over the pairs. A throughput row has RTT fields 0; an RTT row has
// throughput fields 0 and its kicks, interrupts and CPU per MiB of the
// ping-pong's bytes (both ways).
type row struct {
	Backend     string  `json:"backend"`
	Options     string  `json:"options"`
	Direction   string  `json:"direction"`
	Payload     int     `json:"payload"`
	BytesPerS   float64 `json:"bytes_per_s"`
	MsgsPerS    float64 `json:"msgs_per_s"`
	RTTP50      int64   `json:"rtt_p50_ns"`
	RTTP99      int64   `json:"rtt_p99_ns"`
	KicksPerMiB float64 `json:"kicks_per_mib"`
	// BusyKicksPerMiB: the TX kicks among them made while the device
	// still held earlier TX packets (seed 002's target).
	BusyKicksPerMiB  float64 `json:"tx_busy_kicks_per_mib"`
	IrqsPerMiB       float64 `json:"irqs_per_mib"`
	BackendCPUPerMiB float64 `json:"backend_cpu_s_per_mib"`
	// The back-end's read- and write-like syscalls and its context
	// switches per MiB.
	BackendSyscallsPerMiB float64 `json:"backend_syscalls_per_mib"`
	BackendSwitchesPerMiB float64 `json:"backend_switches_per_mib"`
	// The same costs of the other two parties: the host side (the peer
	// process) and the guest driver (this program's own process).
	HostCPUPerMiB       float64 `json:"host_cpu_s_per_mib"`
	HostSyscallsPerMiB  float64 `json:"host_syscalls_per_mib"`
	HostSwitchesPerMiB  float64 `json:"host_switches_per_mib"`
	GuestCPUPerMiB      float64 `json:"guest_cpu_s_per_mib"`
	GuestSyscallsPerMiB float64 `json:"guest_syscalls_per_mib"`
	GuestSwitchesPerMiB float64 `json:"guest_switches_per_mib"`
	AFUnixBytesPerS     float64 `json:"af_unix_bytes_per_s"`
	// Datagram rows only (dgram.go): Kind "dgram", Loss the fraction of
	// sent datagrams not delivered, Note "not offered" when the back-end
	// ran without datagrams.
	Kind string  `json:"kind,omitempty"`
	Loss float64 `json:"loss,omitempty"`
	Note string  `json:"note,omitempty"`
}

// aggRow is a row with what the table adds: its kind, how many samples,
// the spread, and the AF_UNIX reference's RTT.
type aggRow struct {
	row
	kind           string
	n              int
	minVal, maxVal float64 // bytes/s or RTT p50 (ns) of the samples
	afUnixP50      int64
}

// report is build/bench/device-runs.json: the settings, the host, every
// sample and every failure.
type report struct {
	Date        string            `json:"date"`
	Host        map[string]string `json:"host"`
	Pairs       int               `json:"pairs"`
	Mode        string            `json:"mode"`
	Duration    string            `json:"duration"`
	RTTDuration string            `json:"rtt_duration"`
	RTTMax      int               `json:"rtt_max"`
	QueueSize   int               `json:"queue_size"`
	RXBuf       int               `json:"rx_buf"`
	BufAlloc    int               `json:"buf_alloc"`
	EventIdx    bool              `json:"event_idx"`
	TxPublish   string            `json:"tx_publish"`
	Targets     map[string]string `json:"targets"`
	// Versions: each back-end binary's answer to "version" (microvm), or
	// "--version" (the peer), where it gives one.
	Versions map[string]string `json:"versions,omitempty"`
	Samples  []sample          `json:"samples"`
	Failures []string          `json:"failures,omitempty"`
}

// median is the middle value (the lower middle for an even count).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[(len(s)-1)/2]
}

type cellKey struct {
	backend, options, dir, kind string
	payload                     int
}

// aggregate turns samples into rows, in target then cell order; cells no
// sample measured are left out.
func aggregate(samples []sample, order []target, cells []cell) []aggRow {
	by := map[cellKey][]sample{}
	for _, s := range samples {
		k := cellKey{s.Backend, s.Options, s.Dir, s.Kind, s.Payload}
		by[k] = append(by[k], s)
	}
	field := func(ss []sample, f func(sample) float64) (med, lo, hi float64) {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		sort.Float64s(v)
		return median(v), v[0], v[len(v)-1]
	}
	var out []aggRow
	for _, t := range order {
		if t.backend == "af_unix" {
			continue
		}
		for _, c := range cells {
			ss := by[cellKey{t.backend, t.options, c.dir, c.kind, c.payload}]
			if len(ss) == 0 {
				continue
			}
			r := aggRow{row: row{Backend: t.backend, Options: t.options, Direction: c.dir, Payload: c.payload}, kind: c.kind, n: len(ss)}
			r.KicksPerMiB, _, _ = field(ss, func(s sample) float64 { return s.KicksPerMiB })
			r.BusyKicksPerMiB, _, _ = field(ss, func(s sample) float64 { return s.BusyKicksPerMiB })
			r.IrqsPerMiB, _, _ = field(ss, func(s sample) float64 { return s.IrqsPerMiB })
			r.BackendCPUPerMiB, _, _ = field(ss, func(s sample) float64 { return s.BackendCPUPerMiB })
			r.BackendSyscallsPerMiB, _, _ = field(ss, func(s sample) float64 { return s.BackendSyscallsPerMiB })
			r.BackendSwitchesPerMiB, _, _ = field(ss, func(s sample) float64 { return s.BackendSwitchesPerMiB })
			r.setParties(ss, field)
			ref := by[cellKey{"af_unix", "-", c.dir, c.kind, c.payload}]
			if c.kind == kindTput {
				r.BytesPerS, r.minVal, r.maxVal = field(ss, func(s sample) float64 { return s.BytesPerS })
				r.MsgsPerS, _, _ = field(ss, func(s sample) float64 { return s.MsgsPerS })
				if len(ref) > 0 {
					r.AFUnixBytesPerS, _, _ = field(ref, func(s sample) float64 { return s.BytesPerS })
				}
			} else {
				var p50, p99 float64
				p50, r.minVal, r.maxVal = field(ss, func(s sample) float64 { return float64(s.RTTP50) })
				p99, _, _ = field(ss, func(s sample) float64 { return float64(s.RTTP99) })
				r.RTTP50, r.RTTP99 = int64(p50), int64(p99)
				if len(ref) > 0 {
					m, _, _ := field(ref, func(s sample) float64 { return float64(s.RTTP50) })
					r.afUnixP50 = int64(m)
				}
			}
			out = append(out, r)
		}
	}
	return out
}

// setParties fills the host's and the guest's costs per MiB: medians of
// the samples ss, by field.
func (r *aggRow) setParties(ss []sample, field func([]sample, func(sample) float64) (float64, float64, float64)) {
	med := func(f func(sample) float64) float64 { m, _, _ := field(ss, f); return m }
	r.HostCPUPerMiB = med(func(s sample) float64 { return s.HostCPUPerMiB })
	r.HostSyscallsPerMiB = med(func(s sample) float64 { return s.HostSyscallsPerMiB })
	r.HostSwitchesPerMiB = med(func(s sample) float64 { return s.HostSwitchesPerMiB })
	r.GuestCPUPerMiB = med(func(s sample) float64 { return s.GuestCPUPerMiB })
	r.GuestSyscallsPerMiB = med(func(s sample) float64 { return s.GuestSyscallsPerMiB })
	r.GuestSwitchesPerMiB = med(func(s sample) float64 { return s.GuestSwitchesPerMiB })
}

func sizeName(n int) string {
	switch {
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%d B", n)
	}
}

// printTable prints one line per target, direction and payload (the
// throughput row and the RTT row side by side), then the ratios the device's
// performance targets are stated in.
func printTable(w io.Writer, rep *report, rows []aggRow, order []target, cells []cell) {
	fmt.Fprintf(w, "vhost-user-vsock device benchmark: %d pair(s), medians (min-max); guest driver %s mode, TX published per %s, EVENT_IDX %v, ring %d, RX buffers %d B, window %d B; streams %s, ping-pongs %s\n",
		rep.Pairs, rep.Mode, rep.TxPublish, rep.EventIdx, rep.QueueSize, rep.RXBuf, rep.BufAlloc, rep.Duration, rep.RTTDuration)
	fmt.Fprintf(w, "host: %s, %s CPUs, kernel %s\n", rep.Host["cpu"], rep.Host["cpus"], rep.Host["kernel"])
	for _, k := range sortedKeys(rep.Versions) {
		fmt.Fprintf(w, "%s: %s\n", k, rep.Versions[k])
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\toptions\tdir\tpayload\tMB/s\t(min-max)\tmsgs/s\tAF_UNIX MB/s\tx AF_UNIX\tRTT p50 us\t(min-max)\tp99 us\tAF_UNIX p50 us\tkicks/MiB\tirqs/MiB\tCPU ms/MiB\tsyscalls/MiB\tswitches/MiB\t")
	type lineKey struct {
		backend, options, dir string
		payload               int
	}
	tput, rtt := map[lineKey]aggRow{}, map[lineKey]aggRow{}
	var keys []lineKey
	for _, r := range rows {
		k := lineKey{r.Backend, r.Options, r.Direction, r.Payload}
		if _, seen := tput[k]; !seen {
			if _, seen := rtt[k]; !seen {
				keys = append(keys, k)
			}
		}
		if r.kind == kindTput {
			tput[k] = r
		} else {
			rtt[k] = r
		}
	}
	dash := "-"
	for _, k := range keys {
		t, hasT := tput[k]
		r, hasR := rtt[k]
		cols := []string{k.backend, k.options, k.dir, sizeName(k.payload)}
		if hasT {
			ratio := dash
			if t.AFUnixBytesPerS > 0 {
				ratio = fmt.Sprintf("%.2f", t.BytesPerS/t.AFUnixBytesPerS)
			}
			cols = append(cols, fmt.Sprintf("%.1f", t.BytesPerS/1e6), fmt.Sprintf("(%.0f-%.0f)", t.minVal/1e6, t.maxVal/1e6),
				fmt.Sprintf("%.0f", t.MsgsPerS), fmt.Sprintf("%.1f", t.AFUnixBytesPerS/1e6), ratio)
		} else {
			cols = append(cols, dash, "", dash, dash, dash)
		}
		if hasR {
			ref := dash
			if r.afUnixP50 > 0 {
				ref = fmt.Sprintf("%.1f", float64(r.afUnixP50)/1e3)
			}
			cols = append(cols, fmt.Sprintf("%.1f", float64(r.RTTP50)/1e3), fmt.Sprintf("(%.1f-%.1f)", r.minVal/1e3, r.maxVal/1e3),
				fmt.Sprintf("%.1f", float64(r.RTTP99)/1e3), ref)
		} else {
			cols = append(cols, dash, "", dash, dash)
		}
		if hasT {
			cols = append(cols, fmt.Sprintf("%.1f", t.KicksPerMiB), fmt.Sprintf("%.1f", t.IrqsPerMiB), fmt.Sprintf("%.2f", t.BackendCPUPerMiB*1e3),
				fmt.Sprintf("%.1f", t.BackendSyscallsPerMiB), fmt.Sprintf("%.1f", t.BackendSwitchesPerMiB))
		} else {
			cols = append(cols, dash, dash, dash, dash, dash)
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintln(w, "MB/s = 10^6 bytes/s; kicks, irqs, CPU, syscalls and switches per MiB of payload at saturation (the stream); CPU = back-end process utime+stime;")
	fmt.Fprintln(w, "syscalls = the back-end's read- and write-like ones (/proc/PID/io syscr+syscw); switches = its context switches, all threads")
	for _, l := range ratios(rows) {
		fmt.Fprintln(w, l)
	}
}

// printParties prints, for each stream row and for the AF_UNIX
// reference, what each party paid per MiB moved: the host side (the peer
// process), the back-end (none for AF_UNIX) and the guest side (the guest
// driver; for AF_UNIX this program's end of the socket).
func printParties(w io.Writer, rows []aggRow, samples []sample) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\toptions\tdir\tpayload\tMB/s\thost CPU ms\thost syscalls\thost switches\tback-end CPU ms\tback-end syscalls\tback-end switches\tguest CPU ms\tguest syscalls\tguest switches\t")
	line := func(backend, options, dir string, payload int, mbs float64, be []string, r row) {
		cols := []string{backend, options, dir, sizeName(payload), fmt.Sprintf("%.1f", mbs),
			fmt.Sprintf("%.2f", r.HostCPUPerMiB*1e3), fmt.Sprintf("%.1f", r.HostSyscallsPerMiB), fmt.Sprintf("%.1f", r.HostSwitchesPerMiB)}
		cols = append(cols, be...)
		cols = append(cols, fmt.Sprintf("%.2f", r.GuestCPUPerMiB*1e3), fmt.Sprintf("%.1f", r.GuestSyscallsPerMiB), fmt.Sprintf("%.1f", r.GuestSwitchesPerMiB))
		fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	}
	for _, r := range rows {
		if r.kind != kindTput {
			continue
		}
		line(r.Backend, r.Options, r.Direction, r.Payload, r.BytesPerS/1e6, []string{fmt.Sprintf("%.2f", r.BackendCPUPerMiB*1e3),
			fmt.Sprintf("%.1f", r.BackendSyscallsPerMiB), fmt.Sprintf("%.1f", r.BackendSwitchesPerMiB)}, r.row)
	}
	type key struct {
		dir     string
		payload int
	}
	ref := map[key][]sample{}
	var keys []key
	for _, s := range samples {
		if s.Backend != "af_unix" || s.Kind != kindTput {
			continue
		}
		k := key{s.Dir, s.Payload}
		if _, ok := ref[k]; !ok {
			keys = append(keys, k)
		}
		ref[k] = append(ref[k], s)
	}
	for _, k := range keys {
		ss := ref[k]
		field := func(ss []sample, f func(sample) float64) (float64, float64, float64) {
			v := make([]float64, len(ss))
			for i, s := range ss {
				v[i] = f(s)
			}
			return median(v), 0, 0
		}
		var r aggRow
		r.setParties(ss, field)
		mbs, _, _ := field(ss, func(s sample) float64 { return s.BytesPerS })
		line("af_unix", "-", k.dir, k.payload, mbs/1e6, []string{"-", "-", "-"}, r.row)
	}
	tw.Flush()
	fmt.Fprintln(w, "per MiB of payload, medians; host = the peer process, guest = this program (the guest driver; for af_unix its end of the socket)")
}

// ratios are the comparisons the device's performance targets are stated
// in, where this run measured both sides.
func ratios(rows []aggRow) []string {
	find := func(backend, options, dir, kind string, payload int) (aggRow, bool) {
		for _, r := range rows {
			if r.Backend == backend && r.Options == options && r.Direction == dir && r.kind == kind && r.Payload == payload {
				return r, true
			}
		}
		return aggRow{}, false
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, "  "+fmt.Sprintf(format, args...)) }
	for _, d := range []string{h2g, g2h} {
		if r, ok := find("microvm", "all-on", d, kindTput, 65536); ok && r.AFUnixBytesPerS > 0 {
			add("64 KiB %s, all-on: %.2fx AF_UNIX bytes/s", d, r.BytesPerS/r.AFUnixBytesPerS)
		}
	}
	if a, ok := find("microvm", "all-on", h2g, kindTput, 65536); ok {
		if b, ok := find("microvm", "all-on", g2h, kindTput, 65536); ok && b.BytesPerS > 0 {
			add("64 KiB, all-on: h2g/g2h bytes/s %.2f", a.BytesPerS/b.BytesPerS)
		}
	}
	for _, d := range []string{h2g, g2h} {
		a, ok1 := find("microvm", "all-on", d, kindTput, 64)
		b, ok2 := find("microvm", "all-off", d, kindTput, 64)
		if ok1 && ok2 && b.MsgsPerS > 0 {
			add("64 B %s msgs/s: all-on/all-off %.2fx", d, a.MsgsPerS/b.MsgsPerS)
		}
	}
	for _, d := range []string{h2g, g2h} {
		a, ok1 := find("microvm", "all-on", d, kindRTT, 64)
		b, ok2 := find("microvm", "no-direct-enqueue", d, kindRTT, 64)
		if ok1 && ok2 && b.RTTP50 > 0 {
			add("64 B %s RTT p50: direct enqueue on %.1f us, off %.1f us (%+.0f%%)", d, float64(a.RTTP50)/1e3, float64(b.RTTP50)/1e3,
				100*(float64(a.RTTP50)/float64(b.RTTP50)-1))
		}
	}
	for _, p := range []int{64, 4096, 65536} {
		a, ok1 := find("microvm", "all-on", g2h, kindTput, p)
		b, ok2 := find("microvm", "no-kick-suppress", g2h, kindTput, p)
		if ok1 && ok2 {
			add("%s g2h kicks/MiB: suppression on %.1f, off %.1f (of which while the device worked: on %.1f, off %.1f)",
				sizeName(p), a.KicksPerMiB, b.KicksPerMiB, a.BusyKicksPerMiB, b.BusyKicksPerMiB)
		}
	}
	for _, p := range []int{4096, 65536} {
		for _, d := range []string{h2g, g2h} {
			a, ok1 := find("microvm", "all-on", d, kindTput, p)
			b, ok2 := find("peer", "all-on", d, kindTput, p)
			if ok1 && ok2 && b.BytesPerS > 0 {
				add("%s %s: microvm/peer bytes/s %.2fx", sizeName(p), d, a.BytesPerS/b.BytesPerS)
			}
			a, ok1 = find("microvm", "all-on", d, kindRTT, p)
			b, ok2 = find("peer", "all-on", d, kindRTT, p)
			if ok1 && ok2 {
				add("%s %s RTT p50: microvm %.1f us, peer %.1f us", sizeName(p), d, float64(a.RTTP50)/1e3, float64(b.RTTP50)/1e3)
			}
		}
	}
	// The wide-window rows (-wide-buf-alloc): what a larger guest window
	// changes, for microvm and the peer alike.
	wide := ""
	for _, r := range rows {
		if r.Backend == "microvm" && strings.HasPrefix(r.Options, "all-on win=") {
			wide = r.Options
			break
		}
	}
	if wide != "" {
		for _, p := range []int{4096, 65536} {
			for _, d := range []string{h2g, g2h} {
				a, ok1 := find("microvm", wide, d, kindTput, p)
				b, ok2 := find("microvm", "all-on", d, kindTput, p)
				if !ok1 || !ok2 || b.BytesPerS <= 0 {
					continue
				}
				line := fmt.Sprintf("%s %s, %s: microvm %.2fx its default window's bytes/s", sizeName(p), d, strings.TrimPrefix(wide, "all-on "), a.BytesPerS/b.BytesPerS)
				if a.AFUnixBytesPerS > 0 {
					line += fmt.Sprintf(", %.2fx AF_UNIX", a.BytesPerS/a.AFUnixBytesPerS)
				}
				if pw, ok := find("peer", wide, d, kindTput, p); ok && pw.BytesPerS > 0 {
					line += fmt.Sprintf(", %.2fx the peer with the same window", a.BytesPerS/pw.BytesPerS)
				}
				add("%s", line)
			}
		}
	}
	// The GOMAXPROCS rows (-gomaxprocs): the same back-end under another
	// scheduler width.
	var gmps []string
	for _, r := range rows {
		if r.Backend == "microvm" && strings.HasPrefix(r.Options, "all-on gmp=") && !slices.Contains(gmps, r.Options) {
			gmps = append(gmps, r.Options)
		}
	}
	for _, g := range gmps {
		for _, p := range []int{64, 65536} {
			for _, d := range []string{h2g, g2h} {
				a, ok1 := find("microvm", g, d, kindTput, p)
				b, ok2 := find("microvm", "all-on", d, kindTput, p)
				if ok1 && ok2 && b.BytesPerS > 0 {
					add("%s %s, %s: %.2fx all-on's bytes/s; back-end switches/MiB %.1f (all-on %.1f), CPU ms/MiB %.2f (%.2f)", sizeName(p), d,
						strings.TrimPrefix(g, "all-on "), a.BytesPerS/b.BytesPerS, a.BackendSwitchesPerMiB, b.BackendSwitchesPerMiB,
						a.BackendCPUPerMiB*1e3, b.BackendCPUPerMiB*1e3)
				}
			}
		}
	}
	if len(out) > 0 {
		out = append([]string{"ratios:"}, out...)
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
