package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/agentguest"
	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/bench/internal/benchstat"
)

// Transports a row is measured over.
const (
	viaVsock = "vsock" // the guest's agent, through Machine.DialVsock
	viaUnix  = "unix"  // the same agent code on this host, on a Unix socket
)

// row is one measurement over one transport: its samples and their
// summary.
type row struct {
	Name      string    `json:"name"`
	Transport string    `json:"transport"`
	Unit      string    `json:"unit"`
	Samples   []float64 `json:"samples"`
	Failures  []string  `json:"failures,omitempty"`
	// Redone are runs lost to a guest triple fault in the nested-KVM box
	// (docs/testing.md) and done again in a fresh VM: noted, not failed.
	Redone []string          `json:"redone_after_box_triple_fault,omitempty"`
	Stat   benchstat.Summary `json:"stat"`
	// tail says that p99 means something here (many samples); the table
	// shows it only then. The JSON always has it.
	tail bool
}

// num is a figure that encodes as JSON null when it could not be computed.
type num = benchenv.Num

// ratioRow compares one figure of a vsock row with the unix row of the
// same measurement.
type ratioRow struct {
	Name  string `json:"name"`
	Unit  string `json:"unit"`
	Vsock num    `json:"vsock"`
	Unix  num    `json:"unix"`
	Ratio num    `json:"vsock_over_unix"`
}

// report is everything one run found; main prints it and stores it as
// JSON.
type report struct {
	Time        time.Time         `json:"time"`
	Host        map[string]string `json:"host"`
	HostKVM     string            `json:"host_kvm"`
	InBox       bool              `json:"in_nested_kvm_box"`
	Kernel      string            `json:"kernel"`
	Agent       string            `json:"agent"`
	Busybox     string            `json:"busybox"`
	Cmdline     string            `json:"cmdline"`
	CPUs        int               `json:"cpus"`
	MemoryBytes uint64            `json:"memory_bytes"`
	Boots       int               `json:"boots"`
	Execs       int               `json:"execs"`
	Warmup      int               `json:"warmup_execs"`
	StreamBytes int64             `json:"stream_bytes"`
	StreamReps  int               `json:"stream_reps"`
	// Guest is what the agent's Info said in the VM the execs ran in.
	Guest map[string]string `json:"guest,omitempty"`
	// ConsoleBytesPerExec is what the guest wrote to its serial console
	// per exec of `true` (the agent logs each process's start and end
	// there), warm-up calls included; every byte is a VM exit.
	ConsoleBytesPerExec float64    `json:"guest_console_bytes_per_exec"`
	Rows                []*row     `json:"rows"`
	Ratios              []ratioRow `json:"ratios"`
	// Notes say what else happened: a VM replaced on the way.
	Notes []string `json:"notes,omitempty"`
}

// Row names.
const (
	nameNew    = "microvm.New"
	nameReady  = "boot to agent ready"
	nameExec   = "exec true"
	nameStream = "stdout stream"
)

func newReport(cfg *config, hostKVM string, inBox bool) *report {
	return &report{
		Time: time.Now().UTC(), Host: benchenv.HostInfo(), HostKVM: hostKVM, InBox: inBox,
		Kernel: cfg.kernel, Agent: cfg.agent, Busybox: cfg.busybox, Cmdline: agentguest.Cmdline,
		CPUs: cfg.cpus, MemoryBytes: cfg.memory, Boots: cfg.n, Execs: cfg.execs, Warmup: cfg.warmup,
		StreamBytes: cfg.streamBytes, StreamReps: cfg.streamReps,
	}
}

// add appends an empty row.
func (rep *report) add(name, transport, unit string, tail bool) *row {
	r := &row{Name: name, Transport: transport, Unit: unit, Samples: []float64{}, tail: tail}
	rep.Rows = append(rep.Rows, r)
	return r
}

// find returns the row of name over transport, or nil.
func (rep *report) find(name, transport string) *row {
	for _, r := range rep.Rows {
		if r.Name == name && r.Transport == transport {
			return r
		}
	}
	return nil
}

// summarise fills in each row's summary and the vsock/unix ratios: the
// p50 and p99 of exec latency, and the median stream throughput.
func (rep *report) summarise() {
	for _, r := range rep.Rows {
		r.Stat = benchstat.Summarise(r.Samples)
	}
	rep.Ratios = nil
	pick := []struct {
		row, label string
		figure     func(benchstat.Summary) num
	}{
		{nameExec, "p50", func(s benchstat.Summary) num { return s.P50 }},
		{nameExec, "p99", func(s benchstat.Summary) num { return s.P99 }},
		{nameStream, "median", func(s benchstat.Summary) num { return s.P50 }},
	}
	for _, p := range pick {
		v, u := rep.find(p.row, viaVsock), rep.find(p.row, viaUnix)
		if v == nil || u == nil {
			continue
		}
		a, b := p.figure(v.Stat), p.figure(u.Stat)
		rep.Ratios = append(rep.Ratios, ratioRow{Name: p.row + " " + p.label, Unit: v.Unit, Vsock: a, Unix: b, Ratio: benchstat.Ratio(a, b)})
	}
}

// failed reports whether any row has a failure or no samples.
func (rep *report) failed() bool {
	for _, r := range rep.Rows {
		if len(r.Failures) > 0 || len(r.Samples) == 0 {
			return true
		}
	}
	return false
}

// print writes the tables.
func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "exec through the guest agent: microvm (vsock, Go API) vs the same agent on this host (Unix socket)\n")
	fmt.Fprintf(w, "guest: %d vCPU, %s, %s; %d boots, %d execs after %d warm-up, %d x %s to stdout\n",
		rep.CPUs, microvm.FormatSize(rep.MemoryBytes), rep.Kernel, rep.Boots, rep.Execs, rep.Warmup,
		rep.StreamReps, microvm.FormatSize(uint64(rep.StreamBytes)))
	fmt.Fprintf(w, "host: %s, %s CPUs, KVM %s\n", rep.Host["cpu"], rep.Host["cpus"], rep.HostKVM)
	if rep.InBox {
		fmt.Fprintln(w, "IN THE NESTED-KVM BOX: L1 under QEMU TCG with emulated SVM; guest and host side run at TCG speed.")
		fmt.Fprintln(w, "The ratios compare vsock and a Unix socket on the same emulated machine; the times are not figures to quote.")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "measurement\ttransport\tn\tfailed\tp50\tp99\tmin\tmax\tunit\t")
	for _, r := range rep.Rows {
		p99 := "-"
		if r.tail {
			p99 = benchstat.FmtNum(r.Stat.P99)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Name, r.Transport, r.Stat.N, len(r.Failures),
			benchstat.FmtNum(r.Stat.P50), p99, benchstat.FmtNum(r.Stat.Min), benchstat.FmtNum(r.Stat.Max), r.Unit)
	}
	tw.Flush()
	if len(rep.Ratios) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "vsock/unix\tvsock\tunix\tratio\t")
		for _, q := range rep.Ratios {
			fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\t\n", q.Name, q.Unit, benchstat.FmtNum(q.Vsock), benchstat.FmtNum(q.Unix), benchstat.FmtNum(q.Ratio))
		}
		tw.Flush()
	}
	fmt.Fprintln(w, "\nmicrovm.New: creating the machine; boot to agent ready: from just before New to the first")
	fmt.Fprintln(w, "Health call answered over Machine.DialVsock; exec true: one Client.Exec of `true`, call to exit status;")
	fmt.Fprintln(w, "stdout stream: `head -c N /dev/zero` read by the host, N over the call's time (MB/s = 10^6 bytes/s).")
	if rep.ConsoleBytesPerExec > 0 {
		fmt.Fprintf(w, "The guest agent wrote %.0f bytes to the serial console per exec (one VM exit a byte).\n", rep.ConsoleBytesPerExec)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "NOTE: %s\n", n)
	}
	if rep.failed() {
		fmt.Fprintln(w, "(the JSON has the guest console's tail for each failure)")
	}
	for _, r := range rep.Rows {
		for _, f := range r.Redone {
			fmt.Fprintf(w, "REDONE %s (%s) in a fresh VM after the box's known L2 triple fault: %s\n", r.Name, r.Transport, firstLine(f))
		}
		for _, f := range r.Failures {
			fmt.Fprintf(w, "FAILED %s (%s): %s\n", r.Name, r.Transport, firstLine(f))
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// firstLine is s up to its console tail, for a one-line note (the JSON
// keeps all of it).
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "; console: ")
	return s
}
