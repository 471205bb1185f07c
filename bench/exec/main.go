// Command exec-bench measures what running a command in a microVM through
// the guest agent costs, in one run:
//
//   - boot to agent ready: from just before microvm.New to the first Health
//     call the guest agent answers over Machine.DialVsock (-n boots, each a
//     fresh machine; the time microvm.New itself takes is its own row);
//   - exec true: the latency of -execs sequential Client.Exec calls of
//     busybox's `true` in one VM, p50 and p99;
//   - stdout stream: one Exec of `head -c N /dev/zero` read by the host,
//     -stream-reps times, in MB/s;
//
// and, as the reference, the last two again with the agent's own code
// (package guest/agent) serving on a Unix socket on this host, reached by
// the same client code, so that the rows differ only in what carries gRPC:
// vsock through microvm and a guest kernel, or a host socket. The vsock/unix
// ratios are printed under the table.
//
//	go build -o build/bench/exec-bench ./bench/exec
//	build/bench/exec-bench [-n 3] [-execs 100] [-stream 64M] [-json build/bench/exec.json]
//
// The guest is the image `microvm exec` boots (package guest/agentimage:
// the agent as /init, busybox with its applet links) on -kernel, with
// `microvm exec`'s kernel command line.
//
// Linux cannot boot on a PVM-backed /dev/kvm, and some hosts have none.
// There the program says so and exits 2, pointing at the nested-KVM box
// (scripts/kvmbox), where it runs at the speed of QEMU TCG; -host-check only
// answers whether this host can run it (exit 0) or not (exit 1).
//
// Exit status: 0 when everything was measured, 1 when something failed (it
// is listed under the table and in the JSON), 2 when it could not start.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/agentguest"
	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/testing/testenv"
)

const prog = "exec-bench"

// config is what the flags set.
type config struct {
	kernel, agent, busybox string
	n, execs, warmup       int
	streamBytes            int64
	streamReps             int
	cpus                   int
	memory                 uint64
	timeout                time.Duration
	jsonOut                string
	// plain turns every vsock data-path optimisation off
	// (vsock.Options{}), to tell the device's fast paths apart from the
	// rest when something goes wrong.
	plain bool
}

func main() {
	var cfg config
	var memory, streamSize string
	flag.BoolVar(&cfg.plain, "vsock-plain", false, "turn the vsock device's data-path optimisations off (kick suppression, direct enqueue, batching)")
	flag.StringVar(&cfg.kernel, "kernel", "build/kernel/bzImage", "guest kernel")
	flag.StringVar(&cfg.agent, "agent", "bin/microvm-agent", "static guest agent, the guest's /init")
	flag.StringVar(&cfg.busybox, "busybox", "/bin/busybox", "static busybox for the guest")
	flag.IntVar(&cfg.n, "n", 3, "boots to time, each a fresh VM")
	flag.IntVar(&cfg.execs, "execs", 100, "timed Exec calls of `true`, one after the other, in one VM and on the host")
	flag.IntVar(&cfg.warmup, "warmup", 3, "untimed Exec calls of `true` before them")
	flag.StringVar(&streamSize, "stream", "64M", "bytes one Exec writes to stdout (SIZE: K, M, G; a bare number is MiB)")
	flag.IntVar(&cfg.streamReps, "stream-reps", 3, "times the stdout stream is run, in the VM and on the host")
	flag.IntVar(&cfg.cpus, "cpus", microvm.DefaultCPUs, "guest vCPUs")
	flag.StringVar(&memory, "memory", microvm.FormatSize(microvm.DefaultMemory), "guest RAM (SIZE)")
	flag.DurationVar(&cfg.timeout, "timeout", 3*time.Minute, "bound on one boot to agent ready, and on one Exec call")
	flag.StringVar(&cfg.jsonOut, "json", "build/bench/exec.json", "write the results here as JSON (empty: don't)")
	hostCheck := flag.Bool("host-check", false, "only say whether Linux guests can boot on this host's KVM: exit 0 if so, 1 if not")
	force := flag.Bool("force", false, "run even where the host check says Linux cannot boot")
	flag.Parse()
	if flag.NArg() > 0 {
		fatalf("unexpected argument %q", flag.Arg(0))
	}

	benchenv.GateLinuxKVM(prog, *hostCheck, *force, "the times are not figures to quote")
	var err error
	if cfg.memory, err = microvm.ParseSize(memory); err != nil {
		fatalf("-memory: %v", err)
	}
	size, err := microvm.ParseSize(streamSize)
	if err != nil {
		fatalf("-stream: %v", err)
	}
	cfg.streamBytes = int64(size)
	if err := cfg.check(); err != nil {
		fatalf("%v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "exec-bench-")
	if err != nil {
		fatalf("%v", err)
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := agentguest.WriteImage(initrd, cfg.agent, cfg.busybox); err != nil {
		os.RemoveAll(dir)
		fatalf("%v", err)
	}
	rep := newReport(&cfg, testenv.Host().String(), testenv.InBox())
	run(ctx, &cfg, rep, dir, initrd)
	os.RemoveAll(dir)

	rep.print(os.Stdout)
	if cfg.jsonOut != "" {
		if err := benchenv.WriteJSON(cfg.jsonOut, rep); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", cfg.jsonOut)
	}
	if rep.failed() {
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", prog, fmt.Sprintf(format, args...))
	os.Exit(2)
}

// check looks at the numbers and for the files, so that a missing one is
// one clear line rather than every boot failing.
func (cfg *config) check() error {
	if cfg.n < 1 || cfg.execs < 1 || cfg.warmup < 0 || cfg.streamReps < 1 || cfg.streamBytes < 1 || cfg.timeout <= 0 {
		return fmt.Errorf("-n %d -execs %d -warmup %d -stream-reps %d -stream %d -timeout %v: want n, execs, stream-reps, stream and timeout above 0, warmup at least 0",
			cfg.n, cfg.execs, cfg.warmup, cfg.streamReps, cfg.streamBytes, cfg.timeout)
	}
	hints := []struct{ path, hint string }{
		{cfg.kernel, "make kernel"}, {cfg.agent, "make bin/microvm-agent"}, {cfg.busybox, "apt-get install busybox-static"},
	}
	for _, h := range hints {
		if _, err := os.Stat(h.path); err != nil {
			return fmt.Errorf("%w (run `%s` first)", err, h.hint)
		}
	}
	return nil
}

// maxReplacements bounds the fresh VMs booted to finish the exec and
// stream runs after the VM they ran in ended. In the box a guest that moves
// megabytes over vsock now and then triple-faults (a known artefact of the
// emulated nested SVM, docs/testing.md); a run lost that way and done again
// in a fresh VM is reported as redone, not failed.
const maxReplacements = 2

// run fills rep: the boots, the execs and the stream in the last VM booted,
// then the same on the host agent. A failure is noted in its row and the
// run goes on with what does not depend on it.
func run(ctx context.Context, cfg *config, rep *report, dir, initrd string) {
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	newRow := rep.add(nameNew, viaVsock, "ms", false)
	ready := rep.add(nameReady, viaVsock, "ms", false)
	vExec := rep.add(nameExec, viaVsock, "ms", true)
	vStream := rep.add(nameStream, viaVsock, "MB/s", false)
	uExec := rep.add(nameExec, viaUnix, "ms", true)
	uStream := rep.add(nameStream, viaUnix, "MB/s", false)

	// The last VM to boot stays up for the execs.
	var keep *vm
	boots := 0
	for i := range cfg.n {
		if ctx.Err() != nil {
			break
		}
		boots++
		v, err := bootVM(ctx, cfg, initrd, udsPath(dir, boots), log)
		if err != nil {
			ready.Failures = append(ready.Failures, fmt.Sprintf("boot %d: %v", i+1, err))
			fmt.Fprintf(os.Stderr, "%s: boot %d failed: %v\n", prog, i+1, err)
			continue
		}
		newRow.Samples = append(newRow.Samples, ms(v.newTook))
		ready.Samples = append(ready.Samples, ms(v.ready))
		fmt.Fprintf(os.Stderr, "%s: boot %d: agent ready after %.0f ms\n", prog, i+1, ms(v.ready))
		if i == cfg.n-1 {
			keep = v
		} else {
			v.shutdown()
		}
	}

	// The execs and streams, in keep and, should it end on the way (a
	// failed last boot counts), in up to maxReplacements fresh VMs.
	left := remaining{execs: cfg.execs, streams: cfg.streamReps}
	lost := map[*row][]string{}
	for replaced := 0; !left.done() && ctx.Err() == nil; replaced++ {
		if keep == nil {
			if replaced > maxReplacements {
				break
			}
			boots++
			v, err := bootVM(ctx, cfg, initrd, udsPath(dir, boots), log)
			if err != nil {
				msg := fmt.Sprintf("booting a VM to run in: %v", err)
				vExec.Failures = append(vExec.Failures, msg)
				vStream.Failures = append(vStream.Failures, msg)
				continue
			}
			rep.Notes = append(rep.Notes, fmt.Sprintf("a fresh VM (untimed boot) ran the remaining %d execs and %d streams", left.execs, left.streams))
			keep = v
		}
		fe, fs := len(vExec.Failures), len(vStream.Failures)
		measureVM(ctx, cfg, rep, keep, vExec, vStream, &left)
		ended := keep.ended()
		if ended && keep.res.Kind == microvm.ExitTripleFault && rep.InBox {
			lost[vExec] = append(lost[vExec], takeFailures(vExec, fe)...)
			lost[vStream] = append(lost[vStream], takeFailures(vStream, fs)...)
		}
		keep.shutdown()
		keep = nil
		if !ended {
			break // a failure the VM did not cause: another VM would not help
		}
	}
	// Runs lost to the box's triple faults do not fail the benchmark when
	// fresh VMs did them all again.
	for r, l := range lost {
		if left.done() {
			r.Redone = append(r.Redone, l...)
		} else {
			r.Failures = append(r.Failures, l...)
		}
	}

	if ctx.Err() != nil {
		uExec.Failures = append(uExec.Failures, ctx.Err().Error())
		rep.summarise()
		return
	}
	h, err := startHostAgent(ctx, dir)
	if err != nil {
		uExec.Failures = append(uExec.Failures, err.Error())
		uStream.Failures = append(uStream.Failures, err.Error())
		rep.summarise()
		return
	}
	measure(ctx, cfg, h.conn, uExec, uStream, &remaining{execs: cfg.execs, streams: cfg.streamReps})
	if err := h.close(); err != nil {
		uStream.Failures = append(uStream.Failures, fmt.Sprintf("host agent: %v", err))
	}
	rep.summarise()
}

// takeFailures removes the failures from index i on from r and returns
// them.
func takeFailures(r *row, i int) []string {
	f := slices.Clone(r.Failures[i:])
	r.Failures = r.Failures[:i]
	return f
}

// remaining counts the timed runs still to do.
type remaining struct{ execs, streams int }

func (r *remaining) done() bool { return r.execs <= 0 && r.streams <= 0 }

// measureVM runs what is left of the exec and stream measurements in v,
// after asking its agent who it is, and notes how many console bytes the
// guest wrote per exec.
func measureVM(ctx context.Context, cfg *config, rep *report, v *vm, execRow, streamRow *row, left *remaining) {
	if rep.Guest == nil {
		ictx, cancel := context.WithTimeout(ctx, cfg.timeout)
		info, err := v.conn.client.Agent.Info(ictx, &agentapi.InfoRequest{})
		cancel()
		if err == nil {
			rep.Guest = map[string]string{
				"kernel": info.KernelRelease, "cpus": fmt.Sprint(info.NumCpu),
				"mem_total_bytes": fmt.Sprint(info.MemTotalBytes), "agent_version": info.AgentVersion,
			}
		}
	}
	before := v.console.written()
	n, ok := measureExecs(ctx, cfg, v.conn, execRow, left, v.describe)
	if n > 0 && rep.ConsoleBytesPerExec == 0 {
		// The warm-up calls wrote to the console too.
		rep.ConsoleBytesPerExec = float64(v.console.written()-before) / float64(n+cfg.warmup)
	}
	if ok {
		measureStreams(ctx, cfg, v.conn, streamRow, left, v.describe)
	}
}

// measure does the exec and stream runs through conn, filling the rows
// and counting down left.
func measure(ctx context.Context, cfg *config, conn *agentConn, execRow, streamRow *row, left *remaining) {
	noVM := func(err error) error { return err }
	if _, ok := measureExecs(ctx, cfg, conn, execRow, left, noVM); ok {
		measureStreams(ctx, cfg, conn, streamRow, left, noVM)
	}
}

// measureExecs does what is left of the timed execs of `true` through
// conn, adds them to row and counts them off left. It returns how many it
// timed and whether all went well; describe adds what the VM says to an
// error.
func measureExecs(ctx context.Context, cfg *config, conn *agentConn, row *row, left *remaining, describe func(error) error) (int, bool) {
	if left.execs <= 0 {
		return 0, true
	}
	fmt.Fprintf(os.Stderr, "%s: %d x exec true over %s\n", prog, left.execs, row.Transport)
	lat, err := execTrue(ctx, conn.client, cfg.warmup, left.execs, cfg.timeout)
	row.Samples = append(row.Samples, lat...)
	left.execs -= len(lat)
	if err != nil {
		row.Failures = append(row.Failures, describe(err).Error())
		return len(lat), false
	}
	return len(lat), true
}

// measureStreams does what is left of the stdout streams through conn, as
// measureExecs does the execs.
func measureStreams(ctx context.Context, cfg *config, conn *agentConn, row *row, left *remaining, describe func(error) error) {
	if left.streams <= 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "%s: %d x %s over %s\n", prog, left.streams, strings.Join(streamCmd(cfg.streamBytes), " "), row.Transport)
	rates, err := stream(ctx, conn.client, cfg.streamBytes, left.streams, cfg.timeout)
	row.Samples = append(row.Samples, rates...)
	left.streams -= len(rates)
	if err != nil {
		row.Failures = append(row.Failures, describe(err).Error())
	}
}
