package microvm

import (
	"errors"
	"net"
	"testing"
)

// TestNetConfigErrors: bad network devices are configuration errors,
// reported before KVM or a TAP is opened.
func TestNetConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		nets []NetConfig
	}{
		{"no tap", []NetConfig{{}}},
		{"long name", []NetConfig{{TAP: "sixteen-bytes-xx"}}},
		{"multicast mac", []NetConfig{{TAP: "t0", MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}}}},
		{"short mac", []NetConfig{{TAP: "t0", MAC: net.HardwareAddr{2, 0, 0}}}},
		{"too many", []NetConfig{{TAP: "a"}, {TAP: "b"}, {TAP: "c"}, {TAP: "d"}, {TAP: "e"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Kernel: "/nonexistent", Nets: tc.nets})
			if !errors.Is(err, ErrConfig) {
				t.Errorf("New: %v, want ErrConfig", err)
			}
		})
	}
}
