package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
)

// TestExecErrors: what exec's own mistakes and failures say, and with which
// status (a usage error 2, microvm's or the VM's failure 125), each before
// anything is built or booted. One case per message.
func TestExecErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("not a kernel\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "nope")

	// Regression: --memory 3M complained about /bin/busybox (status 1),
	// because the guest image was built before the size was checked.
	t.Run("memory too small", func(t *testing.T) {
		wantError(t, microvm.StatusUsage, []string{"exec", "--kernel", garbage, "--busybox", missing, "--memory", "3M", "--", "true"},
			"memory 3M; microvm supports 8M..1T")
	})
	t.Run("tty without a terminal", func(t *testing.T) {
		wantError(t, microvm.StatusUsage, []string{"exec", "--kernel", garbage, "--busybox", missing, "-t", "--", "sh"},
			"-t: stdin is not a terminal")
		wantError(t, microvm.StatusUsage, []string{"exec", "--vm", "somevm", "-t", "--", "sh"},
			"-t: stdin is not a terminal")
		// docker's -it: -i is accepted (stdin is always streamed), -t checked.
		wantError(t, microvm.StatusUsage, []string{"exec", "--vm", "somevm", "-it", "--", "sh"},
			"-t: stdin is not a terminal")
	})
	t.Run("too many disks", func(t *testing.T) {
		args := []string{"exec", "--kernel", garbage, "--busybox", missing}
		for range 7 {
			args = append(args, "--disk", "path="+garbage)
		}
		wantError(t, microvm.StatusUsage, append(args, "--", "true"), "7 disks; at most 6")
	})
	// Regression: with the binary outside the checkout, the default
	// kernel's error named the path and nothing else.
	t.Run("default kernel missing", func(t *testing.T) {
		t.Setenv("MICROVM_KERNEL", "")
		wantError(t, clibase.StatusFailure, []string{"exec", "--busybox", missing, "--", "true"},
			"bzImage: no such file or directory (no --kernel and no $MICROVM_KERNEL, so this is the default: build it with make kernel, or give one)")
	})
	// Regression: a missing agent binary was "not an ELF executable".
	t.Run("agent missing", func(t *testing.T) {
		wantError(t, clibase.StatusFailure, []string{"exec", "--kernel", garbage, "--agent", missing, "--busybox", "", "--", "true"},
			"exec: guest image: agent: "+missing+": no such file or directory (the guest agent: make builds bin/microvm-agent; or give --agent)")
	})
	t.Run("kernel not a kernel", func(t *testing.T) {
		agentFile := filepath.Join(dir, "agent")
		if err := os.WriteFile(agentFile, []byte("\x7fELF not really"), 0o755); err != nil {
			t.Fatal(err)
		}
		// The agent is checked first (the image is built before the
		// VM): a file that is there but no ELF says that.
		wantError(t, clibase.StatusFailure, []string{"exec", "--kernel", garbage, "--agent", agentFile, "--busybox", "", "--", "true"},
			"agent: "+agentFile+": not an ELF executable")
	})
}

// TestStatuses: which errors exit with which status.
func TestStatuses(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{clibase.StatusError{Status: 7}, 7},
		{clibase.Usagef("bad flag"), microvm.StatusUsage},
		{microvm.ErrConfig, microvm.StatusUsage},
		{asFailure(errors.New("the VM ended")), clibase.StatusFailure},
		{asFailure(clibase.StatusError{Status: 3}), 3},
		{asFailure(clibase.Usagef("x")), microvm.StatusUsage},
		{errors.New("other"), microvm.StatusError},
	} {
		if got := clibase.ExitStatus(tc.err, nil); got != tc.want {
			t.Errorf("%v: status %d, want %d", tc.err, got, tc.want)
		}
	}
}
