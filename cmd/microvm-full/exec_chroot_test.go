package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestExecChroot runs `microvm exec --chroot DIR` as its own process (so
// the chroot and the seccomp filter apply) with a Linux guest: while the
// command runs, the process's root is DIR; the command's input, output and
// status travel through the in-process vsock dialer, which needs nothing
// in DIR; and exec has left nothing behind in DIR.
func TestExecChroot(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "chroot needs CAP_SYS_CHROOT: run as root")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	dir := jailDir(t)
	vm := exec.Command(testenv.Binary(t), "exec", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
		"--chroot", dir, "--timeout", "2m", "--", "sh", "-c", "echo started; read line; echo got $line; exit 3")
	var stderr bytes.Buffer
	vm.Stderr = &stderr
	stdin, err := vm.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := vm.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = vm.Process.Kill() }()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "started" {
		_ = vm.Process.Kill()
		_ = vm.Wait()
		t.Fatalf("first line %q, want \"started\"; stderr:\n%s", lines.Text(), &stderr)
	}
	// The command runs and waits for its input: exec is inside DIR now.
	root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", vm.Process.Pid))
	if err != nil || root != dir {
		t.Errorf("/proc/PID/root = %q, %v; want %q", root, err, dir)
	}
	if _, err := stdin.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	done := make(chan error, 1)
	go func() { done <- vm.Wait() }()
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("microvm exec did not exit; stderr:\n%s", &stderr)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 || strings.Join(rest, "\n") != "got hello" {
		t.Errorf("exit %v, rest of stdout %q; want status 3 and \"got hello\"; stderr:\n%s", err, rest, &stderr)
	}
	// jailDir made run/; exec's own files must be gone.
	var left []string
	_ = filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil && p != dir && p != filepath.Join(dir, "run") {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("exec left %v in %s", left, dir)
	}
}
