package jail

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInside: the mapping from host paths to names under a root is by
// whole path components.
func TestInside(t *testing.T) {
	for _, tc := range []struct {
		dir, p, want string
		ok           bool
	}{
		{"/srv/vm1", "/srv/vm1/run/v.sock", "/run/v.sock", true},
		{"/srv/vm1", "/srv/vm1", "/", true},
		{"/srv/vm1", "/srv/vm10/v.sock", "", false},
		{"/srv/vm1", "/srv/v.sock", "", false},
		{"/srv/vm1", "/srv/vm1/", "/", true},
		{"/", "/run/v.sock", "/run/v.sock", true},
	} {
		got, ok := inside(tc.dir, tc.p)
		if got != tc.want || ok != tc.ok {
			t.Errorf("inside(%q, %q) = %q, %v; want %q, %v", tc.dir, tc.p, got, ok, tc.want, tc.ok)
		}
	}
}

// TestCheckInside: paths are made absolute and their directory's links
// resolved before the check, so a link out of the root is caught and a
// link into it accepted.
func TestCheckInside(t *testing.T) {
	base := t.TempDir()
	dir, err := Dir(base)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(out, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "run"), filepath.Join(out, "in")); err != nil {
		t.Fatal(err)
	}
	if got, err := CheckInside(dir, filepath.Join(dir, "run", "v.sock"), "--x"); err != nil || got != filepath.Join(dir, "run", "v.sock") {
		t.Errorf("inside: %q, %v", got, err)
	}
	if got, err := CheckInside(dir, filepath.Join(out, "in", "v.sock"), "--x"); err != nil || got != filepath.Join(dir, "run", "v.sock") {
		t.Errorf("link into the root: %q, %v", got, err)
	}
	if _, err := CheckInside(dir, filepath.Join(dir, "out", "v.sock"), "--x"); err == nil || !strings.Contains(err.Error(), "is outside --chroot") {
		t.Errorf("link out of the root: %v, want it refused", err)
	}
	if _, err := CheckInside(dir, filepath.Join(dir, "nope", "v.sock"), "--x"); err == nil || !strings.Contains(err.Error(), "no such file or directory") {
		t.Errorf("missing directory: %v", err)
	}
	// Before Enter, Path changes nothing.
	if p := filepath.Join(dir, "run", "v.sock"); Path(p) != p {
		t.Errorf("Path before Enter = %q, want %q", Path(p), p)
	}
}
