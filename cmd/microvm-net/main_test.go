package main

import (
	"strings"
	"testing"
)

// TestBadEgress: a bad --egress is refused with one line naming the flag,
// before any socket is touched.
func TestBadEgress(t *testing.T) {
	for _, spec := range []string{"10.0.0.1", "10.0.0.0/8:0", "none+"} {
		err := run([]string{"--guest-mac", "02:00:00:00:00:01", "--egress", spec}, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "--egress: ") || strings.Contains(err.Error(), "\n") {
			t.Errorf("--egress %q: %v, want one line starting --egress", spec, err)
		}
	}
}
