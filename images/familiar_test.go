package images

import (
	"slices"
	"testing"
)

// TestFamiliar: Docker Hub's prefix and its library/ namespace go; other
// registries and other Hub namespaces keep their names.
func TestFamiliar(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"index.docker.io/library/debian:12", "debian:12"},
		{"index.docker.io/grafana/grafana:11", "grafana/grafana:11"},
		{"ghcr.io/owner/app:v1", "ghcr.io/owner/app:v1"},
		{"localhost:5000/library/x:1", "localhost:5000/library/x:1"},
		{"debian:12", "debian:12"},
	} {
		if got := Familiar([]string{tc.in}); !slices.Equal(got, []string{tc.want}) {
			t.Errorf("Familiar(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := Familiar(nil); len(got) != 0 {
		t.Errorf("Familiar(nil) = %q, want none", got)
	}
}
