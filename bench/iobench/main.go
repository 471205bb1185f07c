//go:build linux

// Command iobench measures virtio-blk and virtio-net throughput in a Linux
// guest under microvm and under QEMU's microvm machine with its own
// virtio-blk-device and virtio-net-device, with the same kernel, guest and
// workload, and prints the two side by side.
//
//	CGO_ENABLED=0 go build -o build/bench/iobench-guest ./bench/iobench/guest
//	go build -o build/bench/iobench ./bench/iobench
//	build/bench/iobench blk [-n 5] [-seconds 2] [-json build/bench/blk.json]
//	build/bench/iobench net [-n 5] [-seconds 3] [-json build/bench/net.json]
//
// The guest is one static Go program as the whole initramfs
// (bench/iobench/guest): it reads what to run from iobench.* kernel
// parameters and prints its figures on the serial console, then ends the
// machine. Both VMMs run it the same way, as a process whose stdout is the
// console, so neither needs an agent or vsock:
//
//	microvm run --kernel K --initrd I --cpus 1 --memory 256M --acpi off --rng=off
//	    --cmdline "console=ttyS0 reboot=k panic=-1 quiet iobench..."
//	    --disk path=IMG | --net tap=TAP,mac=M
//	qemu-system-x86_64 -M microvm,acpi=off -accel kvm -cpu host -m 256M -smp 1 -nodefaults
//	    -no-user-config -display none -serial stdio -no-reboot -kernel K -initrd I
//	    -append "console=ttyS0 reboot=t panic=-1 quiet iobench..."
//	    -drive file=IMG,if=none,id=d0,format=raw -device virtio-blk-device,drive=d0 |
//	    -netdev tap,id=n0,ifname=TAP,script=no,downscript=no -device virtio-net-device,netdev=n0,mac=M
//
// blk: a raw image of -disk-size, filled with data on the host, is the
// guest's only disk (/dev/vda). The guest measures, with O_DIRECT and one
// request in flight, each for -seconds: sequential writes of 1 MiB and 4 KiB,
// sequential reads of 1 MiB and 4 KiB (MB/s), random 4 KiB reads (IOPS).
//
// net: the program re-executes itself in a new network namespace, makes a
// persistent TAP there with the host's address and listens on it; both
// VMMs attach to that TAP. The guest sends over TCP for -seconds, timed by
// the host as it receives (guest->host), then the host sends for -seconds
// and the guest times what it receives (host->guest); Mbit/s. Both ends
// count the bytes and must agree.
//
// Iterations alternate which VMM goes first. A run counts only if the VMM
// exited 0 after the guest printed "iobench: done ok" and every figure;
// others are listed as failed and left out.
//
// Linux cannot boot on a PVM-backed /dev/kvm, and some hosts have none:
// there the program says so and exits 2 with the scripts/kvmbox command line
// to use; -host-check only answers (exit 0 or 1). In the nested-KVM box both
// VMMs run on the box's KVM under QEMU TCG: the figures compare the two
// doing the same work on the same emulated machine, they are not
// performance figures.
//
// Exit status: 0 when every run counted, 1 when some failed, 2 when it could
// not start.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/bench/internal/ioproto"
)

const prog = "iobench"

// envNetNS marks the child this program re-executes itself as, in a
// network namespace of its own (net mode).
const envNetNS = "MICROVM_IOBENCH_IN_NETNS"

// config is what the flags set.
type config struct {
	mode                  string
	n, cpus               int
	seconds               float64
	microvm, qemu, kernel string
	guest, memory, acpi   string
	diskSize              int64
	timeout               time.Duration
	jsonOut               string
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != ioproto.ModeBlk && os.Args[1] != ioproto.ModeNet) {
		fmt.Fprintf(os.Stderr, "usage: %s blk|net [flags]   (%s blk -h for the flags)\n", prog, prog)
		os.Exit(2)
	}
	cfg := config{mode: os.Args[1]}
	fs := flag.NewFlagSet(prog+" "+cfg.mode, flag.ExitOnError)
	var diskSize string
	defSeconds := 2.0
	if cfg.mode == ioproto.ModeNet {
		defSeconds = 3
	}
	fs.IntVar(&cfg.n, "n", 5, "runs of each VMM, interleaved")
	fs.Float64Var(&cfg.seconds, "seconds", defSeconds, "how long each measurement in the guest runs")
	fs.IntVar(&cfg.cpus, "cpus", 1, "guest vCPUs for both VMMs")
	fs.StringVar(&cfg.memory, "memory", "256M", "guest memory for both VMMs")
	fs.StringVar(&cfg.microvm, "microvm", "bin/microvm", "microvm binary")
	fs.StringVar(&cfg.qemu, "qemu", "qemu-system-x86_64", "QEMU binary (its rows are skipped when not found)")
	fs.StringVar(&cfg.kernel, "kernel", "build/kernel/bzImage", "guest kernel for both VMMs")
	fs.StringVar(&cfg.guest, "guest", "build/bench/iobench-guest", "the static guest program (bench/iobench/guest), the guest's /init")
	fs.StringVar(&cfg.acpi, "acpi", "on", "microvm --acpi, its default (QEMU's machine always runs with acpi=off, as in bench/linuxboot)")
	fs.StringVar(&diskSize, "disk-size", "64M", "blk: size of the raw image (K, M, G; a bare number is MiB)")
	fs.DurationVar(&cfg.timeout, "timeout", 3*time.Minute, "a VM running longer is killed and its run fails")
	fs.StringVar(&cfg.jsonOut, "json", "build/bench/"+cfg.mode+".json", "write the results here as JSON (empty: don't)")
	hostCheck := fs.Bool("host-check", false, "only say whether Linux guests can boot on this host's KVM: exit 0 if so, 1 if not")
	force := fs.Bool("force", false, "run even where the host check says Linux cannot boot")
	_ = fs.Parse(os.Args[2:])
	if fs.NArg() > 0 {
		fatalf("unexpected argument %q", fs.Arg(0))
	}

	benchenv.GateLinuxKVM(prog, *hostCheck, *force, "a functional comparison, not performance")
	size, err := microvm.ParseSize(diskSize)
	if err != nil {
		fatalf("-disk-size: %v", err)
	}
	cfg.diskSize = int64(size)
	if err := cfg.check(); err != nil {
		fatalf("%v", err)
	}
	if cfg.mode == ioproto.ModeNet && os.Getenv(envNetNS) != "1" {
		os.Exit(inNetNS())
	}

	ctx := context.Background()
	dir, err := os.MkdirTemp("", "iobench-")
	if err != nil {
		fatalf("%v", err)
	}
	rep, err := run(ctx, &cfg, dir)
	os.RemoveAll(dir)
	if err != nil {
		fatalf("%v", err)
	}
	rep.print(os.Stdout)
	if cfg.jsonOut != "" {
		if err := benchenv.WriteJSON(cfg.jsonOut, rep); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", cfg.jsonOut)
	}
	if !rep.allOK() {
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", prog, fmt.Sprintf(format, args...))
	os.Exit(2)
}

// check looks at the numbers and for the files, so that a missing one is
// one clear line rather than every run failing.
func (cfg *config) check() error {
	if cfg.n < 1 || cfg.cpus < 1 || cfg.seconds <= 0 || cfg.timeout <= 0 {
		return fmt.Errorf("-n %d -cpus %d -seconds %g -timeout %v: want all above 0", cfg.n, cfg.cpus, cfg.seconds, cfg.timeout)
	}
	if cfg.acpi != "on" && cfg.acpi != "off" {
		return fmt.Errorf("-acpi %q: want on or off", cfg.acpi)
	}
	if cfg.diskSize < 1<<20 || cfg.diskSize%(1<<20) != 0 {
		return fmt.Errorf("-disk-size %d: want a whole number of MiB, at least 1", cfg.diskSize)
	}
	for _, f := range []struct{ path, hint string }{
		{cfg.microvm, "make bin/microvm"}, {cfg.kernel, "make kernel"},
		{cfg.guest, "CGO_ENABLED=0 go build -o build/bench/iobench-guest ./bench/iobench/guest"},
	} {
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%w (run `%s` first)", err, f.hint)
		}
	}
	return nil
}

// inNetNS runs this program again in a new network namespace (it needs
// root) and returns its exit status: the TAP, its address and the
// listeners live there and vanish with it.
func inNetNS() int {
	if os.Geteuid() != 0 {
		fatalf("net needs root, for a network namespace and a TAP")
	}
	exe, err := os.Executable()
	if err != nil {
		fatalf("%v", err)
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(os.Environ(), envNetNS+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fatalf("in a new network namespace: %v", err)
	}
	return 0
}

// absPath is p made absolute, for the JSON (the box runs with other paths).
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
