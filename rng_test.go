package microvm

import (
	"errors"
	"strings"
	"testing"
)

// TestRNGConfig: a rate above rng.MaxRate is a configuration error.
func TestRNGConfig(t *testing.T) {
	cfg := Config{Kernel: "k", RNG: &RNGConfig{Rate: 1 << 31}}
	if _, err := cfg.withDefaults(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "rng rate") {
		t.Errorf("withDefaults: %v; want ErrConfig saying %q", err, "rng rate")
	}
}
