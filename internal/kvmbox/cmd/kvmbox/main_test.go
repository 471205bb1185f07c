package main

import (
	"bytes"
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
