package microvm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testing/consoletest"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/kvm"
)

// logBuffer is a logger whose output the test can read.
func logBuffer() (*logrus.Logger, *consoletest.Console) {
	c := consoletest.New()
	l := logrus.New()
	l.SetOutput(c)
	l.SetLevel(logrus.InfoLevel)
	return l, c
}

// runGuest boots cfg to completion with a deadline and returns the result and
// the console output.
func runGuest(t *testing.T, cfg microvm.Config, timeout time.Duration) (microvm.Result, string, error) {
	t.Helper()
	out := consoletest.New()
	cfg.Console = out
	if cfg.Log == nil {
		cfg.Log = quietLog()
	}
	m, err := microvm.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := m.Run(ctx)
	if res.Kind == microvm.ExitCanceled {
		t.Fatalf("guest still running after %v; console:\n%s", timeout, out.String())
	}
	return res, out.String(), err
}

// resultOpts compares Results without their error value.
var resultOpts = cmpopts.IgnoreFields(microvm.Result{}, "Err")

func TestTinyGuestExits(t *testing.T) {
	testenv.RequireKVM(t)
	tests := []struct {
		name    string
		prog    testenv.Program
		want    microvm.Result
		console string
		log     string // substring of the VMM log
	}{
		{"debug exit 0", testenv.Program{}.Exit(0).Halt(), microvm.Result{Kind: microvm.ExitDebugPort, Status: 0}, "", ""},
		{"debug exit 42", testenv.Program{}.Exit(42).Halt(), microvm.Result{Kind: microvm.ExitDebugPort, Status: 42}, "", ""},
		{"debug exit 255", testenv.Program{}.Exit(255).Halt(), microvm.Result{Kind: microvm.ExitDebugPort, Status: 255}, "", ""},
		{"console then exit", testenv.Program{}.Print("hi there\n").Exit(7).Halt(), microvm.Result{Kind: microvm.ExitDebugPort, Status: 7}, "hi there\n", ""},
		{"partial line flushed at exit", testenv.Program{}.Print("no newline").Exit(0).Halt(), microvm.Result{Kind: microvm.ExitDebugPort, Status: 0}, "no newline", ""},
		{"i8042 reset", testenv.Program{}.Print("resetting\n").Reset().Halt(), microvm.Result{Kind: microvm.ExitReset, Status: microvm.StatusOK}, "resetting\n", ""},
		{"triple fault", testenv.Program{}.UD2(), microvm.Result{Kind: microvm.ExitTripleFault, Status: microvm.StatusTripleFault}, "", "guest triple fault (KVM_EXIT_SHUTDOWN): vCPU 0 rip="},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, logged := logBuffer()
			res, out, err := runGuest(t, microvm.Config{Kernel: testenv.TinyGuest(t, tc.prog), MemoryBytes: 16 << 20, Log: log}, 30*time.Second)
			if err != nil {
				t.Fatalf("Run: %v; log:\n%s", err, logged)
			}
			if diff := cmp.Diff(tc.want, res, resultOpts); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if out != tc.console {
				t.Errorf("console = %q, want %q", out, tc.console)
			}
			if tc.log != "" && !strings.Contains(logged.String(), tc.log) {
				t.Errorf("log does not contain %q:\n%s", tc.log, logged)
			}
		})
	}
}

// TestCancelStopsGuest: canceling Run's context stops a guest that would
// never stop by itself, promptly, and Close then succeeds.
func TestCancelStopsGuest(t *testing.T) {
	testenv.RequireKVM(t)
	for _, cpus := range []int{1, 3} {
		t.Run(fmt.Sprintf("cpus=%d", cpus), func(t *testing.T) {
			out := consoletest.New()
			m, err := microvm.New(microvm.Config{
				Kernel:  testenv.TinyGuest(t, testenv.Program{}.Print("up\n").Halt()),
				CPUs:    cpus,
				Console: out, Log: quietLog(), MemoryBytes: 16 << 20,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ctx, cancel := context.WithCancel(context.Background())
			type ran struct {
				res microvm.Result
				err error
			}
			done := make(chan ran, 1)
			go func() {
				r, err := m.Run(ctx)
				done <- ran{r, err}
			}()
			if !out.WaitFor("up\n", 30*time.Second, nil) {
				t.Fatalf("guest did not start; console %q", out)
			}
			start := time.Now()
			cancel()
			select {
			case r := <-done:
				if r.err != nil || r.res.Kind != microvm.ExitCanceled || r.res.Status != microvm.StatusError {
					t.Errorf("Run = %+v, %v; want canceled with status %d", r.res, r.err, microvm.StatusError)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
			t.Logf("stopped %v after cancel", time.Since(start))
		})
	}
}

func TestTestGuest(t *testing.T) {
	testenv.RequireKVM(t)
	guest := testenv.TestGuest(t)
	type tc struct {
		name    string
		cmdline string
		cpus    int
		want    microvm.Result
		line    string
	}
	tests := []tc{
		{"fail", "testguest.mode=fail", 1, microvm.Result{Kind: microvm.ExitDebugPort, Status: 3}, "testguest: fail mode: exiting with status 3"},
		{"bad cmdline", "testguest.mode=nope", 1, microvm.Result{Kind: microvm.ExitDebugPort, Status: 8}, "testguest: bad command line: unknown mode in 'testguest.mode=nope'"},
	}
	for n := 1; n <= 4; n++ {
		tests = append(tests, tc{fmt.Sprintf("hello cpus=%d", n), "testguest.mode=hello", n, microvm.Result{Kind: microvm.ExitDebugPort, Status: 0}, fmt.Sprintf("testguest: hello cpus=%d", n)})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, out, err := runGuest(t, microvm.Config{Kernel: guest, Cmdline: tc.cmdline, CPUs: tc.cpus, MemoryBytes: 64 << 20}, 60*time.Second)
			if err != nil {
				t.Fatalf("Run: %v; console:\n%s", err, out)
			}
			if diff := cmp.Diff(tc.want, res, resultOpts); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{tc.line}, strings.Split(strings.TrimRight(out, "\n"), "\n")); diff != "" {
				t.Errorf("console lines (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGuestMemoryVisible: after Run, Memory() shows what the loader wrote
// (the command line at 0x20000, docs/machine.md).
func TestGuestMemoryVisible(t *testing.T) {
	testenv.RequireKVM(t)
	m, err := microvm.New(microvm.Config{Kernel: testenv.TinyGuest(t, testenv.Program{}.Exit(0)), Cmdline: "hello=world", MemoryBytes: 16 << 20, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("hello=world")+1)
	if err := m.ReadMemory(0x20000, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != "hello=world\x00" {
		t.Errorf("command line in guest memory = %q", got)
	}
}

// TestGarbageKernels: files that are not kernels are refused with one line
// naming the file, never a panic or a hang.
func TestGarbageKernels(t *testing.T) {
	dir := t.TempDir()
	elf := testenv.TinyELF(testenv.Program{}.Exit(0))
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, ""},
		{"text", []byte("#!/bin/sh\necho not a kernel\n"), "not a bzImage or ELF kernel"},
		{"zeros", make([]byte, 8192), "not a bzImage or ELF kernel"},
		{"truncated ELF", elf[:40], ""},
		{"ELF with its program header cut off", elf[:80], ""},
		{"ELF32 class byte", append(append([]byte{}, elf[:4]...), append([]byte{1}, elf[5:]...)...), ""},
		{"bzImage magic only", append(make([]byte, 0x202), []byte("HdrS")...), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := microvm.New(microvm.Config{Kernel: path, MemoryBytes: 16 << 20, Log: quietLog()})
			if err == nil {
				m.Close()
				t.Fatal("New accepted a garbage kernel")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "kernel "+path+": ") || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line starting with %q", msg, "kernel "+path+": ")
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not contain %q", msg, tc.want)
			}
		})
	}
}

// linuxCmdline boots the Linux test kernel with no crutch for its clock or
// timers. With ACPI (the default) /init ends by powering off (ExitPowerOff);
// with NoACPI it restarts, and reboot=k makes that pulse the i8042 reset
// line, which ends the run with ExitReset.
const linuxCmdline = "console=ttyS0 reboot=k panic=-1"

// TestLinuxBoot boots the Linux test kernel (make kernel) with the Go /init
// (make initramfs) to userspace, for each image format, irqchip model and
// 1 or 2 vCPUs: /init must print "init: ready" (it runs), then "init: done
// ok" and power the machine off through ACPI (Linux's reboot(POWER_OFF),
// as poweroff -f makes it: S5 in the FADT's sleep control register), which
// ends Run with ExitPowerOff; and once with NoACPI, where /init restarts
// the machine instead and Run ends with a reset. Timer or
// interrupt trouble (a missing TSC-deadline bit, a lost IOAPIC route) shows
// up as a hang before /init, bounded here. It needs a KVM that can run
// Linux: hardware KVM, natively or in the nested-KVM box.
func TestLinuxBoot(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	kernels := []struct{ name, path string }{
		{"vmlinux", testenv.Kernel(t)},
		{"bzImage", testenv.BzImage(t)},
	}
	initrd := testenv.Initrd(t)
	type boot struct {
		kernel struct{ name, path string }
		chip   microvm.IRQChip
		cpus   int
		noACPI bool
	}
	var boots []boot
	for _, k := range kernels {
		for _, chip := range []microvm.IRQChip{microvm.IRQChipSplit, microvm.IRQChipKernel} {
			for _, cpus := range []int{1, 2} {
				boots = append(boots, boot{k, chip, cpus, false})
			}
		}
	}
	boots = append(boots, boot{kernels[0], microvm.IRQChipSplit, 2, true})
	for _, b := range boots {
		k, chip, cpus := b.kernel, b.chip, b.cpus
		name := fmt.Sprintf("%s/%s/cpus=%d", k.name, chip, cpus)
		wantKind, wantLine := microvm.ExitPowerOff, "reboot: Power down"
		if b.noACPI {
			name += "/acpi=off"
			wantKind, wantLine = microvm.ExitReset, "reboot: Restarting system"
		}
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			log, logged := logBuffer()
			log.SetLevel(logrus.WarnLevel)
			res, out, err := runGuest(t, microvm.Config{
				Kernel: k.path, Initrd: initrd, Cmdline: linuxCmdline,
				CPUs: cpus, IRQChip: chip, MemoryBytes: 256 << 20, NoACPI: b.noACPI, Log: log,
			}, 3*time.Minute)
			if err != nil || res.Kind != wantKind || res.Status != microvm.StatusOK {
				t.Fatalf("run ended with %v status %d, err %v; want %v from /init; log:\n%s\nconsole:\n%s", res.Kind, res.Status, err, wantKind, logged, out)
			}
			for _, want := range []string{"init: ready", "init: done ok", wantLine} {
				if !strings.Contains(out, want) {
					t.Errorf("console lacks %q:\n%s", want, out)
				}
			}
			if !b.noACPI {
				// Without tables an ACPI kernel rightly says it found no RSDP.
				checkACPIQuiet(t, out)
			}
			// Every vCPU came up (Linux counts them from the MADT, or without
			// ACPI from the MP table).
			if want := fmt.Sprintf("smp: Brought up 1 node, %d CPU", cpus); !strings.Contains(out, want) {
				t.Errorf("console lacks %q:\n%s", want, out)
			}
			t.Logf("/init ran and ended the machine (%v) %v after New", res.Kind, time.Since(start).Round(time.Millisecond))
		})
	}
}

// leaf1ECXBit returns a function that boots a tiny guest, with the given
// --cpu-hide features, that executes CPUID leaf 1 at CPL0 and reports bit
// `bit` of ECX as its debug-port status.
func leaf1ECXBit(t *testing.T, bit byte) func(hide []string) int {
	t.Helper()
	// mov eax,1; xor ecx,ecx; cpuid; mov eax,ecx; shr eax,bit; and al,1; out 0xf4,al
	prog := testenv.Program{0xb8, 1, 0, 0, 0, 0x31, 0xc9, 0x0f, 0xa2, 0x89, 0xc8, 0xc1, 0xe8, bit, 0x24, 0x01, 0xe6, 0xf4}.Halt()
	kernel := testenv.TinyGuest(t, prog)
	return func(hide []string) int {
		t.Helper()
		res, _, err := runGuest(t, microvm.Config{Kernel: kernel, MemoryBytes: 16 << 20, HideCPUFeatures: hide, Log: quietLog()}, 30*time.Second)
		if err != nil || res.Kind != microvm.ExitDebugPort {
			t.Fatalf("guest did not report: %+v, %v", res, err)
		}
		return res.Status
	}
}

// TestCPUHide: --cpu-hide takes a feature out of the CPUID the guest sees.
// The guest executes CPUID leaf 1 at CPL0 and reports ECX bit 13 (CX16, the
// feature a Linux guest on a PVM host needs hidden) through the debug port.
func TestCPUHide(t *testing.T) {
	testenv.RequireKVM(t)
	run := leaf1ECXBit(t, 13)
	if got := run([]string{"cx16"}); got != 0 {
		t.Errorf("with --cpu-hide cx16 the guest sees CX16 (CPUID.1:ECX[13] = %d)", got)
	}
	if got := run(nil); got != 1 {
		t.Logf("this host does not offer CX16 (CPUID.1:ECX[13] = %d), so hiding it changes nothing here", got)
	}
}

// TestTSCDeadlineAnnounced: where KVM emulates the TSC-deadline timer, the
// guest sees CPUID.1:ECX[24] (Linux on the split irqchip, which has no PIT
// to calibrate the LAPIC timer against, hangs without it), and --cpu-hide
// tsc_deadline_timer takes it away. Where KVM lacks it, the bit stays clear.
func TestTSCDeadlineAnnounced(t *testing.T) {
	testenv.RequireKVM(t)
	sys, err := kvm.Open()
	if err != nil {
		t.Fatal(err)
	}
	emulated := sys.CheckExtension(kvm.CapTSCDeadlineTimer) > 0
	sys.Close()
	run := leaf1ECXBit(t, 24)
	want := 0
	if emulated {
		want = 1
	}
	if got := run(nil); got != want {
		t.Errorf("guest sees TSC-deadline = %d; KVM_CAP_TSC_DEADLINE_TIMER present: %v", got, emulated)
	}
	if got := run([]string{"tsc_deadline_timer"}); got != 0 {
		t.Errorf("with --cpu-hide tsc_deadline_timer the guest still sees the bit")
	}
}
