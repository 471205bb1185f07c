package execvm

import "testing"

// TestWithInit: init=/init is added once, after the rest, and never over
// an init= parameter the command line names (rdinit= is another
// parameter, and what follows "--" is init's own arguments).
func TestWithInit(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{AgentCmdline, AgentCmdline + " init=/init"},
		{"", "init=/init"},
		{" console=ttyS0", "console=ttyS0 init=/init"},
		{"console=ttyS0 init=/sbin/init", "console=ttyS0 init=/sbin/init"},
		{"rdinit=/bin/sh", "rdinit=/bin/sh init=/init"},
		{"quiet -- init=x", "quiet init=/init -- init=x"},
	} {
		if got := WithInit(tc.in); got != tc.want {
			t.Errorf("WithInit(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
