package kvmbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/internal/testing/testenv"
)

func TestPassEnv(t *testing.T) {
	in := []string{
		"PATH=/usr/bin", "HOME=/root", "CI=true", "MICROVM_KERNEL=/k", "GOFLAGS=-mod=mod",
		"GOCACHE=/c", "CGO_ENABLED=0", "LC_ALL=C", "TMPDIR=/host/tmp", "SSH_AUTH_SOCK=/s",
		"MICROVM_IN_BOX=0", "MICROVM_HOST_KVM=none", "noequals", "PATHX=1",
	}
	want := []string{
		"PATH=/usr/bin", "HOME=/root", "CI=true", "MICROVM_KERNEL=/k", "GOFLAGS=-mod=mod",
		"GOCACHE=/c", "CGO_ENABLED=0", "LC_ALL=C", "MICROVM_IN_BOX=1",
	}
	if diff := cmp.Diff(want, PassEnv(in)); diff != "" {
		t.Errorf("PassEnv (-want +got):\n%s", diff)
	}
}

func TestHostTSCKHz(t *testing.T) {
	khz, err := HostTSCKHz()
	if err != nil {
		t.Skipf("this host's /proc/cpuinfo: %v", err)
	}
	if khz < 100_000 || khz > 10_000_000 {
		t.Errorf("TSC %d kHz: not a plausible rate", khz)
	}
}

func TestQEMUArgs(t *testing.T) {
	o := Options{Kernel: "/k/bzImage", Repo: "/work/repo", CPUs: 2, MemoryMiB: 3072, ConsoleLog: "/w/console.log",
		CPU: DefaultCPU, L1Append: "kvm_amd.npt=1"}
	args := qemuArgs(o, "/w/initramfs.cpio", "/w/status", "/w/heartbeat", "/m/monitor", 2445432)
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"-M microvm,acpi=off", "-cpu EPYC-v1,+svm,+npt", "-smp 2", "-m 3072M", "-no-reboot",
		"-kernel /k/bzImage", "-initrd /w/initramfs.cpio", "-serial file:/w/console.log",
		"tsc_early_khz=2445432 tsc=reliable no_timer_check kvm_amd.npt=0 kvm_amd.npt=1",
		"path=/,security_model=passthrough,readonly=on", "path=/work/repo,security_model=passthrough,multidevs=remap",
		"file,id=out,path=/dev/fd/3", "name=stdout", "file,id=err,path=/dev/fd/4", "name=stderr",
		"file,id=status,path=/w/status", "name=status",
		"file,id=beat,path=/w/heartbeat", "name=" + HeartbeatPort, "-monitor unix:/m/monitor,server=on,wait=off",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("QEMU arguments lack %q:\n%s", want, joined)
		}
	}
	if slices.Contains(args, "-nographic") {
		t.Error("-nographic would put the serial console on QEMU's stdout")
	}
}

// beatThenExit plays a beating box: it creates the heartbeat file at path,
// adds a byte every interval, beats times, then sends exit on the returned
// channel as QEMU's Wait would.
func beatThenExit(t *testing.T, path string, beats int, every time.Duration, exit error) <-chan error {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	waitErr := make(chan error, 1)
	go func() {
		for range beats {
			if _, err := f.Write([]byte{'.'}); err != nil {
				t.Error(err)
			}
			time.Sleep(every)
		}
		waitErr <- exit
	}()
	return waitErr
}

// TestWatch: a box whose heartbeat file keeps growing runs on until QEMU
// exits; one whose heartbeat stops (or never starts) is stalled after the
// stall timeout, not before; a cancelled context ends the watch.
func TestWatch(t *testing.T) {
	const stall = 300 * time.Millisecond
	beat := filepath.Join(t.TempDir(), "heartbeat")

	// Beats for 3 stall timeouts, then QEMU exits: no stall.
	waitErr := beatThenExit(t, beat, 30, stall/10, errors.New("exit status 3"))
	end := watchdog{beat: beat, stall: stall}.watch(context.Background(), waitErr)
	if !end.exited || end.stalled || end.qemuErr == nil || end.qemuErr.Error() != "exit status 3" {
		t.Errorf("beating box: %+v, want exited with QEMU's error", end)
	}

	// No more beats: stalled, after at least the stall timeout.
	start := time.Now()
	end = watchdog{beat: beat, stall: stall}.watch(context.Background(), make(chan error))
	if !end.stalled || end.exited {
		t.Errorf("silent box: %+v, want stalled", end)
	}
	if d := time.Since(start); d < stall {
		t.Errorf("silent box stalled after %v, before the %v timeout", d, stall)
	}

	// No heartbeat file at all (the init never started): stalled too.
	end = watchdog{beat: beat + ".none", stall: stall}.watch(context.Background(), make(chan error))
	if !end.stalled {
		t.Errorf("box without heartbeat: %+v, want stalled", end)
	}

	// Cancelled, and a negative stall timeout never fires.
	ctx, cancel := context.WithTimeout(context.Background(), 2*stall)
	defer cancel()
	end = watchdog{beat: beat + ".none", stall: -1}.watch(ctx, make(chan error))
	if end.stalled || end.exited || ctx.Err() == nil {
		t.Errorf("cancelled box: %+v (ctx %v), want neither exited nor stalled", end, ctx.Err())
	}
}

// TestWatchSpinCheck: a silent box whose vCPUs all spin ends at the spin
// check, long before the stall timeout, with the sample that showed it;
// one whose sample does not show a spin waits for the stall timeout; a
// beating box is never sampled.
func TestWatchSpinCheck(t *testing.T) {
	const stall, check = 3 * time.Second, 200 * time.Millisecond
	beat := filepath.Join(t.TempDir(), "heartbeat")
	spinning := vcpuSample{first: []vcpuRegs{{CPU: 0, RIP: 0x1234, RFlags: 0x86}}, second: []vcpuRegs{{CPU: 0, RIP: 0x1234, RFlags: 0x86}}}
	moving := vcpuSample{first: spinning.first, second: []vcpuRegs{{CPU: 0, RIP: 0x1300, RFlags: 0x86}}}
	var probes atomic.Int32
	probe := func(s vcpuSample) func() vcpuSample {
		return func() vcpuSample { probes.Add(1); return s }
	}

	start := time.Now()
	end := watchdog{beat: beat, stall: stall, spinCheck: check, probe: probe(spinning)}.watch(context.Background(), make(chan error))
	d := time.Since(start)
	if !end.stalled || end.sample == nil || !end.sample.spinning() || end.silent < check {
		t.Errorf("spinning silent box: %+v, want stalled with the spinning sample after %v", end, check)
	}
	if d < check || d >= stall {
		t.Errorf("spinning silent box ended after %v, want between %v and the %v stall timeout", d, check, stall)
	}

	probes.Store(0)
	start = time.Now()
	end = watchdog{beat: beat, stall: time.Second, spinCheck: check, probe: probe(moving)}.watch(context.Background(), make(chan error))
	if !end.stalled || end.sample != nil || time.Since(start) < time.Second {
		t.Errorf("silent box that moves: %+v after %v, want stalled without a sample at the 1s timeout", end, time.Since(start))
	}
	if n := probes.Load(); n < 2 {
		t.Errorf("silent box that moves: sampled %d times, want again every %v", n, check/3)
	}

	// Beating for 5 checks, then QEMU exits: never sampled.
	probes.Store(0)
	waitErr := beatThenExit(t, beat, 50, check/10, nil)
	end = watchdog{beat: beat, stall: stall, spinCheck: check, probe: probe(spinning)}.watch(context.Background(), waitErr)
	if !end.exited || end.stalled || probes.Load() != 0 {
		t.Errorf("beating box: %+v after %d samples, want exited and never sampled", end, probes.Load())
	}
}

// TestWatchQuiet: a command that keeps printing runs on while its heartbeat
// beats; one whose output stops is quiet after the quiet timeout, not
// before, though the heartbeat goes on; output written through OutputClock.Writer
// is what counts.
func TestWatchQuiet(t *testing.T) {
	const quiet = 300 * time.Millisecond
	beat := filepath.Join(t.TempDir(), "heartbeat")
	f, err := os.Create(beat)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	clock := NewOutputClock()
	var out strings.Builder
	w := watchdog{beat: beat, stall: time.Minute, quiet: quiet, output: clock}
	stop := make(chan struct{})
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		for {
			select {
			case <-stop:
				return
			case <-time.After(quiet / 10):
				_, _ = f.Write([]byte{'.'})
			}
		}
	}()
	defer func() { close(stop); <-beating }()

	// Prints for 3 quiet timeouts, then QEMU exits: not quiet.
	waitErr := make(chan error, 1)
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		sw := clock.Writer(&out)
		for range 30 {
			if _, err := sw.Write([]byte("x")); err != nil {
				t.Error(err)
			}
			time.Sleep(quiet / 10)
		}
		waitErr <- nil
	}()
	end := w.watch(context.Background(), waitErr)
	<-printed
	if !end.exited || end.quiet || end.stalled {
		t.Errorf("printing box: %+v, want exited", end)
	}
	if out.Len() != 30 {
		t.Errorf("the clock's writer passed on %d bytes, want 30", out.Len())
	}

	// Output stops, the heartbeat goes on: quiet, after the timeout.
	end = w.watch(context.Background(), make(chan error))
	if !end.quiet || end.stalled || end.exited {
		t.Errorf("quiet box: %+v, want quiet", end)
	}
	if d := time.Since(clock.Last()); d < quiet {
		t.Errorf("quiet %v after the last output, before the %v timeout", d, quiet)
	}
}

func TestWriteInitramfs(t *testing.T) {
	dir := t.TempDir()
	initBin := filepath.Join(dir, "init")
	if err := os.WriteFile(initBin, []byte("\x7fELF-not-really"), 0o755); err != nil {
		t.Fatal(err)
	}
	job := Job{Argv: []string{"sh", "-c", "exit 7"}, Env: []string{"A=b"}, Dir: "/x", Repo: "/work/repo"}
	out := filepath.Join(dir, "initramfs.cpio")
	if err := writeInitramfs(out, initBin, job); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("070701")) || !bytes.Contains(b, []byte("TRAILER!!!")) {
		t.Fatal("not a newc archive with a trailer")
	}
	jb, _ := json.Marshal(job)
	for _, want := range [][]byte{[]byte("dev/console\x00"), []byte("kvmbox/job.json\x00"), jb, []byte("\x7fELF-not-really")} {
		if !bytes.Contains(b, want) {
			t.Errorf("archive lacks %q", want)
		}
	}
	if cpio, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command(cpio, "-it")
		cmd.Stdin = bytes.NewReader(b)
		list, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio -it: %v", err)
		}
		got := strings.Fields(string(list))
		if diff := cmp.Diff([]string{"dev", "dev/console", "kvmbox", "kvmbox/job.json", "init"}, got); diff != "" {
			t.Errorf("cpio -it (-want +got):\n%s", diff)
		}
	}
}

// needBox skips with -short or inside the box, and otherwise returns the
// repository root and the box's L1 kernel and init, which it needs along
// with QEMU (Missing, a failure under CI, when one is absent).
func needBox(t *testing.T) (root, kernel, initBin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots the nested-KVM box (seconds); skipped with -short")
	}
	if testenv.InBox() {
		t.Skip("already inside the box")
	}
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Missing(t, "no qemu-system-x86_64: %v", err)
	}
	kernel = filepath.Join(root, "build", "kvmbox", "bzImage")
	initBin = filepath.Join(root, "build", "kvmbox", "init")
	for _, p := range []string{kernel, initBin} {
		if _, err := os.Stat(p); err != nil {
			testenv.Missing(t, "no %s (make kvmbox): %v", p, err)
		}
	}
	return root, kernel, initBin
}

// TestBox runs scripts/kvmbox itself: the L1 kernel boots under QEMU TCG
// and the command sees a working /dev/kvm, the repository read-write at its
// own path, a tmpfs /tmp, the passed environment, and its streams and exit
// status come back apart. It needs QEMU and the L1 kernel (make kvmbox), not
// a host KVM.
func TestBox(t *testing.T) {
	root, _, _ := needBox(t)
	marker := filepath.Join(root, "build", "kvmbox", "test-marker")
	os.Remove(marker)
	script := `set -e
test -c /dev/kvm
echo "out: $MICROVM_KVMBOX_TEST_VAR $MICROVM_IN_BOX"
echo "err: $(stat -f -c %T /tmp)" >&2
test -z "$UNPASSED_VAR"
echo written > ` + marker + `
exit 7`
	cmd := exec.Command(filepath.Join(root, "scripts", "kvmbox"), "--cpus", "1", "--memory", "512M", "--timeout", "5m", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "MICROVM_KVMBOX_TEST_VAR=passed", "UNPASSED_VAR=leaked")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 7 {
		t.Fatalf("scripts/kvmbox: %v, want exit status 7; stdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	if got, want := stdout.String(), "out: passed 1\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if got, want := stderr.String(), "err: tmpfs\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "written\n" {
		t.Errorf("file written in the box at %s: %q, %v", marker, b, err)
	}
	os.Remove(marker)
}

// TestBoxRepoUnderTmp: a repository under /tmp (a CI checkout, say) is
// still shared: the box's own /tmp must not hide it.
func TestBoxRepoUnderTmp(t *testing.T) {
	_, kernel, initBin := needBox(t)
	repo, err := os.MkdirTemp("/tmp", "kvmbox-repo-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(repo)
	var stdout, stderr bytes.Buffer
	code, err := Run(context.Background(), Options{
		Kernel: kernel, Init: initBin, Repo: repo, Dir: repo, CPUs: 1, MemoryMiB: 512,
		Timeout: 5 * time.Minute, Stdout: &stdout, Stderr: &stderr,
	}, []string{"sh", "-c", "pwd; echo inside > written"})
	if err != nil || code != 0 {
		t.Fatalf("Run: %d, %v; stderr:\n%s", code, err, &stderr)
	}
	if got := strings.TrimSpace(stdout.String()); got != repo {
		t.Errorf("working directory in the box %q, want %q", got, repo)
	}
	if b, err := os.ReadFile(filepath.Join(repo, "written")); err != nil || string(b) != "inside\n" {
		t.Errorf("file written in the box: %q, %v", b, err)
	}
}
