// Command vhostuser is a load generator for vhost-user-vsock back-ends: it
// plays the front-end (QEMU's part) and the guest driver (Linux's part)
// against any back-end given its command line, and measures the device
// itself, with no KVM and no QEMU (docs/notes/performance.md).
//
//	go run ./bench/vhostuser [-microvm bin/microvm] [-peer PATH] [-pairs 5]
//	    [-options all-on,all-off,...] [-payloads 64,4096,65536] [-mode event|poll]
//	    [-dur 300ms] [-rtt-dur 150ms] [-tx-publish packet|turn]
//	    [-json build/bench/device.json] [-quick]
//
// For each target (microvm's back-end with each -options set, rust-vmm's
// vhost-device-vsock with -peer) it starts the back-end, connects as a
// front-end (vhufront: a sealed memfd as guest RAM in two regions, the
// features, the memory table, both rings with kick and call eventfds) and,
// per direction and payload, runs a timed stream (bytes/s, messages/s) and
// a ping-pong (RTT p50, p99) between its guest driver and a peer process
// on the back-end's host Unix socket. The same cells run over a plain
// AF_UNIX socket between the peer and this process as the reference.
// Targets run in turn within a pair and pairs alternate the order (ABAB);
// each figure is the median over -pairs, with the range in the table.
//
// Every byte is checked against a pattern on receipt and both ends' byte
// counts must agree; a measurement that fails is reported and left out,
// and the program exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/bench/internal/vhufront"
)

// envServePeer makes the program (or a test binary) the peer process.
const envServePeer = "VHUBENCH_SERVE_PEER"

// optionSets are the ablation's option sets: all on, all off, and each
// option off alone (no-NAME), each a --vsock-opt value for microvm. A
// "no-copybreak" set is gone with the copybreak itself
// (docs/notes/performance.md says why). irq-coalesce has no set: it acts
// only where one interrupt serves every queue (virtio-mmio), never under
// vhost-user.
func optionSets() map[string]string {
	on := func(kick, direct, batch, short, sndbuf, gate, irq string) string {
		return fmt.Sprintf("kick-suppress=%s,direct-enqueue=%s,batch=%s,short-read=%s,sndbuf=%s,ready-gate=%s,irq-coalesce=%s",
			kick, direct, batch, short, sndbuf, gate, irq)
	}
	return map[string]string{
		"all-on":            on("on", "on", "on", "on", "on", "on", "on"),
		"all-off":           on("off", "off", "off", "off", "off", "off", "off"),
		"no-direct-enqueue": on("on", "off", "on", "on", "on", "on", "on"),
		"no-batch":          on("on", "on", "off", "on", "on", "on", "on"),
		"no-kick-suppress":  on("off", "on", "on", "on", "on", "on", "on"),
		"no-short-read":     on("on", "on", "on", "off", "on", "on", "on"),
		"no-sndbuf":         on("on", "on", "on", "on", "off", "on", "on"),
		"no-ready-gate":     on("on", "on", "on", "on", "on", "off", "on"),
	}
}

var allOptions = []string{"all-on", "all-off", "no-direct-enqueue", "no-batch", "no-kick-suppress", "no-short-read", "no-sndbuf", "no-ready-gate"}

// target is one back-end configuration measured.
type target struct {
	backend string // "microvm", "peer", or "af_unix" for the reference
	options string
	argv    []string // command template
	bin     string   // {bin}
	vsockOp string   // {opts}
	// bufAlloc, when not 0, is the guest's receive window for this
	// target instead of -buf-alloc (the -wide-buf-alloc rows).
	bufAlloc uint32
}

// runner holds a run's settings and the peer process.
type runner struct {
	dur, rttDur, timeout time.Duration
	rttMax               int
	guest                vhufront.Config
	peer                 *vhufront.Peer
	peerExe              string
	tmp                  string
	port                 uint32
	log                  io.Writer
	verbose              bool
}

func main() {
	if os.Getenv(envServePeer) == "1" {
		if err := vhufront.ServePeer(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	// The peer process writes its diagnostics here too, from os/exec's
	// copying goroutine.
	stderr = &syncWriter{w: stderr}
	fs := flag.NewFlagSet("vhostuser", flag.ContinueOnError)
	fs.SetOutput(stderr)
	microvm := fs.String("microvm", "bin/microvm", "microvm binary ({bin} in -backend-cmd)")
	backendCmd := fs.String("backend-cmd", "{bin} vhost-user-vsock --socket {socket} --guest-cid {cid} --uds-path {uds} --vsock-opt {opts}",
		"microvm back-end command line (words; {bin}, {socket}, {uds}, {cid}, {opts} are replaced)")
	peerBin := fs.String("peer", os.Getenv("PEER"), "rust-vmm vhost-device-vsock binary to measure too (default $PEER; empty: none)")
	peerCmd := fs.String("peer-cmd", "{bin} --guest-cid {cid} --socket {socket} --uds-path {uds}",
		"peer back-end command line ({bin} is -peer)")
	options := fs.String("options", strings.Join(allOptions, ","), "option sets to measure microvm with: "+strings.Join(allOptions, ", "))
	payloads := fs.String("payloads", "64,4096,65536", "payload sizes (bytes, at most 65536): one application write or message")
	dirs := fs.String("directions", "h2g,g2h", "directions: h2g (host->guest), g2h (guest->host)")
	pairs := fs.Int("pairs", 5, "rounds over all targets, alternating the order (the median is reported)")
	dur := fs.Duration("dur", time.Second, "length of each throughput stream (at least a second: shorter ones read the noise of a busy machine)")
	rttDur := fs.Duration("rtt-dur", 150*time.Millisecond, "length of each ping-pong")
	rttMax := fs.Int("rtt-max", 20000, "most round trips per ping-pong")
	mode := fs.String("mode", "event", "guest driver: event (sleeps for interrupts) or poll (spins on the used rings)")
	queueSize := fs.Int("queue-size", 256, "RX and TX ring size")
	rxBuf := fs.Int("rx-buf", 4096, "payload room of each guest RX buffer (Linux: 4096)")
	bufAlloc := fs.Int("buf-alloc", 256<<10, "the guest's receive window per connection (Linux: 256 KiB)")
	wideBufAlloc := fs.Int("wide-buf-alloc", 1<<20, "also measure microvm all-on and the peer with this guest window (bytes; 0: no such rows)")
	gomaxprocs := fs.String("gomaxprocs", "", "also measure microvm all-on with each of these GOMAXPROCS values (comma list; the back-end runs under env GOMAXPROCS=N)")
	noEventIdx := fs.Bool("no-event-idx", false, "do not negotiate VIRTIO_F_EVENT_IDX")
	publish := fs.String("tx-publish", string(vhufront.PublishPacket), "when the guest driver publishes TX packets (and may kick): packet (each as queued, as Linux) or turn (all of a turn together)")
	timeout := fs.Duration("timeout", 20*time.Second, "bound on every wait beyond a measurement's own length")
	jsonOut := fs.String("json", "build/bench/device.json", "rows (medians) go here (empty: nowhere)")
	runsOut := fs.String("runs-json", "build/bench/device-runs.json", "every sample, the settings and the host go here (empty: nowhere)")
	quick := fs.Bool("quick", false, "a quick check: one pair, short streams, all-on and all-off, unless set otherwise")
	verbose := fs.Bool("v", false, "print each measurement")
	dgramPayloads := fs.String("dgram-payloads", "64,4096", "datagram payload sizes (experimental datagram rows, microvm all-on with dgram on and off; empty: none)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "vhostuser: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		if !set["pairs"] {
			*pairs = 1
		}
		if !set["dur"] {
			*dur = 40 * time.Millisecond
		}
		if !set["rtt-dur"] {
			*rttDur = 25 * time.Millisecond
		}
		if !set["rtt-max"] {
			*rttMax = 300
		}
		if !set["options"] {
			*options = "all-on,all-off"
		}
		if !set["wide-buf-alloc"] {
			*wideBufAlloc = 0
		}
	}
	usage := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "vhostuser: "+format+"\n", args...)
		return 2
	}
	sets := optionSets()
	var targets []target
	for _, o := range splitList(*options) {
		if _, ok := sets[o]; !ok {
			return usage("-options: unknown set %q (want %s)", o, strings.Join(allOptions, ", "))
		}
		targets = append(targets, target{backend: "microvm", options: o, argv: strings.Fields(*backendCmd), bin: *microvm, vsockOp: sets[o]})
	}
	if *peerBin != "" {
		// rust-vmm's back-end has no switches; its rows stand next to
		// microvm's all-on.
		targets = append(targets, target{backend: "peer", options: "all-on", argv: strings.Fields(*peerCmd), bin: *peerBin})
	}
	var sizes []int
	for _, p := range splitList(*payloads) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > vhufront.MaxPayload {
			return usage("-payloads: %q is not a size of 1..%d bytes", p, vhufront.MaxPayload)
		}
		sizes = append(sizes, n)
	}
	var directions []string
	for _, d := range splitList(*dirs) {
		if d != h2g && d != g2h {
			return usage("-directions: %q (want h2g, g2h)", d)
		}
		directions = append(directions, d)
	}
	if *pairs < 1 || len(targets) == 0 || len(sizes) == 0 || len(directions) == 0 || *rttMax < 1 || *dur <= 0 || *rttDur <= 0 {
		return usage("nothing to measure: need -pairs >= 1, -rtt-max >= 1, positive durations, and at least one option set, payload and direction")
	}
	if *mode != string(vhufront.ModeEvent) && *mode != string(vhufront.ModePoll) {
		return usage("-mode %q: want event or poll", *mode)
	}
	if *publish != string(vhufront.PublishPacket) && *publish != string(vhufront.PublishTurn) {
		return usage("-tx-publish %q: want packet or turn", *publish)
	}
	if *queueSize < 2 || *queueSize > 32768 || *queueSize&(*queueSize-1) != 0 {
		return usage("-queue-size %d: want a power of 2 from 2 to 32768", *queueSize)
	}
	if *rxBuf < 1 || *rxBuf > vhufront.MaxPayload || *bufAlloc < 1 || *bufAlloc > 1<<30 || *wideBufAlloc < 0 || *wideBufAlloc > 1<<30 {
		return usage("-rx-buf 1..65536, -buf-alloc 1..1G and -wide-buf-alloc 0..1G")
	}
	if *wideBufAlloc > 0 && *wideBufAlloc != *bufAlloc {
		// The same back-ends with a wider guest window: microvm all-on and
		// the peer, each once more per pair.
		var wide []target
		for _, t := range targets {
			if t.options == "all-on" {
				t.options = "all-on " + windowLabel(*wideBufAlloc)
				t.bufAlloc = uint32(*wideBufAlloc)
				wide = append(wide, t)
			}
		}
		targets = append(targets, wide...)
	}
	for _, g := range splitList(*gomaxprocs) {
		n, err := strconv.Atoi(g)
		if err != nil || n < 1 || n > 1024 {
			return usage("-gomaxprocs: %q is not a number of 1..1024", g)
		}
		if _, ok := sets["all-on"]; !ok || len(targets) == 0 || targets[0].backend != "microvm" {
			break
		}
		targets = append(targets, target{backend: "microvm", options: fmt.Sprintf("all-on gmp=%d", n),
			argv: append([]string{"env", fmt.Sprintf("GOMAXPROCS=%d", n)}, strings.Fields(*backendCmd)...), bin: *microvm, vsockOp: sets["all-on"]})
	}
	for _, t := range targets {
		if _, err := exec.LookPath(t.bin); err != nil {
			return usage("%s back-end %q: %v (make bin/microvm; PEER=/path/to/vhost-device-vsock)", t.backend, t.bin, err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "vhostuser: %v\n", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "vhub")
	if err != nil {
		fmt.Fprintf(stderr, "vhostuser: %v\n", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	r := &runner{
		dur: *dur, rttDur: *rttDur, rttMax: *rttMax, timeout: *timeout, tmp: tmp, peerExe: exe, port: 5000,
		log: stderr, verbose: *verbose,
		guest: vhufront.Config{CID: 3, QueueSize: uint16(*queueSize), RXBufSize: *rxBuf, BufAlloc: uint32(*bufAlloc),
			Mode: vhufront.Mode(*mode), NoEventIdx: *noEventIdx, Publish: vhufront.Publish(*publish)},
	}
	defer r.stopPeer()
	var cells []cell
	for _, d := range directions {
		for _, p := range sizes {
			cells = append(cells, cell{d, kindTput, p}, cell{d, kindRTT, p})
		}
	}
	order := append(append([]target(nil), targets...), target{backend: "af_unix", options: "-"})
	rep := &report{
		Date: time.Now().Format(time.RFC3339), Host: benchenv.HostInfo(), Pairs: *pairs, Mode: *mode,
		Duration: dur.String(), RTTDuration: rttDur.String(), RTTMax: *rttMax, QueueSize: *queueSize, RXBuf: *rxBuf,
		BufAlloc: *bufAlloc, EventIdx: !*noEventIdx, TxPublish: *publish, Targets: map[string]string{},
	}
	rep.Versions = map[string]string{}
	for _, t := range targets {
		if _, ok := rep.Versions[t.backend]; !ok {
			rep.Versions[t.backend] = binaryVersion(t)
		}
	}
	for _, t := range targets {
		rep.Targets[t.backend+" "+t.options] = strings.Join(expand(t.argv, map[string]string{"bin": t.bin, "opts": t.vsockOp,
			"socket": "SOCKET", "uds": "UDS", "cid": "3"}), " ")
	}
	start := time.Now()
	for p := range *pairs {
		seq := order
		if p%2 == 1 {
			seq = make([]target, len(order))
			for i, t := range order {
				seq[len(order)-1-i] = t
			}
		}
		for _, t := range seq {
			got, fails := r.runTarget(t, cells, p)
			rep.Samples = append(rep.Samples, got...)
			rep.Failures = append(rep.Failures, fails...)
		}
		fmt.Fprintf(stderr, "vhostuser: pair %d/%d done (%.0f s)\n", p+1, *pairs, time.Since(start).Seconds())
	}
	var dgRows []row
	if dp := splitList(*dgramPayloads); len(dp) > 0 && len(targets) > 0 && targets[0].backend == "microvm" {
		for _, p := range dp {
			if n, err := strconv.Atoi(p); err != nil || n < 0 || n > vhufront.MaxPayload || n > *rxBuf {
				return usage("-dgram-payloads: %q is not a size of 0..%d bytes (at most -rx-buf)", p, min(vhufront.MaxPayload, *rxBuf))
			}
		}
		t := targets[0]
		t.vsockOp = sets["all-on"]
		got, fails := r.dgramPairs(t, *pairs, dp, directions)
		rep.Failures = append(rep.Failures, fails...)
		dgRows = dgramRows(got)
	}
	rows := aggregate(rep.Samples, order, cells)
	printTable(stdout, rep, rows, order, cells)
	fmt.Fprintln(stdout, "\nwhat each party paid (streams):")
	printParties(stdout, rows, rep.Samples)
	if len(dgRows) > 0 {
		printDgramTable(stdout, dgRows)
	}
	if *jsonOut != "" {
		out := make([]row, 0, len(rows))
		for _, rw := range rows {
			out = append(out, rw.row)
		}
		out = append(out, dgRows...)
		if err := benchenv.WriteJSON(*jsonOut, out); err != nil {
			fmt.Fprintf(stderr, "vhostuser: %v\n", err)
			return 1
		}
	}
	if *runsOut != "" {
		if err := benchenv.WriteJSON(*runsOut, rep); err != nil {
			fmt.Fprintf(stderr, "vhostuser: %v\n", err)
			return 1
		}
	}
	if len(rep.Failures) > 0 {
		for _, f := range rep.Failures {
			fmt.Fprintln(stderr, "FAILED", f)
		}
		return 1
	}
	return 0
}

// windowLabel names a wide-window target's options: "win=1M".
func windowLabel(n int) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("win=%dM", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("win=%dK", n>>10)
	}
	return fmt.Sprintf("win=%d", n)
}

// binaryVersion asks a back-end binary for its version (bounded: a
// binary that does not know the flag may start serving instead).
func binaryVersion(t target) string {
	arg := "--version"
	if t.backend == "microvm" {
		arg = "version"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, t.bin, arg).Output()
	if err != nil {
		return "unknown (" + t.bin + ")"
	}
	return strings.TrimSpace(string(out))
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// startPeer starts the peer process if it is not running.
func (r *runner) startPeer() error {
	if r.peer != nil {
		return nil
	}
	cmd := exec.Command(r.peerExe)
	cmd.Env = append(os.Environ(), envServePeer+"=1")
	cmd.Stderr = r.log
	p, err := vhufront.StartPeer(cmd)
	if err != nil {
		return err
	}
	r.peer = p
	return nil
}

// stopPeer ends the peer; after a failed measurement it may be stuck in a
// command, so it is killed if it does not end at once.
func (r *runner) stopPeer() {
	if r.peer != nil {
		_ = r.peer.Close(2 * time.Second)
		r.peer = nil
	}
}

func (r *runner) nextPort() uint32 {
	r.port++
	return r.port
}

// runTarget runs every cell on one target: a fresh back-end process and
// front-end connection for microvm and the peer, the plain socket for
// af_unix. After a failure the rest of the target's cells are skipped for
// this pair (the back-end or the driver may be in any state).
func (r *runner) runTarget(t target, cells []cell, pair int) ([]sample, []string) {
	var out []sample
	failed := func(c *cell, err error) []string {
		what := fmt.Sprintf("pair %d %s %s", pair, t.backend, t.options)
		if c != nil {
			what += fmt.Sprintf(" %s %s %d B", c.dir, c.kind, c.payload)
		}
		r.stopPeer()
		return []string{fmt.Sprintf("%s: %v", what, err)}
	}
	if err := r.startPeer(); err != nil {
		return nil, failed(nil, err)
	}
	if t.backend == "af_unix" {
		for _, c := range cells {
			s, err := r.unixCell(c, r.nextPort())
			if err != nil {
				return out, failed(&c, err)
			}
			s.Options, s.Pair = t.options, pair
			r.show(s)
			out = append(out, s)
		}
		return out, nil
	}
	be, err := startBackend(t.argv, t.bin, t.vsockOp, r.guest.CID, r.timeout)
	if err != nil {
		return nil, failed(nil, err)
	}
	cfg := r.guest
	if t.bufAlloc != 0 {
		cfg.BufAlloc = t.bufAlloc
	}
	g, err := be.connect(cfg, r.timeout)
	if err != nil {
		_ = be.stop()
		return nil, failed(nil, err)
	}
	var fails []string
	for _, c := range cells {
		s, err := r.vsockCell(g, be, c, r.nextPort())
		if err != nil {
			fails = failed(&c, err)
			break
		}
		s.Backend, s.Options, s.Pair = t.backend, t.options, pair
		r.show(s)
		out = append(out, s)
	}
	if err := g.Close(); err != nil && fails == nil {
		fails = failed(nil, fmt.Errorf("closing the front-end: %w", err))
	}
	if err := be.stop(); err != nil && fails == nil {
		fails = failed(nil, err)
	}
	return out, fails
}

func (r *runner) show(s sample) {
	if !r.verbose {
		return
	}
	if s.Kind == kindTput {
		fmt.Fprintf(r.log, "%-8s %-18s %s %6d B  %9.1f MB/s %10.0f msgs/s  kicks/MiB %8.1f  irqs/MiB %8.1f  cpu %.2fs\n",
			s.Backend, s.Options, s.Dir, s.Payload, s.BytesPerS/1e6, s.MsgsPerS, s.KicksPerMiB, s.IrqsPerMiB, s.BackendCPU)
	} else {
		fmt.Fprintf(r.log, "%-8s %-18s %s %6d B  rtt p50 %8.1f us p99 %8.1f us (%d)\n",
			s.Backend, s.Options, s.Dir, s.Payload, float64(s.RTTP50)/1e3, float64(s.RTTP99)/1e3, s.RTTs)
	}
}
