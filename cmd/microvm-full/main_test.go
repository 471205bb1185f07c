package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
)

// envAsCLI makes the test binary behave as the microvm command, so tests can
// run it as a child process (for signals and real exit statuses) without
// building bin/microvm first.
const envAsCLI = "MICROVM_TEST_AS_CLI"

// envSeccompForbidden makes the child acting as the CLI make a forbidden
// system call right after installing the seccomp filter
// (TestSeccompForbiddenCall).
const envSeccompForbidden = "MICROVM_TEST_SECCOMP_FORBIDDEN"

func TestMain(m *testing.M) {
	if os.Getenv(envAsCLI) == "1" {
		clibase.OwnsProcess = true // the child is the process: --seccomp applies
		if os.Getenv(envSeccompForbidden) == "1" {
			// A compromised VMM phoning home: socket(AF_INET).
			clibase.AfterConfine = func() { _, _ = net.Dial("tcp", "127.0.0.1:9") }
		}
		os.Exit(Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// runMain runs Main in-process and returns the exit status, stdout and
// stderr.
func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	status := Main(append([]string{"microvm"}, args...), strings.NewReader(""), &stdout, &stderr)
	return status, stdout.String(), stderr.String()
}

// oneLine checks that s is exactly one line starting with "microvm: " and
// containing want.
func oneLine(t *testing.T, what, s, want string) {
	t.Helper()
	if !strings.HasPrefix(s, "microvm: ") || !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 {
		t.Errorf("%s = %q, want one line starting with \"microvm: \"", what, s)
	}
	if !strings.Contains(s, want) {
		t.Errorf("%s = %q, want it to contain %q", what, s, want)
	}
}

// wantError runs the CLI with args and checks that it exits with status,
// prints nothing on stdout and one line containing want on stderr.
func wantError(t *testing.T, status int, args []string, want string) {
	t.Helper()
	got, stdout, stderr := runMain(t, args...)
	if got != status {
		t.Errorf("exit status %d, want %d", got, status)
	}
	if stdout != "" {
		t.Errorf("stdout = %q, want nothing", stdout)
	}
	oneLine(t, "stderr", stderr, want)
}

// TestUsageErrors: every mistake on the command line exits 2 with one line
// on stderr and nothing on stdout, before any VM is created.
func TestUsageErrors(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(kernel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string // substring of the stderr line
	}{
		{"unknown flag", []string{"run", "--kernel", kernel, "--bogus"}, "flag provided but not defined: -bogus"},
		{"unknown global flag", []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"missing --kernel", []string{"run"}, "--kernel is required"},
		{"bad --memory", []string{"run", "--kernel", kernel, "--memory", "12Q"}, `--memory: bad size "12Q"`},
		{"--memory too small", []string{"run", "--kernel", kernel, "--memory", "4M"}, "memory 4M; microvm supports 8M..1T"},
		{"--memory not 2 MiB aligned", []string{"run", "--kernel", kernel, "--memory", "9M"}, "not a multiple of 2 MiB"},
		{"--cpus 0", []string{"run", "--kernel", kernel, "--cpus", "0"}, "--cpus 0: want 1..32"},
		{"--cpus 33", []string{"run", "--kernel", kernel, "--cpus", "33"}, "--cpus 33: want 1..32"},
		{"--cpus not a number", []string{"run", "--kernel", kernel, "--cpus", "two"}, `invalid value "two" for flag -cpus`},
		{"unknown --cpu-hide feature", []string{"run", "--kernel", kernel, "--cpu-hide", "cx16,warp"}, `unknown CPU feature "warp"`},
		{"bad --log-level", []string{"run", "--kernel", kernel, "--log-level", "loud"}, `--log-level "loud"`},
		{"stray argument", []string{"run", "--kernel", kernel, "extra"}, `unexpected argument "extra"`},
		{"version with an argument", []string{"version", "x"}, "version takes no arguments"},
		{"--vsock-cid without --vsock-uds", []string{"run", "--kernel", kernel, "--vsock-cid", "3"}, "--vsock-cid and --vsock-uds go together"},
		{"--vsock-cid 2", []string{"run", "--kernel", kernel, "--vsock-cid", "2", "--vsock-uds", "/tmp/x.sock"}, "vsock CID 2: must be at least 3"},
		{"--vsock-conn-buffer 4G", []string{"run", "--kernel", kernel, "--vsock-cid", "3", "--vsock-uds", "/tmp/x.sock", "--vsock-conn-buffer", "4G"}, `--vsock-conn-buffer "4G": want a size between 1 byte and 1G`},
		{"--vsock-max-conns 0", []string{"run", "--kernel", kernel, "--vsock-cid", "3", "--vsock-uds", "/tmp/x.sock", "--vsock-max-conns", "0"}, "--vsock-max-conns 0: want at least 1"},
		{"--vsock-connect-timeout 0", []string{"run", "--kernel", kernel, "--vsock-cid", "3", "--vsock-uds", "/tmp/x.sock", "--vsock-connect-timeout", "0s"}, "--vsock-connect-timeout 0s: want a positive duration"},
		{"vhost-user-vsock --conn-buffer 0", []string{"vhost-user-vsock", "--socket", "/tmp/a", "--uds-path", "/tmp/b", "--conn-buffer", "0"}, `--conn-buffer "0": want a size between 1 byte and 1G`},
		{"vhost-user-vsock --buffer-total below the reserve", []string{"vhost-user-vsock", "--socket", "/tmp/a", "--uds-path", "/tmp/b", "--buffer-total", "1M"}, `--buffer-total "1M": below --max-conns 1023 times the minimum window each connection is sure of (4096 bytes): want at least 4190208 bytes`},
		{"vhost-user-vsock --buffer-total 0", []string{"vhost-user-vsock", "--socket", "/tmp/a", "--uds-path", "/tmp/b", "--buffer-total", "0"}, `--buffer-total "0": want a size of at least 1 byte`},
		{"bad --acpi", []string{"run", "--kernel", kernel, "--acpi", "maybe"}, `--acpi "maybe": want on or off`},
		{"bad --irqchip", []string{"run", "--kernel", kernel, "--irqchip", "userspace"}, `irqchip "userspace": want "split" or "kernel"`},
		{"empty --metrics-socket", []string{"run", "--kernel", kernel, "--metrics-socket", ""}, "--metrics-socket needs a path"},
		{"--metrics-socket too long", []string{"run", "--kernel", kernel, "--metrics-socket", "/tmp/" + strings.Repeat("m", 103)}, "a Unix socket path holds at most 107"},
		{"vhost-user-vsock empty --metrics-socket", []string{"vhost-user-vsock", "--socket", "/tmp/x.sock", "--uds-path", "/tmp/v.sock", "--metrics-socket", ""}, "--metrics-socket needs a path"},
		{"vhost-user-vsock --metrics-socket too long", []string{"vhost-user-vsock", "--socket", "/tmp/x.sock", "--uds-path", "/tmp/v.sock", "--metrics-socket", "/tmp/" + strings.Repeat("m", 103)}, "a Unix socket path holds at most 107"},
		{"exec --metrics-socket too long", []string{"exec", "--kernel", kernel, "--metrics-socket", "/tmp/" + strings.Repeat("m", 103), "--", "true"}, "a Unix socket path holds at most 107"},
		{"vsock-connect without --port", []string{"vsock-connect", "--uds", "/tmp/x.sock"}, "--uds PATH and --port N"},
		{"vsock-connect port too big", []string{"vsock-connect", "--uds", "/tmp/x.sock", "--port", "4294967295"}, "--uds PATH and --port N"},
		{"vhost-user-vsock without --socket", []string{"vhost-user-vsock", "--uds-path", "/tmp/x.sock"}, "--socket and --uds-path are required"},
		{"vhost-user-vsock --guest-cid 1", []string{"vhost-user-vsock", "--socket", "/tmp/a", "--uds-path", "/tmp/b", "--guest-cid", "1"}, "--guest-cid 1: must be at least 3"},
		{"vhost-user-vsock uds path too long", []string{"vhost-user-vsock", "--socket", "/tmp/a", "--uds-path", "/tmp/" + strings.Repeat("x", 100)}, "over the 107 that sun_path holds"},
		{"restore without a directory", []string{"restore"}, "restore: want one snapshot directory"},
		{"restore with two", []string{"restore", "a", "b"}, "restore: want one snapshot directory"},
		{"restore with a bad --net", []string{"restore", "--net", "tap", "a"}, "want user[,host-loopback][,egress=SPEC][,mac=M] or tap=NAME"},
		{"restore --publish without --net user", []string{"restore", "--net", "tap=t0", "--publish", "8080:80", "a"}, "--publish needs --net user"},
		{"restore with a bad --publish", []string{"restore", "--net", "user", "--publish", "x", "a"}, "publish"},
		{"snapshot without --out", []string{"snapshot", "vm1"}, "snapshot: --out DIR is required"},
		{"snapshot without a name", []string{"snapshot", "--out", "/tmp/s"}, "snapshot: want one VM name"},
		{"snapshot NAME --out DIR with a bad name", []string{"snapshot", "../vm1", "--out", "/tmp/s"}, "../vm1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantError(t, microvm.StatusUsage, tc.args, tc.want) })
	}
}

// TestFileErrors: a kernel that cannot be used is a VMM error (exit 1) with
// one line naming the file.
func TestFileErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("#!/bin/sh\nnot a kernel\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "no-such-kernel")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing kernel file", []string{"run", "--kernel", missing}, "kernel " + missing + ": no such file or directory"},
		{"garbage kernel file", []string{"run", "--kernel", garbage}, "kernel " + garbage + ": not a bzImage or ELF kernel"},
		{"missing initrd file", []string{"run", "--kernel", garbage, "--initrd", missing}, "initrd " + missing + ": no such file or directory"},
		{"restore of no snapshot", []string{"restore", missing}, missing},
		{"restore of a directory that is no snapshot", []string{"restore", dir}, "manifest.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantError(t, microvm.StatusError, tc.args, tc.want) })
	}
}

func TestVersion(t *testing.T) {
	old := Version
	Version = "v1.2.3-test"
	defer func() { Version = old }()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		status, stdout, stderr := runMain(t, args...)
		if status != 0 || stderr != "" {
			t.Errorf("%v: status %d, stderr %q; want 0 and nothing", args, status, stderr)
		}
		if stdout != "microvm v1.2.3-test\n" && stdout != "microvm version v1.2.3-test\n" {
			t.Errorf("%v: stdout = %q, want the version", args, stdout)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {}} {
		status, stdout, stderr := runMain(t, args...)
		if status != 0 || stderr != "" {
			t.Errorf("%v: status %d, stderr %q; want 0 and nothing", args, status, stderr)
		}
		if !strings.Contains(stdout, "run") {
			t.Errorf("%v: help does not mention run:\n%s", args, stdout)
		}
	}
	_, stdout, _ := runMain(t, "run", "--help")
	for _, flag := range []string{"--kernel", "--initrd", "--cmdline", "--cpus", "--memory", "--cpu-hide", "--log-level"} {
		if !strings.Contains(stdout, flag) {
			t.Errorf("run --help does not list %s", flag)
		}
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"65536", 65536, false}, // a bare number means bytes here
		{"64K", 64 << 10, false},
		{"1M", 1 << 20, false},
		{"512B", 512, false},
		{"", 0, true},
		{"x", 0, true},
	}
	for _, tc := range tests {
		got, err := microvm.ParseBytes(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("microvm.ParseBytes(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
