package boxtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

const tfLine = `        time="21:17:22.767" level=error msg="guest triple fault (KVM_EXIT_SHUTDOWN): vCPU 0 rip=0xfff0 (these are the processor's reset values, not the faulting state)"`

func TestParseLogAndJudge(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tests     []string
		log       string
		status    int
		boxFailed bool
		l1Oops    bool
		want      Verdict
	}{{
		name:  "all pass",
		tests: []string{"TestA", "TestB"},
		log: "=== RUN   TestA\n--- PASS: TestA (1.00s)\n=== RUN   TestB\n=== RUN   TestB/x\n" +
			"--- PASS: TestB (2.00s)\n    --- PASS: TestB/x (1.00s)\nPASS\n",
		want: Verdict{Passed: []string{"TestA", "TestB"}},
	}, {
		name: "triple fault in one test, a real failure in another",
		log: "=== RUN   TestA\n=== RUN   TestA/write\n    disk_test.go:146: status 1\n" + tfLine + "\n" +
			"--- FAIL: TestA (41.54s)\n    --- FAIL: TestA/write (27.63s)\n" +
			"=== RUN   TestB\n    x_test.go:1: wrong answer\n--- FAIL: TestB (1.00s)\n" +
			"=== RUN   TestC\n--- PASS: TestC (1.00s)\nFAIL\n",
		status: 1,
		want: Verdict{Passed: []string{"TestC"}, Rerun: map[string]Reason{"TestA": ReasonTripleFault},
			Failed: map[string]string{"TestB": "failed: x_test.go:1: wrong answer"}},
	}, {
		// The triple fault of one test does not excuse another's failure.
		name:  "triple fault output belongs to its test",
		tests: []string{"TestA", "TestB"},
		log: "=== RUN   TestA\n" + tfLine + "\n--- PASS: TestA (1.00s)\n" +
			"=== RUN   TestB\n--- FAIL: TestB (1.00s)\nFAIL\n",
		status: 1,
		want:   Verdict{Passed: []string{"TestA"}, Failed: map[string]string{"TestB": "failed"}},
	}, {
		name: "test timeout",
		log: "=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\n=== RUN   TestB/sub\n" +
			"panic: test timed out after 1s\n\trunning tests:\n\t\tTestB (1s)\n\t\tTestB/sub (1s)\n\n" +
			"goroutine 5 [running]:\ntesting.(*M).startAlarm.func1()\n",
		status: 2,
		want: Verdict{Passed: []string{"TestA"},
			Rerun: map[string]Reason{"TestB": ReasonTimedOut, "TestC": ReasonNotRun}},
	}, {
		name:      "box died",
		log:       "=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\n=== RUN   TestB/kill_-9\nkvmbox: timed out after 45m0s\n",
		status:    ExitBoxFailure,
		boxFailed: true,
		want: Verdict{Passed: []string{"TestA"},
			Rerun: map[string]Reason{"TestB": ReasonBoxFailed, "TestC": ReasonNotRun}},
	}, {
		// fresh43: a Linux guest hung in a box whose L1 oopsed later.
		name: "failures in a box whose L1 oopsed",
		log: "=== RUN   TestA\n    a_test.go:1: guest still running after 3m0s\n--- FAIL: TestA (180.00s)\n" +
			"=== RUN   TestB\n--- PASS: TestB (1.00s)\n=== RUN   TestC\n    c_test.go:1: wrong\n--- FAIL: TestC (1.00s)\nFAIL\n",
		status: 1,
		l1Oops: true,
		want: Verdict{Passed: []string{"TestB"},
			Rerun: map[string]Reason{"TestA": ReasonL1Oops, "TestC": ReasonL1Oops}},
	}, {
		// A Linux guest that stopped while booting: its vsock driver
		// never reached DRIVER_OK. TestB's agent did not answer within
		// a deliberately short --boot-timeout and TestC's guest had a
		// running vsock driver: both stand as failures.
		name: "boot stall",
		log: "=== RUN   TestA\n=== RUN   TestA/cat\n    exec_test.go:71: status 125; stderr \"microvm: exec: agentapi: connect: the guest agent " +
			"did not answer on vsock port 1024 within 2m0s (last try: ...) [vsock device: 0 connections opened] " +
			"[virtio devices: vsock=0x3 rng=0x3; vCPU 0 rip=0xffffffff81c0d4e2 rsp=0x0 rflags=0x246 (IF) cr3=0x1000 halted]\"\n" +
			"--- FAIL: TestA (121.00s)\n    --- FAIL: TestA/cat (120.96s)\n" +
			"=== RUN   TestB\n    b_test.go:1: agent did not answer on vsock port 1024 within 100ms [virtio devices: vsock=0x0]\n--- FAIL: TestB (1.00s)\n" +
			"=== RUN   TestC\n    c_test.go:1: agent did not answer on vsock port 1024 within 2m0s [virtio devices: vsock=0xf]\n--- FAIL: TestC (121.00s)\nFAIL\n",
		status: 1,
		want: Verdict{Rerun: map[string]Reason{"TestA": ReasonBootStall}, Failed: map[string]string{
			"TestB": "failed: b_test.go:1: agent did not answer on vsock port 1024 within 100ms [virtio devices: vsock=0x0]",
			"TestC": "failed: c_test.go:1: agent did not answer on vsock port 1024 within 2m0s [virtio devices: vsock=0xf]"}},
	}, {
		name:   "binary crashed",
		log:    "=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\nfatal error: concurrent map writes\n",
		status: 2,
		want: Verdict{Passed: []string{"TestA"}, Failed: map[string]string{
			"TestB": "the test binary ended while it ran (a crash?)",
			"TestC": "did not run: the test binary failed before it started"}},
	}, {
		name:   "binary passed without running a test",
		log:    "testing: warning: no tests to run\nPASS\n",
		status: 0,
		want: Verdict{Failed: map[string]string{
			"TestA": "did not run, though the binary passed", "TestB": "did not run, though the binary passed",
			"TestC": "did not run, though the binary passed"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tests := tc.tests
			if tests == nil {
				tests = []string{"TestA", "TestB", "TestC"}
			}
			got := Judge(tests, ParseLog([]byte(tc.log)), tc.status, tc.boxFailed, tc.l1Oops)
			if tc.want.Rerun == nil {
				tc.want.Rerun = map[string]Reason{}
			}
			if tc.want.Failed == nil {
				tc.want.Failed = map[string]string{}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Judge:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReadQueue(t *testing.T) {
	pkgs, err := ReadQueue(strings.NewReader("cmd/microvm TestExec\n. TestNetLinux alone\n. TestLinuxBoot\ncmd/microvm TestDiskRoot\n" +
		"cmd/microvm TestExec\n. TestB alone\n. TestNetLinux alone\ncmd/microvm TestC\ncmd/microvm TestC alone\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Package{
		{Dir: ".", Tests: []string{"TestLinuxBoot"}},
		{Dir: ".", Tests: []string{"TestB"}, Alone: true},
		{Dir: ".", Tests: []string{"TestNetLinux"}, Alone: true},
		{Dir: "cmd/microvm", Tests: []string{"TestDiskRoot", "TestExec"}},
		{Dir: "cmd/microvm", Tests: []string{"TestC"}, Alone: true},
	}
	if !reflect.DeepEqual(pkgs, want) {
		t.Errorf("got %+v, want %+v", pkgs, want)
	}
	for _, bad := range []string{"cmd TestA extra", "cmd TestA alone extra", "cmd Test-A", "/abs TestA", "../up TestA", "cmd notATest", "cmd Test'$(x)"} {
		if _, err := ReadQueue(strings.NewReader(bad + "\n")); err == nil {
			t.Errorf("ReadQueue(%q) took it", bad)
		}
	}
}

// fakeBox writes a stand-in for scripts/kvmbox: it runs the command on the
// host, and a test "binary" that prints a go test log from a script file
// per round, so Run's rounds can be driven without a box.
func fakeBox(t *testing.T, dir string) string {
	t.Helper()
	box := filepath.Join(dir, "fakebox")
	// --timeout D --console-log F [--quiet-timeout Q] -- sh -c SCRIPT:
	// prints "fakebox: FLAGS" and the script, exits 125 when the command
	// prints BOXDIE (a box that died under it).
	script := `#!/bin/sh
flags=
while [ "$1" != "--" ]; do
	[ "$1" = --console-log ] && echo "L1 console of a fake box" >"$2"
	case "$1" in --timeout|--quiet-timeout) flags="$flags $1 $2";; esac
	shift
done
echo "fakebox:$flags"
echo "fakebox: $4"
shift
out=$("$@" 2>&1); st=$?
printf '%s\n' "$out"
case "$out" in *BOXDIE*) echo "kvmbox: timed out after 1s"; exit 125;; esac
exit $st
`
	if err := os.WriteFile(box, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return box
}

// fakeBuild makes test binaries whose nth run (counted in a file) prints
// logs[n] and exits with the status in its last line ("exit N").
func fakeBuild(t *testing.T, dir string, logs map[string][]string) func(context.Context, string, string) error {
	return func(_ context.Context, pkg, bin string) error {
		var b strings.Builder
		fmt.Fprintf(&b, "#!/bin/sh\nn=$(cat %q 2>/dev/null || echo 0); echo $((n+1)) >%q\ncase $n in\n", bin+".count", bin+".count")
		for i, l := range logs[pkg] {
			body, status, _ := strings.Cut(l, "\nexit ")
			fmt.Fprintf(&b, "%d) cat <<'EOF'\n%s\nEOF\nexit %s;;\n", i, body, status)
		}
		b.WriteString("esac\nexit 99\n")
		return os.WriteFile(bin, []byte(b.String()), 0o755)
	}
}

func TestRunReruns(t *testing.T) {
	root := t.TempDir()
	rec := filepath.Join(root, "build", "rec")
	if err := os.MkdirAll(rec, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	logs := map[string][]string{
		// Package a: a triple fault, then a pass on the rerun.
		"a": {"=== RUN   TestX\n" + tfLine + "\n--- FAIL: TestX (1.00s)\n=== RUN   TestY\n--- PASS: TestY (1.00s)\nFAIL\nexit 1",
			"=== RUN   TestX\n--- PASS: TestX (1.00s)\nPASS\nexit 0"},
		// Package b: the box dies in TestP twice, then TestP fails for
		// real on the last rerun.
		"b": {"=== RUN   TestP\nBOXDIE\nexit 0",
			"=== RUN   TestP\nBOXDIE\nexit 0",
			"=== RUN   TestP\n    p_test.go:1: broken\n--- FAIL: TestP (1.00s)\n=== RUN   TestQ\n--- PASS: TestQ (1.00s)\nFAIL\nexit 1"},
	}
	var out bytes.Buffer
	c := Config{Root: root, Record: rec, Kvmbox: []string{fakeBox(t, root)}, BoxTimeout: time.Minute,
		TestTimeout: 30 * time.Second, Budget: time.Hour, Reruns: 2, Out: &out, Build: fakeBuild(t, root, logs)}
	err := Run(context.Background(), c, []Package{{Dir: "a", Tests: []string{"TestX", "TestY"}}, {Dir: "b", Tests: []string{"TestP", "TestQ"}}})
	if err == nil || !strings.Contains(err.Error(), "b TestP: failed") || strings.Contains(err.Error(), "TestX") {
		t.Errorf("Run: %v; want only b TestP failed\n%s", err, out.String())
	}
	reruns, _ := os.ReadFile(filepath.Join(rec, "reruns.txt"))
	want := "a TestX triple-fault\nb TestP box-failed\nb TestQ not-run\nb TestP box-failed\nb TestQ not-run\n"
	if string(reruns) != want {
		t.Errorf("reruns.txt:\n%s\nwant:\n%s", reruns, want)
	}
	// One line a box, for make test's table (scripts/test-times): box,
	// rerun round, seconds, status, tests.
	boxes, _ := os.ReadFile(filepath.Join(rec, "boxes.txt"))
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(boxes)), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			t.Fatalf("boxes.txt line %q: want BOX ROUND SECONDS STATUS TEST...", l)
		}
		got = append(got, strings.Join(append(f[:2:2], f[3:]...), " "))
	}
	wantBoxes := []string{"a 0 1 TestX TestY", "b 0 125 TestP TestQ", "a 1 0 TestX", "b 1 125 TestP TestQ", "b 2 1 TestP TestQ"}
	if strings.Join(got, "|") != strings.Join(wantBoxes, "|") {
		t.Errorf("boxes.txt (seconds left out):\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantBoxes, "\n"))
	}
	if !strings.Contains(out.String(), "L1 console of a fake box") {
		t.Errorf("a dead box's console was not shown:\n%s", out.String())
	}
	for _, f := range []string{"box-a.log", "box-a.rerun1.log", "box-b.rerun2.log"} {
		if _, err := os.Stat(filepath.Join(rec, f)); err != nil {
			t.Errorf("no %s: %v", f, err)
		}
	}
}

func TestRunBudget(t *testing.T) {
	root := t.TempDir()
	rec := filepath.Join(root, "rec")
	if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(rec, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := map[string][]string{"a": {"=== RUN   TestX\nBOXDIE\nexit 0", "=== RUN   TestX\n--- PASS: TestX (1.00s)\nexit 0"}}
	// Less than a quarter of the box timeout left for a rerun: none starts.
	var out bytes.Buffer
	c := Config{Root: root, Record: rec, Kvmbox: []string{fakeBox(t, root)}, BoxTimeout: time.Hour,
		TestTimeout: 40 * time.Minute, Budget: 10 * time.Minute, QuietTimeout: 7 * time.Minute, Reruns: 2, Out: &out, Build: fakeBuild(t, root, logs)}
	err := Run(context.Background(), c, []Package{{Dir: "a", Tests: []string{"TestX"}}})
	if err == nil || !strings.Contains(err.Error(), "budget") {
		t.Errorf("Run: %v; want the budget to stop the rerun\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "fakebox: --timeout 1h0m0s --quiet-timeout 7m0s\n") ||
		!strings.Contains(out.String(), "-test.timeout 40m0s") {
		t.Errorf("the first box did not get the full timeouts and the quiet timeout:\n%s", out.String())
	}

	// Most of a box timeout left: the rerun runs in what is left, its test
	// timeout shrunk in proportion (Run builds the binary afresh).
	out.Reset()
	c.Budget = 45 * time.Minute
	if err := Run(context.Background(), c, []Package{{Dir: "a", Tests: []string{"TestX"}}}); err != nil {
		t.Errorf("Run: %v; want the shortened rerun to pass\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "what the stage's budget has left") || !regexp.MustCompile(`fakebox: --timeout 44m5\ds --quiet-timeout 7m0s\n`).MatchString(out.String()) ||
		!regexp.MustCompile(`-test\.timeout (29m5\ds|30m0s)\n`).MatchString(out.String()) {
		t.Errorf("the rerun did not get the budget's remainder (about 45m, test timeout about 30m):\n%s", out.String())
	}
}

// TestLimits: first-round boxes keep the full timeouts while the budget
// lasts; reruns get what is left, scaled, down to a quarter of BoxTimeout.
func TestLimits(t *testing.T) {
	c := Config{BoxTimeout: 16 * time.Minute, TestTimeout: 12 * time.Minute, Budget: 40 * time.Minute}
	for _, tc := range []struct {
		round   int
		elapsed time.Duration
		want    boxLimits
		ok      bool
	}{
		{0, 0, boxLimits{16 * time.Minute, 12 * time.Minute}, true},
		{0, 39 * time.Minute, boxLimits{16 * time.Minute, 12 * time.Minute}, true},
		{0, 40 * time.Minute, boxLimits{}, false},
		{1, 20 * time.Minute, boxLimits{16 * time.Minute, 12 * time.Minute}, true},
		{1, 32 * time.Minute, boxLimits{8 * time.Minute, 6 * time.Minute}, true},
		{2, 36 * time.Minute, boxLimits{4 * time.Minute, 3 * time.Minute}, true},
		{1, 36*time.Minute + time.Second, boxLimits{}, false},
		{1, 41 * time.Minute, boxLimits{}, false},
	} {
		got, ok := c.limits(tc.round, tc.elapsed)
		if got != tc.want || ok != tc.ok {
			t.Errorf("limits(round %d, %v) = %+v, %v; want %+v, %v", tc.round, tc.elapsed, got, ok, tc.want, tc.ok)
		}
	}
}

// TestRunAlone: a test queued alone gets a box of its own, named after it,
// with the package's binary built once, and its rerun stays alone.
func TestRunAlone(t *testing.T) {
	root := t.TempDir()
	rec := filepath.Join(root, "rec")
	for _, d := range []string{rec, filepath.Join(root, "a")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	builds := 0
	build := func(_ context.Context, pkg, bin string) error {
		builds++
		// Prints the -test.run it was given; TestL triple-faults on
		// its first run.
		script := `#!/bin/sh
echo "args: $*"
n=$(cat "$0.count" 2>/dev/null || echo 0); echo $((n+1)) >"$0.count"
case "$2" in
"^(TestL)\$")
	echo "=== RUN   TestL"
	if [ "$n" = 1 ]; then
		cat <<'TF'
` + tfLine + `
TF
		echo "--- FAIL: TestL (1.00s)"; exit 1
	fi
	echo "--- PASS: TestL (1.00s)";;
*)	echo "=== RUN   TestX"; echo "--- PASS: TestX (1.00s)";;
esac
`
		return os.WriteFile(bin, []byte(script), 0o755)
	}
	var out bytes.Buffer
	c := Config{Root: root, Record: rec, Kvmbox: []string{fakeBox(t, root)}, BoxTimeout: time.Minute,
		TestTimeout: 30 * time.Second, Budget: time.Hour, Reruns: 2, Out: &out, Build: build}
	pkgs := []Package{{Dir: "a", Tests: []string{"TestX"}}, {Dir: "a", Tests: []string{"TestL"}, Alone: true}}
	if err := Run(context.Background(), c, pkgs); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if builds != 1 {
		t.Errorf("package a built %d times, want once", builds)
	}
	for f, want := range map[string]string{
		"box-a.log":              "args: -test.run ^(TestX)$",
		"box-a.TestL.log":        "args: -test.run ^(TestL)$",
		"box-a.TestL.rerun1.log": "args: -test.run ^(TestL)$",
	} {
		b, err := os.ReadFile(filepath.Join(rec, f))
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s: %v; want it to hold %q:\n%s", f, err, want, b)
		}
	}
	if _, err := os.Stat(filepath.Join(rec, "box-a.rerun1.log")); err == nil {
		t.Errorf("package a's shared box was rerun; only TestL's should be")
	}
	if reruns, _ := os.ReadFile(filepath.Join(rec, "reruns.txt")); string(reruns) != "a TestL triple-fault\n" {
		t.Errorf("reruns.txt = %q", reruns)
	}
}

// TestL1Oops: the L1 console lines of fresh41's and fresh43's crashes
// match; the box's everyday chatter and warnings do not.
func TestL1Oops(t *testing.T) {
	for line, want := range map[string]bool{
		"[  271.947640] general protection fault: 0000 [#1] SMP":                                   true,
		"[  106.267329] BUG: unable to handle page fault for address: ffffffff81e00000":            true,
		"[   11.455714] BUG: kernel NULL pointer dereference, address: 0000000000000350":           true,
		"[  106.270270] Oops: 0000 [#1] SMP":                                                       true,
		"[  107.620711] Kernel panic - not syncing: Fatal exception":                               true,
		"[   4.822106] kvm [35]: vcpu0, guest rIP: 0xffffffff81002c23 Unhandled WRMSR(0xc0010007)": false,
		"[  300.000000] watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [qemu:99]":               false,
		"[  400.000000] INFO: task cli.test:61 blocked for more than 120 seconds.":                 false,
		"kvmbox-init: kvmbox init starting":                                                        false,
	} {
		if got := L1Oops.MatchString(line); got != want {
			t.Errorf("L1Oops.MatchString(%q) = %v, want %v", line, got, want)
		}
	}
}

// TestRunParallel: with Parallel 2 two boxes run at once (package a's
// test passes only if b's box starts while a's is running), a rerun still
// follows its box's artefacts, and each box's output reaches Out whole.
func TestRunParallel(t *testing.T) {
	root := t.TempDir()
	rec := filepath.Join(root, "build", "rec")
	for _, d := range []string{rec, filepath.Join(root, "a"), filepath.Join(root, "b")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(root, "b-started")
	build := func(_ context.Context, pkg, bin string) error {
		var script string
		switch pkg {
		case "a": // waits at most 20 s for b's box to start
			script = fmt.Sprintf(`#!/bin/sh
echo "=== RUN   TestA"
i=0
while [ ! -e %q ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
if [ -e %q ]; then echo "--- PASS: TestA (0.00s)"; exit 0; fi
echo "    a_test.go:1: b's box never ran beside this one"
echo "--- FAIL: TestA (20.00s)"; exit 1
`, marker, marker)
		case "b": // marks its start; its first run's box dies (a rerun)
			script = fmt.Sprintf(`#!/bin/sh
touch %q
n=$(cat %q 2>/dev/null || echo 0); echo $((n+1)) >%q
echo "=== RUN   TestB"
if [ "$n" = 0 ]; then echo BOXDIE; exit 0; fi
echo "--- PASS: TestB (0.00s)"
`, marker, bin+".count", bin+".count")
		}
		return os.WriteFile(bin, []byte(script), 0o755)
	}
	var out bytes.Buffer
	c := Config{Root: root, Record: rec, Kvmbox: []string{fakeBox(t, root)}, BoxTimeout: time.Minute,
		TestTimeout: 30 * time.Second, Budget: time.Hour, Reruns: 1, Parallel: 2, Out: &out, Build: build}
	if err := Run(context.Background(), c, []Package{{Dir: "a", Tests: []string{"TestA"}}, {Dir: "b", Tests: []string{"TestB"}}}); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if reruns, _ := os.ReadFile(filepath.Join(rec, "reruns.txt")); string(reruns) != "b TestB box-failed\n" {
		t.Errorf("reruns.txt = %q, want b TestB box-failed", reruns)
	}
	// Each box's output is one block: its RUN line right after the header.
	for _, box := range []string{"a", "b"} {
		hdr := "box-test: " + box + ": the box's output:\n"
		i := strings.Index(out.String(), hdr)
		if i < 0 {
			t.Fatalf("no output block for box %s:\n%s", box, out.String())
		}
		rest := out.String()[i+len(hdr):]
		if !strings.Contains(rest[:strings.Index(rest, "=== RUN")+len("=== RUN   Test")+1], "fakebox:") {
			t.Errorf("box %s's block does not start with its own output:\n%s", box, rest)
		}
	}
}

// TestStallEvidence symbolizes a boot stall's instruction pointers with an
// ELF file's function symbols: a small Go program's, built here (go
// build keeps its symbol table), standing in for the guest kernel's
// vmlinux.
func TestStallEvidence(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() { println(\"hi\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module stall\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "stall")
	build := exec.Command("go", "build", "-o", exe, ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	k, err := loadKernelSymbols(exe)
	if err != nil {
		t.Fatal(err)
	}
	const fn = "main.main"
	var addr uint64
	for i, n := range k.names {
		if n == fn {
			addr = k.addrs[i]
		}
	}
	if addr == 0 {
		t.Fatalf("%s not among %d function symbols of %s", fn, len(k.names), exe)
	}
	out := fmt.Sprintf("    exec_test.go:71: status 125; stderr \"agent did not answer on vsock port 1024 within 2m0s [x] "+
		"[virtio devices: vsock=0x0; vCPU 0 rip=%#x rsp=0x1 rflags=0x246 (IF) cr3=0x1 halted; vCPU 1 rip=0x10 rsp=0x1 rflags=0x2 (IF clear) cr3=0x1 runnable]\"\n", addr+4)
	want := "vCPU 0 " + fn + "+0x4 (halted); vCPU 1 0x10 (runnable)"
	if got := StallEvidence([]byte(out), exe); got != want {
		t.Errorf("StallEvidence = %q, want %q", got, want)
	}
	if got := StallEvidence([]byte("no stall here\n"), exe); got != "" {
		t.Errorf("StallEvidence of a log without a stall = %q", got)
	}
	if got := StallEvidence([]byte(out), filepath.Join(dir, "missing")); got != "" {
		t.Errorf("StallEvidence without a vmlinux = %q", got)
	}
}

// TestRunBuildsWhileBoxesRun: the first box starts once its own binary is
// built, not after every package's; a build that fails fails the stage
// with its output.
func TestRunBuildsWhileBoxesRun(t *testing.T) {
	root := t.TempDir()
	rec := filepath.Join(root, "rec")
	for _, d := range []string{"a", "b", "c", "rec"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pass := "=== RUN   TestX\n--- PASS: TestX (1.00s)\nPASS\nexit 0"
	logs := map[string][]string{"a": {pass}, "b": {pass}, "c": {pass}}
	fake := fakeBuild(t, root, logs)
	var aBin string
	build := func(ctx context.Context, pkg, bin string) error {
		switch pkg {
		case "a":
			aBin = bin
		case "b":
			// b's build ends only after a's box ran its binary.
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if _, err := os.Stat(aBin + ".count"); err == nil {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("a's box did not run while b was built")
				}
			}
		case "c":
			return fmt.Errorf("exit status 1\n./c/c_test.go:1:1: broken")
		}
		return fake(ctx, pkg, bin)
	}
	var out bytes.Buffer
	c := Config{Root: root, Record: rec, Kvmbox: []string{fakeBox(t, root)}, BoxTimeout: time.Minute,
		TestTimeout: 30 * time.Second, Budget: time.Hour, Out: &out, Build: build}
	err := Run(context.Background(), c, []Package{{Dir: "a", Tests: []string{"TestX"}}, {Dir: "b", Tests: []string{"TestX"}}, {Dir: "c", Tests: []string{"TestX"}}})
	if err == nil || !strings.Contains(err.Error(), "go test -c ./c") || !strings.Contains(err.Error(), "c_test.go:1:1: broken") {
		t.Errorf("Run: %v; want c's build error with its output\n%s", err, out.String())
	}
	boxes, _ := os.ReadFile(filepath.Join(rec, "boxes.txt"))
	if got := strings.Fields(string(boxes)); len(got) < 10 || got[0] != "a" || got[5] != "b" {
		t.Errorf("boxes.txt:\n%s\nwant a's box, then b's", boxes)
	}
}
