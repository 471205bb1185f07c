// Package kvmbox runs a command inside the nested-KVM box: an L1 Linux
// kernel (guest/kvmbox/l1.config) booted by QEMU TCG with emulated AMD SVM
// and nested paging, which offers a real /dev/kvm on any x86-64 Linux host,
// including hosts with no KVM at all or a PVM-backed one that cannot run
// Linux guests. docs/testing.md explains the box; scripts/kvmbox is its
// command line.
//
// Data flow:
//
//	Run ── writes ─▶ initramfs (box init + job.json) ──▶ qemu-system-x86_64
//	                                                       │ 9p "hostroot": / read-only (overlay + tmpfs inside)
//	                                                       │ 9p "repo": Options.Repo read-write, same path
//	 Stdout ◀─ copy ◀─ pipe ◀── virtio-serial "stdout" ◀───┤
//	 Stderr ◀─ copy ◀─ pipe ◀── virtio-serial "stderr" ◀───┤
//	 status ◀─ file ◀────────── virtio-serial "status" ◀───┤ "exit N" | "signal N" | "box-error ..."
//	 watchdog ◀─ file size ◀─── virtio-serial "heartbeat" ◀┤ a byte every HeartbeatInterval
//	 console log file ◀──────── serial ttyS0 ◀─────────────┤ kernel and init chatter,
//	                 │                                     │ the init's report on a silent command
//	                 └◀ vCPU registers ◀─ human monitor ◀──┘ asked at a stall (monitor.go)
//
// Goroutines: Run owns QEMU and two copiers (one per output pipe) that end
// when QEMU closes its end; Run waits for both before it returns. Run's own
// loop is the watchdog: it kills QEMU when the heartbeat file stops growing
// for StallTimeout (an L1 kernel that hung, or a QEMU stuck in TCG), or when
// the command printed nothing for QuietTimeout (output that stopped flowing
// while the L1 still beats), so a dead box costs minutes, not the whole
// Timeout; before the kill it asks QEMU's monitor where the L1's vCPUs
// are. From SpinCheckAfter without a heartbeat it asks the monitor sooner,
// and a box whose vCPUs all spin with interrupts off (a hang nothing can
// end) is killed then. The copiers stamp the time of the last output
// (OutputClock) for it.
package kvmbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/microvm/microvm/guest/initramfs"
)

// ExitBoxFailure is the exit status when the box itself failed: the L1
// kernel did not start the command, /dev/kvm is missing inside, or the
// timeout passed.
const ExitBoxFailure = 125

// DefaultCPU is the box's CPU model: an EPYC with SVM. +npt offers nested
// paging to the L1 kernel, whose kvm_amd is told not to use it (qemuArgs).
const DefaultCPU = "EPYC-v1,+svm,+npt"

// HeartbeatPort is the virtio-serial port the box's init writes a byte to
// every HeartbeatInterval while the L1 kernel runs.
const (
	HeartbeatPort     = "heartbeat"
	HeartbeatInterval = 5 * time.Second
)

// DefaultStallTimeout is how long a box may send no heartbeat (its L1 boot
// included, which takes seconds under TCG) before it counts as dead.
const DefaultStallTimeout = 3 * time.Minute

// SpinCheckAfter is how long a box may send no heartbeat before the
// watchdog asks QEMU's monitor whether the L1 is certainly hung (every
// vCPU spinning with interrupts off, vcpuSample.spinning); such a box
// ends then instead of after the whole stall timeout. It is asked again
// every SpinCheckAfter/3 until the stall timeout.
const SpinCheckAfter = 45 * time.Second

// EnvInBox is set to "1" in the command's environment inside the box, so
// tests can tell where they run.
const EnvInBox = "MICROVM_IN_BOX"

// Options configure one box.
type Options struct {
	// QEMU is the qemu-system-x86_64 binary (found in PATH when empty).
	QEMU string
	// Kernel is the L1 bzImage (build/kvmbox/bzImage).
	Kernel string
	// Init is the box's static init binary (guest/kvmbox/init).
	Init string
	// Repo is shared read-write at the same absolute path.
	Repo string
	// Dir is the command's working directory (the caller's when empty).
	Dir string
	// CPUs and MemoryMiB size the box (defaults: 2 and 3072).
	CPUs      int
	MemoryMiB int
	// TCGThread is QEMU's TCG threading: "multi" (one host thread per
	// vCPU, the default) or "single" (all vCPUs on one host thread).
	TCGThread string
	// CPU is QEMU's -cpu for the box (default DefaultCPU).
	CPU string
	// L1Append is added to the L1 kernel's command line, after what the
	// box sets (kvm_amd.npt=1 turns nested paging back on); empty by
	// default.
	L1Append string
	// Timeout bounds the whole run (0: none).
	Timeout time.Duration
	// StallTimeout ends the box when its L1 sent no heartbeat for this
	// long (0: DefaultStallTimeout; negative: never), or sooner, from
	// SpinCheckAfter on, when every L1 vCPU spins with interrupts off.
	StallTimeout time.Duration
	// QuietTimeout ends the box when the command wrote nothing to its
	// stdout or stderr for this long (0: never). Seen once in CI: a test
	// printed "=== RUN" and then nothing, not even its own -test.timeout
	// panic, for 16 minutes while the L1 kept beating.
	QuietTimeout time.Duration
	// Env is the command's environment; nil means PassEnv(os.Environ()).
	Env []string
	// Stdout and Stderr receive the command's output (os.Stdout and
	// os.Stderr when nil).
	Stdout, Stderr io.Writer
	// ConsoleLog is where the L1 kernel's console goes (a file in the
	// work directory when empty); kept for debugging.
	ConsoleLog string
	// WorkDir holds the initramfs and the status file (a fresh temporary
	// directory when empty, removed afterwards).
	WorkDir string
}

// Job is what the box's init reads from /kvmbox/job.json.
type Job struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	Repo string   `json:"repo"`
	// QuietReport: when the command printed nothing for this long, the
	// init writes to the console what every L1 task waits on (0: never).
	// Three quarters of QuietTimeout, so the report is in the console log
	// before the host ends the box.
	QuietReport time.Duration `json:"quiet_report,omitempty"`
}

// BoxError is a failure of the box itself (not of the command).
type BoxError struct {
	Msg        string
	ConsoleLog string // where to look, when kept
}

func (e *BoxError) Error() string {
	if e.ConsoleLog != "" {
		return fmt.Sprintf("%s (L1 console log: %s)", e.Msg, e.ConsoleLog)
	}
	return e.Msg
}

// passedEnv are the variables a command in the box sees besides CI and
// MICROVM_*: what finds tools (PATH, HOME, Go's variables) and the locale.
var passedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TZ"}

// PassEnv filters env down to what the box passes through: CI, MICROVM_*
// (but MICROVM_HOST_KVM), GO*, CGO_*, LC_* and passedEnv, plus EnvInBox=1.
func PassEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		// MICROVM_HOST_KVM describes the outer host (testenv): inside, the
		// box's own KVM is what counts.
		if !ok || k == EnvInBox || k == "MICROVM_HOST_KVM" {
			continue
		}
		switch {
		case k == "CI", strings.HasPrefix(k, "MICROVM_"), strings.HasPrefix(k, "GO"),
			strings.HasPrefix(k, "CGO_"), strings.HasPrefix(k, "LC_"):
			out = append(out, kv)
		default:
			for _, p := range passedEnv {
				if k == p {
					out = append(out, kv)
				}
			}
		}
	}
	return append(out, EnvInBox+"=1")
}

// HostTSCKHz reads the host's TSC rate from /proc/cpuinfo ("cpu MHz"). TCG's
// rdtsc is the host's TSC, and the L1 kernel must be told its rate: when its
// own PIT calibration fails under load, KVM_RUN spins for ever
// (../shared/NESTED-KVM.md).
func HostTSCKHz() (int, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 {
			return 0, fmt.Errorf("/proc/cpuinfo: bad cpu MHz %q", v)
		}
		return int(mhz * 1000), nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("/proc/cpuinfo has no \"cpu MHz\" line")
}

// Run boots the box, runs argv in it and returns the command's exit status:
// its exit code, or 128+signal when a signal ended it. A failure of the box
// itself is a *BoxError (callers exit ExitBoxFailure).
func Run(ctx context.Context, o Options, argv []string) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("kvmbox: no command")
	}
	if err := o.defaults(); err != nil {
		return 0, err
	}
	work := o.WorkDir
	if work == "" {
		d, err := os.MkdirTemp("", "kvmbox-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(d)
		work = d
	}
	if o.ConsoleLog == "" {
		o.ConsoleLog = filepath.Join(work, "console.log")
	}
	initrd := filepath.Join(work, "initramfs.cpio")
	job := Job{Argv: argv, Env: o.Env, Dir: o.Dir, Repo: o.Repo, QuietReport: max(o.QuietTimeout, 0) * 3 / 4}
	if err := writeInitramfs(initrd, o.Init, job); err != nil {
		return 0, &BoxError{Msg: "kvmbox: initramfs: " + err.Error()}
	}
	khz, err := HostTSCKHz()
	if err != nil {
		return 0, &BoxError{Msg: "kvmbox: TSC rate: " + err.Error()}
	}
	statusPath := filepath.Join(work, "status")
	beatPath := filepath.Join(work, HeartbeatPort)
	// The monitor's socket in a short directory of its own: WorkDir may be
	// deep enough for a Unix socket path (108 bytes) to overflow.
	monDir, err := os.MkdirTemp("", "kvmbox-mon-")
	if err != nil {
		return 0, &BoxError{Msg: "kvmbox: monitor directory: " + err.Error()}
	}
	defer os.RemoveAll(monDir)
	monPath := filepath.Join(monDir, "monitor")

	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return 0, err
	}
	cmd := exec.Command(o.QEMU, qemuArgs(o, initrd, statusPath, beatPath, monPath, khz)...)
	// QEMU opens /dev/fd/3 and /dev/fd/4 as its file chardevs: the write
	// ends of the two pipes, whatever the caller's stdout is.
	cmd.ExtraFiles = []*os.File{outW, errW}
	cmd.Stdin = nil
	var qemuOut strings.Builder
	cmd.Stdout = &limitedWriter{w: &qemuOut, n: 4096}
	cmd.Stderr = cmd.Stdout
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return 0, &BoxError{Msg: "kvmbox: start QEMU: " + err.Error()}
	}
	var copies sync.WaitGroup
	out := NewOutputClock()
	copies.Add(2)
	go func() {
		defer copies.Done()
		_, _ = io.Copy(out.Writer(o.Stdout), outR)
		outR.Close()
	}()
	go func() {
		defer copies.Done()
		_, _ = io.Copy(out.Writer(o.Stderr), errR)
		errR.Close()
	}()

	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	probe := func() vcpuSample { return sampleVCPUs(monPath, monitorTimeout, time.Second) }
	end := watchdog{beat: beatPath, stall: o.StallTimeout, spinCheck: SpinCheckAfter, probe: probe,
		quiet: o.QuietTimeout, output: out}.watch(ctx, waitErr)
	qerr := end.qemuErr
	if !end.exited {
		// Where the L1's vCPUs are, asked before QEMU dies (monitor.go),
		// unless the watchdog's own sample ended the box.
		var sample vcpuSample
		if end.sample != nil {
			sample = *end.sample
		} else if end.stalled || end.quiet {
			sample = probe()
		}
		_ = cmd.Process.Kill()
		<-waitErr
		copies.Wait()
		msg := "kvmbox: interrupted"
		switch {
		case end.stalled && end.sample != nil:
			msg = fmt.Sprintf("kvmbox: the box stopped answering: no heartbeat from its L1 for %v, every vCPU spinning with interrupts off",
				end.silent.Round(time.Second))
		case end.stalled:
			msg = fmt.Sprintf("kvmbox: the box stopped answering: no heartbeat from its L1 for %v", end.silent.Round(time.Second))
		case end.quiet:
			msg = fmt.Sprintf("kvmbox: the command printed nothing for %v (its L1 still beating)", o.QuietTimeout)
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			msg = fmt.Sprintf("kvmbox: timed out after %v", o.Timeout)
		}
		if end.stalled || end.quiet {
			if sample.err != nil {
				msg += fmt.Sprintf("; no L1 registers (%v)", sample.err)
			} else {
				msg += "; L1 " + sample.summary()
			}
			appendConsole(o.ConsoleLog, sample.raw, sample.err)
		}
		return 0, &BoxError{Msg: msg, ConsoleLog: keepLog(o)}
	}
	copies.Wait()

	b, _ := os.ReadFile(statusPath)
	line := strings.TrimSpace(string(b))
	switch {
	case strings.HasPrefix(line, "exit "):
		n, err := strconv.Atoi(strings.TrimPrefix(line, "exit "))
		if err == nil {
			return n, nil
		}
	case strings.HasPrefix(line, "signal "):
		n, err := strconv.Atoi(strings.TrimPrefix(line, "signal "))
		if err == nil {
			return 128 + n, nil
		}
	case strings.HasPrefix(line, "box-error "):
		return 0, &BoxError{Msg: "kvmbox: " + strings.TrimPrefix(line, "box-error "), ConsoleLog: keepLog(o)}
	}
	msg := "kvmbox: the L1 kernel did not run the command (no status from the box)"
	if qerr != nil {
		msg += fmt.Sprintf("; QEMU: %v", qerr)
	}
	if s := strings.TrimSpace(qemuOut.String()); s != "" {
		msg += ": " + firstLine(s)
	}
	return 0, &BoxError{Msg: msg, ConsoleLog: keepLog(o)}
}

// boxEnd is how watch saw a box end.
type boxEnd struct {
	exited  bool          // QEMU exited by itself
	qemuErr error         // and what its Wait said
	stalled bool          // not exited: the heartbeat stopped
	silent  time.Duration // stalled: for this long
	sample  *vcpuSample   // stalled early: the probe's sample that showed it
	quiet   bool          // not exited: the command's output stopped
}

// watchdog is what watch checks besides QEMU's exit and the context.
type watchdog struct {
	beat  string        // the heartbeat file, growing while the L1 runs
	stall time.Duration // no growth for this long: stalled (<= 0: never)
	// spinCheck: no growth for this long (and again every spinCheck/3),
	// ask probe; a sample whose vCPUs all spin is a stall now (<= 0 or
	// no probe: never).
	spinCheck time.Duration
	probe     func() vcpuSample
	quiet     time.Duration // no output for this long: quiet (<= 0: never)
	output    *OutputClock  // the command's, when quiet > 0
}

// watch waits for QEMU to exit, ctx to end, the heartbeat file to stop
// growing for w.stall (or for w.spinCheck, with a sample that shows every
// vCPU spinning), or the command's output to stop for w.quiet. The clocks
// start now: the L1 boot counts against both.
func (w watchdog) watch(ctx context.Context, waitErr <-chan error) boxEnd {
	var tick <-chan time.Time
	if w.stall > 0 || w.quiet > 0 {
		every := HeartbeatInterval
		for _, d := range []time.Duration{w.stall, w.quiet, w.spinCheck} {
			if d > 0 {
				every = min(every, d/4)
			}
		}
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	var size int64
	last := time.Now()
	var probed time.Time // the last spin check
	for {
		select {
		case err := <-waitErr:
			return boxEnd{exited: true, qemuErr: err}
		case <-ctx.Done():
			return boxEnd{}
		case now := <-tick:
			if w.stall > 0 {
				if fi, err := os.Stat(w.beat); err == nil && fi.Size() != size {
					size, last = fi.Size(), now
				} else if now.Sub(last) >= w.stall {
					return boxEnd{stalled: true, silent: now.Sub(last)}
				} else if w.spinCheck > 0 && w.probe != nil && now.Sub(last) >= w.spinCheck && now.Sub(probed) >= w.spinCheck/3 {
					probed = now
					if s := w.probe(); s.spinning() {
						return boxEnd{stalled: true, silent: time.Since(last), sample: &s}
					}
				}
			}
			if w.quiet > 0 && now.Sub(w.output.Last()) >= w.quiet {
				return boxEnd{quiet: true}
			}
		}
	}
}

// OutputClock is the time of a command's last output, which the box's
// watchdogs (host and init) tell silence by. Writers from Writer stamp it;
// safe for concurrent use.
type OutputClock struct{ last atomic.Int64 } // UnixNano

// NewOutputClock starts the clock now, as if the command had just printed.
func NewOutputClock() *OutputClock {
	c := &OutputClock{}
	c.last.Store(time.Now().UnixNano())
	return c
}

// Last is when the command last printed.
func (c *OutputClock) Last() time.Time { return time.Unix(0, c.last.Load()) }

// Writer writes to w and stamps the clock with each write.
func (c *OutputClock) Writer(w io.Writer) io.Writer { return stampWriter{w, c} }

type stampWriter struct {
	w io.Writer
	c *OutputClock
}

func (s stampWriter) Write(p []byte) (int, error) {
	s.c.last.Store(time.Now().UnixNano())
	return s.w.Write(p)
}

// keepLog copies the console log next to the repository's build output when
// it lives in a temporary work directory about to be removed.
func keepLog(o Options) string {
	if o.WorkDir != "" {
		return o.ConsoleLog
	}
	dst := filepath.Join(o.Repo, "build", "kvmbox", "last-console.log")
	b, err := os.ReadFile(o.ConsoleLog)
	if err != nil {
		return ""
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return ""
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		return ""
	}
	return dst
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func (o *Options) defaults() error {
	if o.QEMU == "" {
		p, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return &BoxError{Msg: "kvmbox: qemu-system-x86_64 not found (apt-get install qemu-system-x86)"}
		}
		o.QEMU = p
	}
	for _, f := range []struct{ what, path string }{{"L1 kernel", o.Kernel}, {"box init", o.Init}} {
		if f.path == "" {
			return &BoxError{Msg: "kvmbox: no " + f.what + " given"}
		}
		if _, err := os.Stat(f.path); err != nil {
			return &BoxError{Msg: fmt.Sprintf("kvmbox: %s: %v (make kvmbox builds it)", f.what, err)}
		}
	}
	if !filepath.IsAbs(o.Repo) {
		return &BoxError{Msg: fmt.Sprintf("kvmbox: repository path %q is not absolute", o.Repo)}
	}
	if o.Dir == "" {
		d, err := os.Getwd()
		if err != nil {
			return err
		}
		o.Dir = d
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 3072
	}
	if o.CPU == "" {
		o.CPU = DefaultCPU
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	switch o.TCGThread {
	case "":
		o.TCGThread = "multi"
	case "multi", "single":
	default:
		return fmt.Errorf("kvmbox: --tcg-thread %q: multi or single", o.TCGThread)
	}
	if o.CPUs < 1 || o.CPUs > 8 {
		return fmt.Errorf("kvmbox: --cpus %d: 1..8", o.CPUs)
	}
	if o.MemoryMiB < 256 {
		return fmt.Errorf("kvmbox: --memory %d MiB: at least 256", o.MemoryMiB)
	}
	if o.Env == nil {
		o.Env = PassEnv(os.Environ())
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	return nil
}

// qemuArgs is the QEMU command line (../shared/NESTED-KVM.md): QEMU's
// microvm machine without ACPI (virtio-mmio devices on the kernel command
// line), TCG with every host core, an EPYC CPU with SVM and nested paging.
func qemuArgs(o Options, initrd, status, heartbeat, monitor string, khz int) []string {
	cmdline := strings.Join([]string{
		"console=ttyS0", "reboot=t", "panic=-1", "loglevel=4",
		fmt.Sprintf("tsc_early_khz=%d", khz), "tsc=reliable",
		// No IO-APIC timer check: on a loaded host TCG delivers the
		// test tick too late and L1 panics ("IO-APIC + timer doesn't
		// work!"; seen with three boxes and a kernel build on 2 cores).
		"no_timer_check",
		// Shadow paging for the L2 guests: with nested paging QEMU's
		// TCG (7.2 and 10.0 alike) corrupts L1 memory now and then
		// (L2 triple faults, L1 oopses in unrelated code); with
		// npt=0 no box run faulted (docs/testing.md).
		"kvm_amd.npt=0",
	}, " ")
	if o.L1Append != "" {
		cmdline += " " + o.L1Append
	}
	return []string{
		"-M", "microvm,acpi=off", "-accel", "tcg,thread=" + o.TCGThread,
		"-cpu", o.CPU,
		"-smp", strconv.Itoa(o.CPUs), "-m", fmt.Sprintf("%dM", o.MemoryMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "file:" + o.ConsoleLog,
		"-kernel", o.Kernel, "-initrd", initrd, "-append", cmdline,
		"-fsdev", "local,id=hostroot,path=/,security_model=passthrough,readonly=on,multidevs=remap",
		"-device", "virtio-9p-device,fsdev=hostroot,mount_tag=hostroot",
		"-fsdev", "local,id=repo,path=" + o.Repo + ",security_model=passthrough,multidevs=remap",
		"-device", "virtio-9p-device,fsdev=repo,mount_tag=repo",
		"-device", "virtio-serial-device",
		"-chardev", "file,id=out,path=/dev/fd/3",
		"-device", "virtserialport,chardev=out,name=stdout",
		"-chardev", "file,id=err,path=/dev/fd/4",
		"-device", "virtserialport,chardev=err,name=stderr",
		"-chardev", "file,id=status,path=" + status,
		"-device", "virtserialport,chardev=status,name=status",
		"-chardev", "file,id=beat,path=" + heartbeat,
		"-device", "virtserialport,chardev=beat,name=" + HeartbeatPort,
		// The human monitor, for the vCPUs' registers at a stall.
		"-monitor", "unix:" + monitor + ",server=on,wait=off",
	}
}

// writeInitramfs writes an uncompressed cpio with the box's init as /init
// and the job as /kvmbox/job.json.
func writeInitramfs(path, initBin string, job Job) error {
	initData, err := os.ReadFile(initBin)
	if err != nil {
		return err
	}
	jobData, err := json.Marshal(job)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := bufio.NewWriter(f)
	w := initramfs.NewWriter(buf)
	err = errors.Join(
		w.Dir("dev", 0o755),
		w.CharDev("dev/console", 0o600, 5, 1),
		w.Dir("kvmbox", 0o755),
		w.File("kvmbox/job.json", 0o644, jobData),
		w.File("init", 0o755, initData),
		w.Close(),
		buf.Flush(),
	)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// limitedWriter keeps the first n bytes written to it (QEMU's own messages).
type limitedWriter struct {
	mu sync.Mutex
	w  io.Writer
	n  int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 {
		k := min(l.n, len(p))
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
