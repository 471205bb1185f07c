// Command soak runs microvm's scale and soak checks (many connections at
// once, bulk data, repeated VM start/stop) and prints what they measured;
// make soak runs all three at full size.
//
//	soak [flags] conns    # -conns 10000: connections open at once through one vsock device
//	soak [flags] bytes    # -bytes 10G: bulk data each way, SHA-256 checked
//	soak [flags] cycles   # -cycles 1000: VM start/stop in one process through the Go API
//
// conns runs the vsock device in a process of its own (this program again,
// wired as `microvm vhost-user-vsock` wires it) with bench/internal/vhufront's
// guest driver attached over vhost-user: no KVM, and no guest kernel, in the
// path (the test guest serves at most 128 connections). It reports the
// device process's memory, descriptors and goroutines with none, all and
// again none of the connections open, and per connection.
//
// bytes and cycles boot the bundled test guest (docs/testguest.md) under
// KVM in this process through the Go API (microvm.New, Run, Close), so they
// need /dev/kvm (a PVM-backed one runs the test guest).
//
// Each prints a table and writes its figures as JSON (-json). It exits 1
// when a run fails or crosses a bound (a leak, a limit not enforced, a byte
// out of place) and 2 on a usage error. The short versions run as Go tests
// (go test ./bench/soak) in make test. docs/soak.md says what each checks
// and records the last full run.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/internal/testing/testenv"
)

func main() {
	if cfg := os.Getenv(envDevice); cfg != "" {
		os.Exit(deviceMain(cfg))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.String("json", "", "write the figures here as JSON (empty: don't)")
	guest := fs.String("guest", "bin/testguest", "the test guest (bytes, cycles)")
	conns := fs.Int("conns", 10000, "conns: connections open at once")
	guestConns := fs.Int("guest-conns", -1, "conns: how many of them the guest opens (-1: half)")
	payload := fs.String("payload", "4K", "conns: bytes echoed on each connection")
	maxConns := fs.Int("max-conns", 0, "conns: the device's connection limit, --vsock-max-conns (0: -conns, and one more is checked refused)")
	connBuffer := fs.String("conn-buffer", "64K", "conns: the device's per-connection buffer, --vsock-conn-buffer")
	bufferTotal := fs.String("buffer-total", "0", "conns: the device's bound on buffered guest->host bytes, --vsock-buffer-total (0: the device's default, 64M or -max-conns times 4K when more)")
	hold := fs.Duration("hold", 2*time.Second, "conns: how long every connection stays open before closing")
	parallel := fs.Int("parallel", 128, "conns: handshakes in flight at once, each side")
	bytesFlag := fs.String("bytes", "10G", "bytes: what each leg moves each way")
	bytesConns := fs.Int("bytes-conns", 1, "bytes: connections the echo leg runs at once (at most 128)")
	legs := fs.String("legs", "echo,connect", "bytes: the legs to run (echo: host data echoed by the guest; connect: guest data echoed by the host)")
	cycles := fs.Int("cycles", 1000, "cycles: VMs started and stopped")
	every := fs.Int("every", 100, "cycles: measure after every N cycles")
	cyclePayload := fs.String("cycle-payload", "64K", "cycles: bytes echoed through vsock in each VM")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "soak: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() != 1 {
		return usage("want one of conns, bytes, cycles (got %q)", fs.Args())
	}
	what := fs.Arg(0)
	sizes := map[string]int64{}
	for name, s := range map[string]string{"payload": *payload, "conn-buffer": *connBuffer, "buffer-total": *bufferTotal, "bytes": *bytesFlag, "cycle-payload": *cyclePayload} {
		n, err := parseSize(s)
		if err != nil {
			return usage("-%s: %v", name, err)
		}
		sizes[name] = n
	}
	if what != "conns" {
		if testenv.Host() == testenv.KVMNone {
			fmt.Fprintf(stderr, "soak %s: boots the test guest and needs /dev/kvm; without it, run it in the nested-KVM box:\n  scripts/kvmbox --timeout 60m -- %s\n", what, benchenv.BoxCommand())
			return 2
		}
		if _, err := os.Stat(*guest); err != nil {
			return usage("-guest: %v (make bin/testguest)", err)
		}
	}
	host := benchenv.HostInfo()
	var (
		result any
		failed []string
		err    error
	)
	switch what {
	case "conns":
		gc := *guestConns
		if gc < 0 {
			gc = *conns / 2
		}
		if *conns < 1 || sizes["payload"] < 1 || sizes["payload"] > 1<<20 || sizes["conn-buffer"] < 1 || sizes["conn-buffer"] > 1<<30 {
			return usage("-conns, -payload (1..1M) and -conn-buffer (1..1G) must be positive")
		}
		cfg := connsConfig{Conns: *conns, GuestInitiated: gc, Payload: int(sizes["payload"]), MaxConns: *maxConns,
			ConnBuffer: uint32(sizes["conn-buffer"]), MaxBuffered: uint64(sizes["buffer-total"]), Hold: *hold, Parallel: *parallel}
		var r *connsResult
		r, err = runConns(cfg, stderr)
		if r != nil {
			r.Notes = connsNotes
			if err == nil {
				printConns(stdout, r)
			}
			result, failed = r, r.Failures
		}
	case "bytes":
		if sizes["bytes"] < 1 || *bytesConns < 1 || *bytesConns > 128 {
			return usage("-bytes must be positive, -bytes-conns 1..128")
		}
		cfg := bytesConfig{Guest: *guest, Bytes: sizes["bytes"], Conns: *bytesConns, Legs: strings.Split(*legs, ",")}
		var r *bytesResult
		r, err = runBytes(cfg, stderr)
		if r != nil {
			r.Notes = bytesNotes
			if err == nil {
				printBytes(stdout, r)
			}
			result = r
		}
	case "cycles":
		if *cycles < 1 || *every < 1 {
			return usage("-cycles and -every must be positive")
		}
		cfg := cyclesConfig{Guest: *guest, Cycles: *cycles, Every: *every, Payload: int(sizes["cycle-payload"]), CheckMemory: *cycles >= 200}
		var r *cyclesResult
		r, err = runCycles(cfg, stderr)
		if r != nil {
			r.Notes = cyclesNotes
			if err == nil {
				printCycles(stdout, r)
			}
			result, failed = r, r.Failures
		}
	default:
		return usage("unknown run %q: want conns, bytes or cycles", what)
	}
	if *jsonOut != "" && result != nil {
		out := map[string]any{"date": time.Now().Format(time.RFC3339), "host": host, "run": what, "result": result}
		if err != nil {
			out["error"] = err.Error()
		}
		if werr := benchenv.WriteJSON(*jsonOut, out); werr != nil {
			fmt.Fprintf(stderr, "soak: %v\n", werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "soak %s: FAILED: %v\n", what, err)
		return 1
	}
	if len(failed) > 0 {
		for _, f := range failed {
			fmt.Fprintf(stdout, "FAILED: %s\n", f)
		}
		return 1
	}
	fmt.Fprintf(stdout, "soak %s: ok\n", what)
	return 0
}

var (
	connsNotes = []string{
		"the device runs in a process of its own (vsock.New, ListenUDS, vhostuser.Listen, as microvm vhost-user-vsock); the guest is bench/internal/vhufront's driver over vhost-user shared memory, not a kernel",
		"rss, heap and fds per connection: (open or held, the larger) less base, over conns; heap is HeapAlloc after a GC; kernel socket memory is not in RSS",
		"buffer_granted_per_conn: the device's own accounting (Stats.BufferGranted): guest->host bytes each connection may make it buffer: a 4 KiB window each from a reserve of max-conns x 4 KiB, grown (doubling, up to conn-buffer and to buffer-total split among the open connections) only on connections whose guest sends",
	}
	bytesNotes = []string{
		"to_guest and from_guest are the device's RxBytes and TxBytes counters: payload bytes through its rings",
		"mb_per_s_each_way: bytes over the leg's wall time (boot included for connect), both directions at once, 10^6 bytes/s",
		"before/after: this process (the VMM: device, vCPU, host ends); peak_rss includes the guest RAM the guest touched",
	}
	cyclesNotes = []string{
		"each cycle: New, Run, guest listening, one vsock connection echoing the payload, then the guest exits (even cycles) or Run is canceled with the connection open (odd), then Close",
		"samples are taken after the goroutines settle (up to 2 s); RSS includes the Go heap's high-water, which the runtime returns to the OS slowly",
	}
)

// printConns prints the connection soak's table.
func printConns(w io.Writer, r *connsResult) {
	c := r.Config
	fmt.Fprintf(w, "connection soak: %d connections open at once through one vsock device (%d host-initiated, %d guest-initiated), %s echoed on each\n",
		c.Conns, c.Conns-c.GuestInitiated, c.GuestInitiated, sizeName(int64(c.Payload)))
	fmt.Fprintf(w, "device limits: max-conns %d, conn-buffer %s, buffer-total %s\n\n", c.MaxConns, sizeName(int64(c.ConnBuffer)), sizeName(int64(c.MaxBuffered)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "device process\tbase\topen\theld\tafter\t")
	reps := []deviceReport{r.Base, r.Open, r.Held, r.After}
	row := func(name string, f func(deviceReport) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, d := range reps {
			fmt.Fprintf(tw, "%s\t", f(d))
		}
		fmt.Fprintln(tw)
	}
	row("connections", func(d deviceReport) string { return fmt.Sprint(d.Stats.ConnsOpen) })
	row("fds", func(d deviceReport) string { return fmt.Sprint(d.Usage.FDs) })
	row("goroutines", func(d deviceReport) string { return fmt.Sprint(d.Usage.Goroutines) })
	row("threads", func(d deviceReport) string { return fmt.Sprint(d.Usage.Threads) })
	row("RSS MiB", func(d deviceReport) string { return mib(d.Usage.RSS) })
	row("heap MiB", func(d deviceReport) string { return mib(d.Usage.HeapAlloc) })
	row("buffer granted MiB", func(d deviceReport) string { return mib(d.Stats.BufferGranted) })
	tw.Flush()
	fmt.Fprintf(w, "\nper connection: RSS %.2f KiB, heap %.2f KiB, fds %.2f, buffer granted %.2f KiB\n",
		r.RSSPerConn/1024, r.HeapPerConn/1024, r.FDsPerConn, r.GrantedPerConn/1024)
	fmt.Fprintf(w, "opened and echoed in %.1f s, closed in %.1f s; %s checked each way\n", r.OpenSeconds, r.CloseSeconds, sizeName(r.BytesChecked))
	if r.ExtraRefused != "" {
		fmt.Fprintf(w, "connection %d (past max-conns) refused: %s\n", c.Conns+1, r.ExtraRefused)
	}
	fmt.Fprintf(w, "device peak RSS (VmHWM) %s MiB; this process (guest driver and %d host ends) RSS %s MiB, %d fds; RLIMIT_NOFILE %d\n",
		mib(r.PeakRSS), c.Conns, mib(r.Soak.RSS), r.Soak.FDs, r.NoFile)
}

// printBytes prints the bulk-transfer soak's table.
func printBytes(w io.Writer, r *bytesResult) {
	fmt.Fprintf(w, "bulk soak: %s each way per leg through the test guest under KVM (%s), Go API in this process\n\n", sizeName(r.Config.Bytes), r.HostKVM)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "leg\tconns\tto guest\tfrom guest\tseconds\tMB/s each way\tfds before/after\tgoroutines before/after\tpeak RSS MiB\t")
	for _, l := range r.Legs {
		conns := len(l.SHA256)
		if l.Leg == "connect" {
			conns = 1
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.1f\t%.0f\t%d/%d\t%d/%d\t%s\t\n", l.Leg, conns, l.ToGuest, l.FromGuest, l.Seconds, l.MBps,
			l.Before.FDs, l.After.FDs, l.Before.Goroutines, l.After.Goroutines, mib(l.After.PeakRSS))
	}
	tw.Flush()
	for _, l := range r.Legs {
		fmt.Fprintf(w, "\n%s: %s\n", l.Leg, l.Checked)
		for i, s := range l.SHA256 {
			fmt.Fprintf(w, "  SHA-256 %d: %s\n", i, s)
		}
		if l.Guest != "" {
			fmt.Fprintf(w, "  %s\n", l.Guest)
		}
	}
}

// printCycles prints the start/stop soak's table.
func printCycles(w io.Writer, r *cyclesResult) {
	fmt.Fprintf(w, "start/stop soak: %d VMs (the test guest, KVM %s) started and stopped in one process through the Go API, %s echoed over vsock in each\n\n",
		r.Config.Cycles, r.HostKVM, sizeName(int64(r.Config.Payload)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cycles\tfds\tgoroutines\tthreads\tRSS MiB\tVmSize MiB\theap MiB\t")
	for _, s := range r.Samples {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", s.Cycle, s.FDs, s.Goroutines, s.Threads, mib(s.RSS), mib(s.VmSize), mib(s.HeapAlloc))
	}
	tw.Flush()
	last := r.Samples[len(r.Samples)-1]
	fmt.Fprintf(w, "\n%d guest exits, %d cancels with the connection open; cycle %.1f / %.1f / %.1f ms (min / median / max); %.1f s in all; peak RSS %s MiB\n",
		r.Exited, r.Canceled, r.CycleMs[0], r.CycleMs[1], r.CycleMs[2], r.Elapsed, mib(last.PeakRSS))
	sl := r.Slowest
	fmt.Fprintf(w, "p99 cycle %.1f ms, %d over 1 s; the slowest (cycle %d, cancel %v): New %.1f, boot %.1f, echo %.1f, stop %.1f, Close %.1f ms\n",
		r.P99Ms, r.Over1s, sl.Cycle, sl.Cancel, sl.Ms[0], sl.Ms[1], sl.Ms[2], sl.Ms[3], sl.Ms[4])
	fmt.Fprintf(w, "bounds: fds +%d, goroutines +%d over the run; RSS and VmSize +%s MiB over the second half (checked: %v)\n",
		leakSlackFDs, leakSlackGoroutines, mib(leakSlackMemory), r.Config.CheckMemory)
}
