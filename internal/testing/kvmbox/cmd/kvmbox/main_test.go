package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func TestParseMiB(t *testing.T) {
	for in, want := range map[string]int{"3072": 3072, "512M": 512, "2G": 2048, "1g": 1024} {
		if got, err := parseMiB(in); err != nil || got != want {
			t.Errorf("parseMiB(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1G", "2T", "G", "1.5G"} {
		if _, err := parseMiB(in); err == nil {
			t.Errorf("parseMiB(%q) accepted", in)
		}
	}
}

// TestUsageErrors: the box's own failures are exit 125 with one line, so a
// caller can tell them from the command's status.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"--memory", "lots", "--", "true"}, `--memory "lots"`},
		{[]string{"--timeout", "-1s", "--", "true"}, "must not be negative"},
		{[]string{"--quiet-timeout", "-1s", "--", "true"}, "must not be negative"},
		{[]string{"--cpus", "0", "--kernel", "/nonexistent", "--", "true"}, "kvmbox: "},
	} {
		var stderr bytes.Buffer
		if got := Main(tc.args, &stderr); got != 125 {
			t.Errorf("Main(%q) = %d, want 125", tc.args, got)
		}
		if msg := stderr.String(); !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("Main(%q): stderr %q, want one line containing %q", tc.args, msg, tc.want)
		}
	}
}

// TestEnvDefaults: KVMBOX_CPUS and KVMBOX_TCG_THREAD steer a box that
// scripts/box-test starts (its command line is fixed), and a bad value is
// the box's own failure in one line.
func TestEnvDefaults(t *testing.T) {
	for _, tc := range []struct {
		env, value, want string
	}{
		{"KVMBOX_CPUS", "two", `KVMBOX_CPUS="two"`},
		{"KVMBOX_CPUS", "9", "--cpus 9: 1..8"},
		{"KVMBOX_TCG_THREAD", "many", `--tcg-thread "many"`},
	} {
		t.Setenv(tc.env, tc.value)
		var stderr bytes.Buffer
		// Files that are there, so the options' own checks are reached.
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"--kernel", self, "--init", self, "--repo", t.TempDir(), "--", "true"}
		if got := Main(args, &stderr); got != 125 {
			t.Errorf("%s=%s: Main = %d, want 125", tc.env, tc.value, got)
		}
		if msg := stderr.String(); !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%s=%s: stderr %q, want one line containing %q", tc.env, tc.value, msg, tc.want)
		}
		os.Unsetenv(tc.env)
	}
}
