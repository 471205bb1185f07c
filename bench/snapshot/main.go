// Command snapshot-bench measures what snapshots and restores cost, in two
// parts that may run in different places (make bench-snapshot runs each
// natively where this host's KVM can run its guest, else in the nested-KVM
// box):
//
//	snapshot-bench testguest [-n 20] [-sizes 256M,1G,4G] [-snaps 3] [-clones 10] [-json F]
//	    the poll-mode test guest (bin/testguest, echo mode), which runs on a
//	    PVM-backed /dev/kvm as on hardware. For each memory size: boot it,
//	    time live snapshots (one Snapshot call; and Pause, Snapshot, Resume
//	    called apart, whose sum is how long the guest was paused), then a
//	    Snapshot with Stop, whose size on disk (allocated blocks) is
//	    reported against the guest's memory; then -n times Restore() it with
//	    a fresh vsock socket and CID and time "Restore() returned" and
//	    "guest answered" (an echo over vsock), both from just before
//	    Restore. The target is flat: restore time does not grow with memory.
//	    Then -clones `microvm restore` processes of the -clone-size
//	    snapshot, each with its own socket and CID, each answering one echo:
//	    one clone's RSS alone, and the sum of RSS and of PSS of all of them
//	    (/proc/PID/smaps_rollup; PSS counts shared pages once), whose target
//	    is a sum of PSS well under N times one clone's RSS.
//
//	snapshot-bench linux [-n 20] [-memory 256M] [-dirty 0,64M,256M] [-json F]
//	    Linux with the guest agent as /init (guest/agentimage, as
//	    `microvm exec` boots it). -n cold boots, each timed from just before
//	    microvm.New to the agent's first answer (a health check over
//	    Machine.DialVsock); the last one is snapshotted with Stop and
//	    restored -n times with a fresh socket and CID, each timed from just
//	    before Restore to the agent's first answer: p50 and p99 of both and
//	    their ratio. The restores take turns among the plain way,
//	    -prefault (Config.PrefaultMemory) and, with -drop-cache, each of
//	    those with the memory file dropped from the page cache first (not
//	    on a tmpfs). Then one guest of -dirty-memory writes non-zero bytes
//	    to files on its /tmp until each -dirty level is reached and is
//	    snapshotted live after each: the snapshot's size against the memory
//	    touched. Linux needs hardware KVM: elsewhere the program says so and
//	    exits 2 with the kvmbox command line (-force tries anyway).
//
// Figures from the nested-KVM box are labelled "TCG (nested-KVM box)":
// everything there runs under QEMU TCG, so compare the ratios within a run.
// Targets are printed beside the figures; none fails the run.
//
// -host-check only answers whether this host can run the subcommand's
// guest (exit 0) or not (exit 1). Exit status: 0 when everything was
// measured, 1 when something failed (listed under the tables and in the
// JSON), 2 when it could not start.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/internal/testing/testenv"
)

const prog = "snapshot-bench"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	sub, args := os.Args[1], os.Args[2:]
	switch sub {
	case "testguest":
		mainGuest(args)
	case "linux":
		mainLinux(args)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s testguest|linux [flags] (-h for the flags of each)\n", prog)
	os.Exit(2)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", prog, fmt.Sprintf(format, args...))
	os.Exit(2)
}

// sizesFlag is a comma-separated list of sizes (microvm.ParseSize; "0" is
// zero), kept ascending.
type sizesFlag []uint64

func (s *sizesFlag) String() string {
	var parts []string
	for _, v := range *s {
		parts = append(parts, microvm.FormatSize(v))
	}
	return strings.Join(parts, ",")
}

func (s *sizesFlag) Set(v string) error {
	var out []uint64
	for p := range strings.SplitSeq(v, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		var n uint64
		if p != "0" {
			var err error
			if n, err = microvm.ParseSize(p); err != nil {
				return err
			}
		}
		out = append(out, n)
	}
	slices.Sort(out)
	*s = slices.Compact(out)
	return nil
}

// tempDir makes the directory of the run's snapshots and sockets, short
// enough for socket paths (sun_path holds 107 bytes).
func tempDir() string {
	dir, err := os.MkdirTemp("", "snapbench-")
	if err != nil {
		fatalf("%v", err)
	}
	return dir
}

// checkFiles makes a missing input one clear line.
func checkFiles(files ...[2]string) {
	for _, f := range files {
		if _, err := os.Stat(f[0]); err != nil {
			fatalf("%v (run `%s` first)", err, f[1])
		}
	}
}

// finish prints rep, writes its JSON and exits 1 if it failed.
func finish(print func(*os.File), rep any, failed bool, jsonOut string) {
	print(os.Stdout)
	if jsonOut != "" {
		if err := benchenv.WriteJSON(jsonOut, rep); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", jsonOut)
	}
	if failed {
		os.Exit(1)
	}
}

func mainGuest(args []string) {
	fs := flag.NewFlagSet(prog+" testguest", flag.ExitOnError)
	cfg := guestConfig{sizes: []uint64{256 << 20, 1 << 30, 4 << 30}}
	var cloneSize string
	fs.StringVar(&cfg.microvm, "microvm", "bin/microvm", "microvm binary, for the clones (`microvm restore`)")
	fs.StringVar(&cfg.guest, "guest", "bin/testguest", "the test guest")
	fs.Var((*sizesFlag)(&cfg.sizes), "sizes", "guest memory sizes (SIZE,...)")
	fs.IntVar(&cfg.restores, "n", 20, "timed restores per size")
	fs.IntVar(&cfg.snaps, "snaps", 3, "timed live snapshots per size, each way (one Snapshot call; Pause, Snapshot, Resume)")
	fs.IntVar(&cfg.clones, "clones", 10, "`microvm restore` processes of one snapshot, for their memory (0: none)")
	fs.StringVar(&cloneSize, "clone-size", "", "the guest memory of the snapshot cloned (default: the smallest of -sizes)")
	fs.DurationVar(&cfg.timeout, "timeout", time.Minute, "bound on one boot, snapshot, or restore to the guest answering")
	fs.StringVar(&cfg.jsonOut, "json", "build/bench/snapshot-testguest.json", "write the results here as JSON (empty: don't)")
	hostCheck := fs.Bool("host-check", false, "only say whether this host's KVM runs the test guest: exit 0 if so, 1 if not")
	force := fs.Bool("force", false, "run even where the host has no usable KVM")
	fs.Parse(args)
	if fs.NArg() > 0 {
		fatalf("unexpected argument %q", fs.Arg(0))
	}
	host := testenv.Host()
	if *hostCheck {
		if host == testenv.KVMNone {
			fmt.Printf("%s: no: this host has no usable /dev/kvm\n", prog)
			os.Exit(1)
		}
		fmt.Printf("%s: yes: /dev/kvm (%s) runs the test guest\n", prog, host)
		os.Exit(0)
	}
	if host == testenv.KVMNone && !*force {
		fmt.Fprintf(os.Stderr, "%s: this host has no usable /dev/kvm; run it in the nested-KVM box (%s figures):\n", prog, boxLabel)
		fmt.Fprintf(os.Stderr, "  scripts/kvmbox --timeout 30m -- %s\n", benchenv.BoxCommand())
		os.Exit(2)
	}
	if len(cfg.sizes) == 0 || cfg.restores < 0 || cfg.snaps < 0 || cfg.clones < 0 || cfg.timeout <= 0 {
		fatalf("want -sizes, -timeout above 0 and -n, -snaps, -clones at least 0")
	}
	cfg.cloneSize = cfg.sizes[0]
	if cloneSize != "" {
		n, err := microvm.ParseSize(cloneSize)
		if err != nil || !slices.Contains(cfg.sizes, n) {
			fatalf("-clone-size %q: want one of -sizes %s", cloneSize, (*sizesFlag)(&cfg.sizes))
		}
		cfg.cloneSize = n
	}
	checkFiles([2]string{cfg.guest, "make bin/testguest"})
	if cfg.clones > 0 {
		checkFiles([2]string{cfg.microvm, "make bin/microvm bin/microvm-full"})
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir := tempDir()
	rep := newGuestReport(&cfg, host.String(), testenv.InBox())
	runGuest(ctx, &cfg, rep, dir)
	os.RemoveAll(dir)
	finish(func(f *os.File) { rep.print(f) }, rep, rep.failed(), cfg.jsonOut)
}

func mainLinux(args []string) {
	fs := flag.NewFlagSet(prog+" linux", flag.ExitOnError)
	cfg := linuxConfig{dirty: []uint64{0, 64 << 20, 256 << 20}}
	var memory, dirtyMemory string
	fs.StringVar(&cfg.kernel, "kernel", "build/kernel/bzImage", "guest kernel")
	fs.StringVar(&cfg.agent, "agent", "bin/microvm-agent", "static guest agent, the guest's /init")
	fs.StringVar(&cfg.busybox, "busybox", "/bin/busybox", "static busybox for the guest")
	fs.IntVar(&cfg.n, "n", 20, "cold boots, and restores, each timed to the agent answering")
	fs.IntVar(&cfg.cpus, "cpus", microvm.DefaultCPUs, "guest vCPUs")
	fs.StringVar(&memory, "memory", microvm.FormatSize(microvm.DefaultMemory), "guest RAM of the cold boots and restores (SIZE)")
	fs.Var((*sizesFlag)(&cfg.dirty), "dirty", "memory to touch before each snapshot of the size runs (SIZE,...; empty: no size runs)")
	fs.StringVar(&dirtyMemory, "dirty-memory", "1G", "guest RAM of the size runs (its /tmp holds half: more than the largest -dirty)")
	fs.BoolVar(&cfg.prefault, "prefault", true, "also restore with Config.PrefaultMemory (restore --prefault)")
	fs.BoolVar(&cfg.dropCache, "drop-cache", true, "also restore with the memory file dropped from the page cache (not on a tmpfs)")
	fs.DurationVar(&cfg.timeout, "timeout", 3*time.Minute, "bound on one boot or restore to the agent answering, one fill, one snapshot")
	fs.StringVar(&cfg.jsonOut, "json", "build/bench/snapshot-linux.json", "write the results here as JSON (empty: don't)")
	hostCheck := fs.Bool("host-check", false, "only say whether Linux guests can boot on this host's KVM: exit 0 if so, 1 if not")
	force := fs.Bool("force", false, "run even where the host check says Linux cannot boot")
	fs.Parse(args)
	if fs.NArg() > 0 {
		fatalf("unexpected argument %q", fs.Arg(0))
	}
	benchenv.GateLinuxKVM(prog, *hostCheck, *force, "read the ratios, not the times")
	var err error
	if cfg.memory, err = microvm.ParseSize(memory); err != nil {
		fatalf("-memory: %v", err)
	}
	if cfg.dirtyMemory, err = microvm.ParseSize(dirtyMemory); err != nil {
		fatalf("-dirty-memory: %v", err)
	}
	if cfg.n < 1 || cfg.cpus < 1 || cfg.timeout <= 0 {
		fatalf("want -n, -cpus and -timeout above 0")
	}
	if len(cfg.dirty) > 0 && cfg.dirty[len(cfg.dirty)-1] >= cfg.dirtyMemory/2 {
		fatalf("-dirty %s: the guest's /tmp holds half of -dirty-memory %s", (*sizesFlag)(&cfg.dirty), dirtyMemory)
	}
	checkFiles([2]string{cfg.kernel, "make kernel"}, [2]string{cfg.agent, "make bin/microvm-agent"},
		[2]string{cfg.busybox, "apt-get install busybox-static"})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir := tempDir()
	rep := newLinuxReport(&cfg, testenv.Host().String(), testenv.InBox())
	runLinux(ctx, &cfg, rep, dir)
	os.RemoveAll(dir)
	finish(func(f *os.File) { rep.print(f) }, rep, rep.failed(), cfg.jsonOut)
}
