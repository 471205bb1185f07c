package snapshot

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestCheckName: the names and file names a manifest may hold.
func TestCheckName(t *testing.T) {
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"cpu0", true},
		{"vcpu.0.json", true},
		{"virtio-net_1", true},
		{"A9", true},
		{"", false},
		{".", false},
		{"..", false},
		{".hidden", false},
		{"-flag", false},
		{"a..b", false},
		{"../x", false},
		{"a/b", false},
		{"a\\b", false},
		{"a b", false},
		{"a\x00", false},
		{"é", false},
		{strings.Repeat("a", maxNameLen), true},
		{strings.Repeat("a", maxNameLen+1), false},
	} {
		if err := checkName(tt.name, maxNameLen); (err == nil) != tt.ok {
			t.Errorf("checkName(%q) = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}

// TestCheckVersion: versions 1..Version pass; larger ones, however
// large, are ErrNewerVersion; anything else ErrFormat.
func TestCheckVersion(t *testing.T) {
	for _, tt := range []struct {
		v    string
		want error
	}{
		{"1", nil},
		{"2", ErrNewerVersion},
		{"99999999999999999999999999", ErrNewerVersion},
		{"0", ErrFormat},
		{"-1", ErrFormat},
		{"1.5", ErrFormat},
		{"1e3", ErrFormat},
		{"", ErrFormat},
	} {
		err := checkVersion(json.Number(tt.v))
		if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("checkVersion(%q) = %v, want %v", tt.v, err, tt.want)
		}
	}
}
