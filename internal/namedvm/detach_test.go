package namedvm

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/dockervm"
)

// standInEnv, in the environment of this test binary started again by
// StartDetached (TestStartDetached), makes it a stand-in for a detached
// VM's process that does what the variable says (standIn) instead of
// running the tests.
const standInEnv = "NAMEDVM_TEST_STAND_IN"

func TestMain(m *testing.M) {
	if what := os.Getenv(standInEnv); what != "" && IsDetached() {
		os.Exit(standIn(what))
	}
	os.Exit(m.Run())
}

// standIn is a detached VM's process that says one kind of ready line,
// or none, and returns its exit status.
func standIn(what string) int {
	say := func(l string) {
		if f := TakeReady(); f != nil {
			fmt.Fprintln(f, l)
			f.Close()
		}
	}
	switch what {
	case "ready":
		say("ready")
	case "setup":
		say(ReadyError(SetupError{Status: dockervm.ExitStatus, Err: errors.New("VM d1: docker: the image has no dockerd")}))
		return dockervm.ExitStatus
	case "error":
		say(ReadyError(errors.New("boom")))
		return 1
	case "garbage":
		say("hello")
		return 3
	case "silent":
		return 3
	case "hang":
		time.Sleep(time.Minute)
	case "how":
		// What it was started with, on the line of a failure.
		stdio := ""
		for fd := 0; fd < 3; fd++ {
			l, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
			stdio += " " + l
		}
		sid, _ := unix.Getsid(0)
		f := TakeReady()
		if f == nil {
			return 2
		}
		fmt.Fprintf(f, "error: argv %q stdio%s session leader %v env unset %v\n",
			os.Args, stdio, sid == os.Getpid(), os.Getenv(DetachFDEnv) == "")
		f.Close()
		return 1
	}
	return 0
}

// describeErr is err's type and message, and a SetupError's status.
func describeErr(err error) string {
	switch e := err.(type) {
	case nil:
		return "nil"
	case SetupError:
		return fmt.Sprintf("SetupError{%d, %q}", e.Status, e.Err)
	case FailedError:
		return fmt.Sprintf("FailedError{%q}", e.Err)
	}
	return fmt.Sprintf("%T %q", err, err)
}

// TestParseReadyLine: StartDetached tells the three ready lines apart and
// takes anything else for no line at all.
func TestParseReadyLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		said bool
		want error
	}{
		{"ready", true, nil},
		{"error: boom", true, FailedError{errors.New("boom")}},
		{"error: 5: not a status", true, FailedError{errors.New("5: not a status")}},
		{"error: ", true, FailedError{errors.New("")}},
		{"error 122: VM d1: docker: no dockerd", true, SetupError{Status: 122, Err: errors.New("VM d1: docker: no dockerd")}},
		{"error 255: x", true, SetupError{Status: 255, Err: errors.New("x")}},
		{"error 1: ", true, SetupError{Status: 1, Err: errors.New("")}},
		{"", false, nil},
		{"hello", false, nil},
		{"ready?", false, nil},
		{"Ready", false, nil},
		{"error", false, nil},
		{"error:boom", false, nil},
		{"error 0: y", false, nil},
		{"error 256: y", false, nil},
		{"error -1: y", false, nil},
		{"error x: y", false, nil},
		{"error 122 y", false, nil},
	} {
		said, err := parseReadyLine(tc.line)
		if said != tc.said || describeErr(err) != describeErr(tc.want) {
			t.Errorf("parseReadyLine(%q) = %v, %s; want %v, %s", tc.line, said, describeErr(err), tc.said, describeErr(tc.want))
		}
	}
}

// TestSetupFailureLine: run --detach reads the status of a failed setup
// off the line its VM's process writes, and nothing else as one.
func TestSetupFailureLine(t *testing.T) {
	se := SetupError{Status: dockervm.ExitStatus, Err: errors.New("VM d1: docker: the image has no dockerd")}
	st, msg, ok := setupFailure(ReadyError(se))
	if !ok || st != 122 || msg != "VM d1: docker: the image has no dockerd" {
		t.Errorf("setupFailure(ReadyError(setup)) = %d, %q, %v", st, msg, ok)
	}
	for _, l := range []string{ReadyError(errors.New("boom")), "ready", "error x: y", "error 0: y", "error 300: y", "error 122 y"} {
		if st, msg, ok := setupFailure(l); ok {
			t.Errorf("setupFailure(%q) = %d, %q, true; want not a setup's failure", l, st, msg)
		}
	}
}

// TestReadyError: a setup's failure tells its status on the ready line,
// any other failure does not.
func TestReadyError(t *testing.T) {
	se := SetupError{Status: 122, Err: errors.New("VM v: docker: no dockerd")}
	if got, want := ReadyError(fmt.Errorf("wrapped: %w", se)), "error 122: wrapped: VM v: docker: no dockerd"; got != want {
		t.Errorf("ReadyError(setup) = %q, want %q", got, want)
	}
	if got, want := ReadyError(FailedError{errors.New("boom")}), "error: boom"; got != want {
		t.Errorf("ReadyError(other) = %q, want %q", got, want)
	}
}

// TestTakeReadyElsewhere: outside a detached VM's process TakeReady has
// no descriptor to give.
func TestTakeReadyElsewhere(t *testing.T) {
	t.Setenv(DetachFDEnv, "")
	if IsDetached() {
		t.Fatal("IsDetached with DetachFDEnv empty")
	}
	if f := TakeReady(); f != nil {
		t.Errorf("TakeReady = %v, want nil", f.Name())
	}
}

// TestStartDetached starts this test binary as the detached process, a
// stand-in (standIn) for each kind of ready line, and checks what
// StartDetached makes of it; no VM runs.
func TestStartDetached(t *testing.T) {
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	t.Setenv(DetachFDEnv, "") // this process is not one
	hint := "its diagnostics: " + state + "/vms/d1/microvm.log"
	grace := detachGrace
	t.Cleanup(func() { detachGrace = grace })
	detachGrace = 500 * time.Millisecond
	// Time enough for a stand-in to start on a busy machine; the one
	// that hangs has only the grace.
	const wait = 30 * time.Second

	for _, tc := range []struct {
		what string
		wait time.Duration
		want error
	}{
		{"ready", wait, nil},
		{"setup", wait, SetupError{Status: dockervm.ExitStatus, Err: errors.New("VM d1: docker: the image has no dockerd")}},
		{"error", wait, FailedError{errors.New("boom")}},
		{"garbage", wait, FailedError{errors.New("VM d1: its process ended before the VM ran (exit status 3; " + hint + ")")}},
		{"silent", wait, FailedError{errors.New("VM d1: its process ended before the VM ran (exit status 3; " + hint + ")")}},
		{"hang", 0, FailedError{errors.New("VM d1: not running after 500ms; stopped it (microvm logs d1; " + hint + ")")}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			t.Setenv(standInEnv, tc.what)
			err := StartDetached("d1", tc.wait)
			if got, want := describeErr(err), describeErr(tc.want); got != want {
				t.Errorf("StartDetached = %s\nwant %s", got, want)
			}
		})
	}

	// The process gets this one's argv, /dev/null for its standard
	// streams, a session of its own, and the descriptor once.
	t.Setenv(standInEnv, "how")
	err := StartDetached("d1", wait)
	var fe FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("StartDetached = %v, want the stand-in's FailedError", err)
	}
	want := fmt.Sprintf("argv %q stdio /dev/null /dev/null /dev/null session leader true env unset true", os.Args)
	if got := fe.Error(); got != want {
		t.Errorf("the stand-in said\n%s\nwant\n%s", got, want)
	}
}
