package namedvm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/microvm/microvm/internal/vms"
)

// DetachFDEnv is set, in the environment of a detached VM's process, to
// the descriptor on which it tells the `run --detach` that started it
// (StartDetached) how the start went: its ready line.
//
// The ready line is "ready" once the VM runs (and its agent answers and
// Launch.Setup ran, when it has them), "error STATUS: MESSAGE" when the
// setup failed (a SetupError), or "error: MESSAGE" (ReadyError).
const DetachFDEnv = "MICROVM_DETACH_FD"

// detachGrace is how much longer than its caller's wait StartDetached
// waits for the ready line (a variable so that tests can shorten it).
var detachGrace = 30 * time.Second

// readyLineMax bounds what StartDetached reads of the ready line: room
// for a failed setup's log tail (dockervm.Error: 20 lines of at most 256
// bytes).
const readyLineMax = 16 << 10

// IsDetached reports whether this process is a detached VM's process
// that has not yet taken its ready descriptor (TakeReady).
func IsDetached() bool { return os.Getenv(DetachFDEnv) != "" }

// TakeReady is, in a detached VM's process, the descriptor DetachFDEnv
// names, for Options.Ready (nil when it names none). It unsets
// DetachFDEnv: the descriptor is taken once.
func TakeReady() *os.File {
	fd, err := strconv.Atoi(os.Getenv(DetachFDEnv))
	os.Unsetenv(DetachFDEnv)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), "detach")
}

// ReadyError is the line a detached VM's process writes on Options.Ready
// for err, without its newline.
func ReadyError(err error) string {
	var se SetupError
	if errors.As(err, &se) {
		return fmt.Sprintf("error %d: %v", se.Status, err)
	}
	return "error: " + err.Error()
}

// StartDetached starts this command again (os.Args, through
// os.Executable) as a process of its own, in a session of its own with
// its standard streams on /dev/null and its ready line on descriptor 3
// (DetachFDEnv), and returns once that process says the VM runs (nil),
// or why it did not:
//
//   - a SetupError with the setup's status and message for "error
//     STATUS: MESSAGE" (run --docker's failed start);
//   - a FailedError for "error: MESSAGE", for a process that ended without
//     saying either, and for one that said nothing in time (which is
//     killed);
//   - any other error when the process could not be started.
//
// It waits 30 s more than wait, the agent's and the setup's time. name,
// the VM's, names its diagnostics file in the errors.
func StartDetached(name string, wait time.Duration) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		w.Close()
		return err
	}
	defer null.Close()
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), DetachFDEnv+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("run --detach: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // reaps it if it ends while we wait
	line := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(r, readyLineMax))
		line <- strings.TrimSpace(string(b))
	}()
	limit := detachGrace + wait
	select {
	case l := <-line:
		if said, err := parseReadyLine(l); said {
			if err == nil {
				_ = cmd.Process.Release()
			}
			return err
		}
		err := <-done
		return FailedError{fmt.Errorf("VM %s: its process ended before the VM ran (%v; %s)", name, err, logHint(name))}
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		return FailedError{fmt.Errorf("VM %s: not running after %v; stopped it (microvm logs %s; %s)", name, limit, name, logHint(name))}
	}
}

// parseReadyLine reads a ready line (without its newline): said is false
// for a line that is none of the three, else err is nil for "ready", a
// SetupError for "error STATUS: MESSAGE" and a FailedError for "error:
// MESSAGE".
func parseReadyLine(l string) (said bool, err error) {
	if l == "ready" {
		return true, nil
	}
	if msg, ok := strings.CutPrefix(l, "error: "); ok {
		return true, FailedError{errors.New(msg)}
	}
	if status, msg, ok := setupFailure(l); ok {
		return true, SetupError{Status: status, Err: errors.New(msg)}
	}
	return false, nil
}

// setupFailure reads the line ReadyError writes for a failed setup,
// "error STATUS: MESSAGE".
func setupFailure(l string) (status int, msg string, ok bool) {
	rest, ok := strings.CutPrefix(l, "error ")
	if !ok {
		return 0, "", false
	}
	num, msg, ok := strings.Cut(rest, ": ")
	status, err := strconv.Atoi(num)
	if !ok || err != nil || status <= 0 || status > 255 {
		return 0, "", false
	}
	return status, msg, true
}

// logHint names a detached VM's diagnostics file.
func logHint(name string) string {
	return "its diagnostics: " + vms.StateDir() + "/vms/" + name + "/" + vms.LogFile
}
