package boxtest

import (
	"bufio"
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

// State is what a package's log says of one top-level test.
type State int

const (
	// NotStarted: no "=== RUN" line for the test.
	NotStarted State = iota
	// Running: started, with no result line (the binary or the box ended
	// first).
	Running
	Passed
	Failed
	Skipped
)

func (s State) String() string {
	return [...]string{"not started", "running", "passed", "failed", "skipped"}[s]
}

// TestLog is one top-level test's part of a go test -test.v log.
type TestLog struct {
	State State
	// Output is every line from its "=== RUN" to its result line, its
	// subtests' included (tests in the box run one after the other).
	Output []byte
	// TimedOut: the binary's -test.timeout panic named it as running.
	TimedOut bool
}

// Log is a parsed go test -test.v log.
type Log struct {
	Tests map[string]*TestLog
	// TimedOut: the binary panicked on -test.timeout.
	TimedOut bool
}

var (
	runLine    = regexp.MustCompile(`^=== RUN\s+([^/\s]+)$`)
	resultLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): ([^/\s]+) \(`)
	// The panic that -test.timeout raises, and its list of running
	// tests ("\t\tTestX (10m0s)" after "\trunning tests:", Go 1.21 and
	// later).
	timeoutPanic = regexp.MustCompile(`^panic: test timed out after `)
	runningHead  = regexp.MustCompile(`^\s*running tests:$`)
	runningEntry = regexp.MustCompile(`^\s+([^/\s]+)(/\S*)? \(\d`)
)

// ParseLog reads a go test -test.v log of tests run one after the other.
func ParseLog(b []byte) *Log {
	l := &Log{Tests: map[string]*TestLog{}}
	var cur *TestLog
	inRunning := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := runLine.FindStringSubmatch(line); m != nil {
			t := l.Tests[m[1]]
			if t == nil {
				t = &TestLog{}
				l.Tests[m[1]] = t
			}
			t.State = Running
			cur = t
		}
		if cur != nil {
			cur.Output = append(append(cur.Output, line...), '\n')
		}
		if m := resultLine.FindStringSubmatch(line); m != nil {
			if t := l.Tests[m[2]]; t != nil {
				t.State = map[string]State{"PASS": Passed, "FAIL": Failed, "SKIP": Skipped}[m[1]]
				if t == cur {
					cur = nil
				}
			}
		}
		switch {
		case timeoutPanic.MatchString(line):
			l.TimedOut = true
		case l.TimedOut && runningHead.MatchString(line):
			inRunning = true
		case inRunning:
			m := runningEntry.FindStringSubmatch(line)
			if m == nil {
				inRunning = false
				break
			}
			if t := l.Tests[m[1]]; t != nil {
				t.TimedOut = true
			}
		}
	}
	return l
}

// TripleFault is the signature of the box's known artefact
// (docs/testing.md): microvm's log line for an L2 guest's shutdown exit,
// whose registers are the reset values AMD SVM leaves.
var TripleFault = regexp.MustCompile(`guest triple fault \(KVM_EXIT_SHUTDOWN\).*these are the processor.s reset values`)

// L1Oops is the signature of the box's L1 kernel failing, in its console
// log: an oops, a general protection fault, a panic. The emulated L1's
// memory gets corrupted now and then under TCG (docs/testing.md), and a
// guest can hang or a test fail on that before L1 itself oopses.
var L1Oops = regexp.MustCompile(`BUG: kernel |BUG: unable to handle|general protection fault|Oops: |Kernel panic|kernel BUG at`)

// bootStall matches the line in which a Linux guest's agent never
// answered within minutes (Machine.WaitAgent's error) and which gives the
// vsock device's status byte as the guest's driver left it.
var bootStall = regexp.MustCompile(`did not answer on vsock port \d+ within (?:\d+h)?\d+m[0-9.]+s[^\n]*virtio devices: vsock=0x([0-9a-f]+)`)

// BootStall reports whether out has the signature of an L2 Linux that
// stopped while booting in the box (docs/testing.md): its agent never
// answered within minutes, and its vsock driver never reached DRIVER_OK
// (status bit 0x4), so the kernel stopped before its virtio drivers
// probed, with no oops or panic on its console. Seen once, in CI's box,
// as a test whose guest console ended 0.35 s into a quiet boot. The line
// also gives each vCPU's instruction pointer (symbolize with the guest
// kernel's vmlinux), the evidence for where the next one stopped.
func BootStall(out []byte) bool {
	for _, m := range bootStall.FindAllSubmatch(out, -1) {
		status, err := strconv.ParseUint(string(m[1]), 16, 8)
		const driverOK = 0x4
		if err == nil && status&driverOK == 0 {
			return true
		}
	}
	return false
}

// Reason says why a test is run again in a fresh box.
type Reason string

const (
	// ReasonTripleFault: it failed, and its output has TripleFault.
	ReasonTripleFault Reason = "triple-fault"
	// ReasonTimedOut: it was running when -test.timeout ended the binary.
	ReasonTimedOut Reason = "timed-out"
	// ReasonBoxFailed: the box itself failed (its timeout, or the L1
	// kernel gave no status) before the test passed.
	ReasonBoxFailed Reason = "box-failed"
	// ReasonNotRun: an earlier test's timeout or the box's failure ended
	// the run before this test started.
	ReasonNotRun Reason = "not-run"
	// ReasonL1Oops: it failed in a box whose L1 kernel oopsed (L1Oops
	// in the console log).
	ReasonL1Oops Reason = "l1-oops"
	// ReasonBootStall: it failed, and its output has BootStall's
	// signature.
	ReasonBootStall Reason = "boot-stall"
)

// Verdict sorts one package run's queued tests.
type Verdict struct {
	Passed []string
	// Rerun are the tests to run again, with why.
	Rerun map[string]Reason
	// Failed are real failures, with a one-line why.
	Failed map[string]string
}

// testError is a line t.Error or t.Fatal wrote: "    file_test.go:123: why".
var testError = regexp.MustCompile(`^\s+\S+_test\.go:\d+: \S.*$`)

// firstErrors are the first few failure messages of a test's output, for
// the one-line why of a real failure: make test's summary (all CI shows of
// a long log) then says what went wrong, not only that it did.
func firstErrors(out []byte) string {
	const maxLines, maxLen = 3, 240
	var msgs []string
	for _, l := range strings.Split(string(out), "\n") {
		if !testError.MatchString(l) {
			continue
		}
		l = strings.TrimSpace(l)
		if len(l) > maxLen {
			l = l[:maxLen] + "..."
		}
		msgs = append(msgs, l)
		if len(msgs) == maxLines {
			break
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return ": " + strings.Join(msgs, " | ")
}

// Judge sorts tests after a package's run: status is the test binary's
// exit status, boxFailed says the box itself failed (status is then
// meaningless), l1Oops that the box's L1 kernel oopsed. Only the box's
// artefacts are rerun: a triple fault in a failed test's output, any
// failure in a box whose L1 oopsed, a Linux guest that stopped while
// booting (BootStall), a test -test.timeout caught running, a
// box that died under the tests, and the tests those kept from running. A
// product bug that breaks L1 fails again in every fresh box.
func Judge(tests []string, l *Log, status int, boxFailed, l1Oops bool) Verdict {
	v := Verdict{Rerun: map[string]Reason{}, Failed: map[string]string{}}
	for _, name := range tests {
		t := l.Tests[name]
		if t == nil {
			t = &TestLog{}
		}
		switch {
		case t.State == Passed || t.State == Skipped:
			// A test that skips in the box is test-summary's to judge:
			// it finds no record of it there.
			v.Passed = append(v.Passed, name)
		case t.State == Failed && TripleFault.Match(t.Output):
			v.Rerun[name] = ReasonTripleFault
		case t.State == Failed && l1Oops:
			v.Rerun[name] = ReasonL1Oops
		case t.State == Failed && BootStall(t.Output):
			v.Rerun[name] = ReasonBootStall
		case t.State == Failed:
			v.Failed[name] = "failed" + firstErrors(t.Output)
		case t.TimedOut || (t.State == Running && l.TimedOut):
			v.Rerun[name] = ReasonTimedOut
		case t.State == Running && boxFailed:
			v.Rerun[name] = ReasonBoxFailed
		case t.State == NotStarted && (boxFailed || l.TimedOut):
			v.Rerun[name] = ReasonNotRun
		case t.State == Running:
			v.Failed[name] = "the test binary ended while it ran (a crash?)"
		case status == 0:
			v.Failed[name] = "did not run, though the binary passed"
		default:
			v.Failed[name] = "did not run: the test binary failed before it started"
		}
	}
	return v
}
