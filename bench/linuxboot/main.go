// Command linuxboot measures how long Linux takes to reach its /init under
// microvm and under QEMU's microvm machine with KVM, with the same kernel,
// initramfs and command line, and prints the two side by side.
//
//	go build -o build/bench/linuxboot ./bench/linuxboot
//	build/bench/linuxboot [-n 5] [-kernel build/kernel/vmlinux,build/kernel/bzImage] [-json build/bench/linuxboot.json]
//
// The guest is the Linux test guest: build/kernel (make kernel) with the Go
// /init of guest/init as its initramfs (make initramfs). With no
// microvm.scenarios on the command line /init prints "init: ready" as soon as
// it runs, then "init: done ok", and reboots; reboot=k makes microvm exit
// and reboot=t with -no-reboot makes QEMU exit, both with status 0. The
// command lines are
//
//	microvm run --kernel K --initrd I --cpus N --memory 256M --cmdline "console=ttyS0 reboot=k panic=-1"
//	qemu-system-x86_64 -M microvm,acpi=off -accel kvm -cpu host -m 256M -smp N -nodefaults
//	    -no-user-config -display none -serial stdio -no-reboot -kernel K -initrd I
//	    -append "console=ttyS0 reboot=t panic=-1"
//
// Each run is timed from just before the VMM's process starts to
//
//   - ready: the "init: ready" line arriving on its stdout (the serial
//     console), the boot time as this benchmark counts it;
//   - exit: the process's exit, after /init has rebooted the guest;
//
// and the kernel's own printk timestamp of "Run /init as init process" is
// read off the console: guest time from the kernel's clock starting to
// /init, without the VMM's setup or the kernel's decompression. A run counts
// only if the guest printed "init: ready" and "init: done ok" and the VMM
// exited 0; any other run is reported as failed, its console kept under
// -logs, and left out of the figures. Each row gives the median and the
// range (min-max) over its runs; the JSON adds p10, p90 and every run.
// Iterations alternate which VMM goes first (ABAB), after one untimed
// warm-up run of each.
//
// Linux cannot boot on a PVM-backed /dev/kvm (kvm_pvm), and some hosts have
// no /dev/kvm at all. There the program says so and exits 2, pointing at the
// nested-KVM box (scripts/kvmbox), where it then runs at the speed of QEMU
// TCG: the figures from the box compare the two VMMs doing the same work on
// the same emulated machine, they are not boot times to quote. -host-check
// only answers whether this host can run it (exit 0) or not (exit 1).
//
// Exit status: 0 when every run succeeded, 1 when some failed, 2 when it
// could not start (missing files, a host whose KVM cannot boot Linux).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/internal/testing/kvmbox"
)

const prog = "bench-linuxboot"

// vmmKind is one of the two VMMs compared.
type vmmKind string

const (
	kindMicrovm vmmKind = "microvm"
	kindQEMU    vmmKind = "qemu"
)

// config is what the flags set.
type config struct {
	n, warmup, cpus int
	microvm, qemu   string
	kernels         []string
	initrd, memory  string
	extraCmdline    string
	timeout         time.Duration
	jsonOut, logs   string
}

func main() {
	var cfg config
	var kernels string
	flag.IntVar(&cfg.n, "n", 5, "timed runs of each VMM and kernel, interleaved")
	flag.IntVar(&cfg.warmup, "warmup", 1, "untimed runs of each VMM and kernel first")
	flag.IntVar(&cfg.cpus, "cpus", 1, "guest vCPUs for both VMMs")
	flag.StringVar(&cfg.microvm, "microvm", "bin/microvm", "microvm binary")
	flag.StringVar(&cfg.qemu, "qemu", "qemu-system-x86_64", "QEMU binary (its rows are skipped when not found)")
	flag.StringVar(&kernels, "kernel", "build/kernel/vmlinux,build/kernel/bzImage", "guest kernels, comma-separated: each gets its own rows")
	flag.StringVar(&cfg.initrd, "initrd", "build/linux/initramfs.cpio.gz", "initramfs with guest/init as /init")
	flag.StringVar(&cfg.memory, "memory", "256M", "guest memory for both VMMs")
	flag.StringVar(&cfg.extraCmdline, "append", "", "more kernel parameters for both VMMs (e.g. quiet)")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "a run taking longer is killed and counts as failed")
	flag.StringVar(&cfg.jsonOut, "json", "build/bench/linuxboot.json", "write the results here as JSON (empty: don't)")
	flag.StringVar(&cfg.logs, "logs", "build/bench/linuxboot-logs", "keep the console and stderr of failed runs here (empty: don't)")
	hostCheck := flag.Bool("host-check", false, "only say whether Linux guests can boot on this host's KVM: exit 0 if so, 1 if not")
	force := flag.Bool("force", false, "run even where the host check says Linux cannot boot")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: unexpected argument %q\n", prog, flag.Arg(0))
		os.Exit(2)
	}
	for _, k := range strings.Split(kernels, ",") {
		if k = strings.TrimSpace(k); k != "" {
			cfg.kernels = append(cfg.kernels, k)
		}
	}

	why := cannotBootLinux()
	if *hostCheck {
		if why != "" {
			fmt.Printf("%s: no: %s\n", prog, why)
			os.Exit(1)
		}
		fmt.Printf("%s: yes: /dev/kvm can boot Linux guests\n", prog)
		os.Exit(0)
	}
	if why != "" && !*force {
		fmt.Fprintf(os.Stderr, "%s: cannot boot Linux on this host: %s\n", prog, why)
		fmt.Fprintf(os.Stderr, "%s: run it in the nested-KVM box instead (QEMU TCG speed: a functional comparison, not boot times to quote):\n", prog)
		fmt.Fprintf(os.Stderr, "  scripts/kvmbox --timeout 30m -- %s\n", benchenv.BoxCommand())
		fmt.Fprintf(os.Stderr, "%s: or pass -force to try here anyway\n", prog)
		os.Exit(2)
	}
	if err := cfg.check(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(2)
	}
	rep := run(cfg)
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

// cannotBootLinux says why Linux guests cannot run on this host's KVM, or
// "" when they can as far as can be told without trying.
func cannotBootLinux() string {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return fmt.Sprintf("no /dev/kvm (%v)", err)
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "/dev/kvm is PVM-backed (kvm_pvm is loaded), which cannot run Linux guests to /init (docs/linux-on-pvm.md)"
	}
	return ""
}

// check looks for the files the runs need, so that a missing one is one
// clear line rather than every run failing.
func (cfg *config) check() error {
	if cfg.n < 1 || cfg.warmup < 0 || cfg.cpus < 1 {
		return fmt.Errorf("-n %d -warmup %d -cpus %d: want n >= 1, warmup >= 0, cpus >= 1", cfg.n, cfg.warmup, cfg.cpus)
	}
	if len(cfg.kernels) == 0 {
		return fmt.Errorf("-kernel: no kernel given")
	}
	hint := map[string]string{cfg.microvm: "make bin/microvm", cfg.initrd: "make initramfs"}
	files := append([]string{cfg.microvm, cfg.initrd}, cfg.kernels...)
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			h := hint[f]
			if h == "" {
				h = "make kernel"
			}
			return fmt.Errorf("%w (run `%s` first)", err, h)
		}
	}
	return nil
}

// cmdline is the kernel command line both VMMs pass, but for the reboot
// method: reboot=k (keyboard controller) ends microvm, while QEMU's microvm
// machine has no i8042 by default, so its guest resets with a triple fault
// (reboot=t) that -no-reboot turns into an exit.
func (cfg *config) cmdline(kind vmmKind) string {
	reboot := "reboot=k"
	if kind == kindQEMU {
		reboot = "reboot=t"
	}
	s := "console=ttyS0 " + reboot + " panic=-1"
	if cfg.extraCmdline != "" {
		s += " " + cfg.extraCmdline
	}
	return s
}

// argv is the command line of kind booting kernel.
func (cfg *config) argv(kind vmmKind, kernel string) []string {
	if kind == kindMicrovm {
		return []string{cfg.microvm, "run", "--kernel", kernel, "--initrd", cfg.initrd,
			"--cpus", fmt.Sprint(cfg.cpus), "--memory", cfg.memory, "--cmdline", cfg.cmdline(kind)}
	}
	return []string{cfg.qemu, "-M", "microvm,acpi=off", "-accel", "kvm", "-cpu", "host",
		"-m", cfg.memory, "-smp", fmt.Sprint(cfg.cpus), "-nodefaults", "-no-user-config",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", cfg.initrd, "-append", cfg.cmdline(kind)}
}

// run does the warm-up and the timed runs and summarises them.
func run(cfg config) *report {
	rep := newReport(cfg)
	var active []*row
	for _, r := range rep.Rows {
		if _, err := exec.LookPath(r.Argv[0]); err != nil {
			r.Skipped = err.Error()
			continue
		}
		active = append(active, r)
	}
	for i := 0; i < cfg.warmup; i++ {
		for _, r := range active {
			if _, err := runOnce(r.Argv, cfg.timeout); err != nil {
				fmt.Fprintf(os.Stderr, "%s: warm-up %s %s: %v\n", prog, r.Kernel, r.VMM, err)
				cfg.keepLog(r, "warmup", i+1, err)
			}
		}
	}
	for i := 0; i < cfg.n; i++ {
		for _, pair := range pairs(active) {
			if i%2 == 1 { // ABAB: the other VMM goes first every other iteration
				pair[0], pair[1] = pair[1], pair[0]
			}
			for _, r := range pair {
				if r == nil {
					continue
				}
				s, err := runOnce(r.Argv, cfg.timeout)
				if err != nil {
					r.Failures = append(r.Failures, fmt.Sprintf("run %d: %v", i+1, err))
					cfg.keepLog(r, "run", i+1, err)
					continue
				}
				r.Runs = append(r.Runs, s)
			}
		}
	}
	rep.summarise()
	return rep
}

// pairs groups rows by kernel, microvm first: [microvm, qemu] per kernel,
// with nil for a skipped VMM.
func pairs(rows []*row) [][2]*row {
	var out [][2]*row
	index := map[string]int{}
	for _, r := range rows {
		i, ok := index[r.KernelPath]
		if !ok {
			i = len(out)
			index[r.KernelPath] = i
			out = append(out, [2]*row{})
		}
		if r.VMM == kindMicrovm {
			out[i][0] = r
		} else {
			out[i][1] = r
		}
	}
	return out
}

// runError is a failed run, with what the VMM printed for the logs.
type runError struct {
	msg     string
	console *console
	stderr  []byte
}

func (e *runError) Error() string { return e.msg }

// runOnce runs one VMM to its exit, watching its console, and checks that
// the guest reached /init and /init finished well.
func runOnce(argv []string, timeout time.Duration) (sample, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = nil // /dev/null
	cmd.Stderr = &stderr
	start := time.Now()
	con := newConsole(start)
	cmd.Stdout = con
	fail := func(format string, a ...any) (sample, error) {
		return sample{}, &runError{msg: fmt.Sprintf(format, a...), console: con, stderr: stderr.Bytes()}
	}
	if err := cmd.Start(); err != nil {
		return sample{}, fmt.Errorf("start %s: %w", argv[0], err)
	}
	timer := time.AfterFunc(timeout, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	wall := time.Since(start)
	timer.Stop()
	st := cmd.ProcessState
	if st == nil {
		return fail("wait: %v", err)
	}
	ws := st.Sys().(syscall.WaitStatus)
	seen := fmt.Sprintf("ready=%v done=%q", con.ready > 0, con.done)
	switch {
	case ws.Signaled():
		return fail("killed by %v after %v (%s); console %q", ws.Signal(), wall.Round(time.Millisecond), seen, con.tail(400))
	case con.panicked != "":
		return fail("guest kernel panic: %q (exit status %d)", con.panicked, ws.ExitStatus())
	case ws.ExitStatus() != 0:
		return fail("exit status %d (%s); stderr %q; console %q", ws.ExitStatus(), seen, tailBytes(stderr.Bytes(), 300), con.tail(400))
	case con.ready == 0:
		return fail("exited 0 without %q on the console; console %q", readyLine, con.tail(400))
	case con.done != "ok":
		return fail("/init finished with %q, want \"ok\"; console %q", donePrefix+con.done, con.tail(400))
	}
	ru := st.SysUsage().(*syscall.Rusage)
	s := sample{
		ReadyMS:         ms(con.ready),
		ExitMS:          ms(wall),
		KernelRunInitMS: num(math.NaN()),
		CPUMS:           ms(time.Duration(ru.Utime.Nano() + ru.Stime.Nano())),
		RSSKiB:          ru.Maxrss, // kilobytes on Linux
	}
	if con.hasRunInit {
		s.KernelRunInitMS = num(con.runInit * 1000)
	}
	return s, nil
}

// keepLog writes the console and stderr of a failed run under cfg.logs.
func (cfg *config) keepLog(r *row, what string, i int, err error) {
	var re *runError
	if cfg.logs == "" || !errors.As(err, &re) {
		return
	}
	name := filepath.Join(cfg.logs, fmt.Sprintf("%s-%s-%s%d.log", r.Kernel, r.VMM, what, i))
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n# %s\n\n# console (stdout):\n", strings.Join(r.Argv, " "), re.msg)
	b.Write(re.console.all.Bytes())
	fmt.Fprintf(&b, "\n# stderr:\n%s", re.stderr)
	if err := writeFile(name, b.Bytes()); err != nil {
		fmt.Fprintf(os.Stderr, "%s: keeping the log of a failed run: %v\n", prog, err)
		return
	}
	fmt.Fprintf(os.Stderr, "%s: console of failed %s %s %s %d kept in %s\n", prog, r.Kernel, r.VMM, what, i, name)
}

// writeFile writes b to name, creating its directory.
func writeFile(name string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return fmt.Errorf("log directory: %w", err)
	}
	if err := os.WriteFile(name, b, 0o644); err != nil {
		return fmt.Errorf("log: %w", err)
	}
	return nil
}

func tailBytes(b []byte, n int) string {
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// inBox reports whether this runs inside the nested-KVM box.
func inBox() bool { return os.Getenv(kvmbox.EnvInBox) == "1" }
