package execvm

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKernel: --kernel wins, then $MICROVM_KERNEL, then the default
// beside the binary, which alone is marked as the default.
func TestKernel(t *testing.T) {
	t.Setenv(KernelEnv, "/env/bzImage")
	if p, def := Kernel("/flag/bzImage"); p != "/flag/bzImage" || def {
		t.Errorf("given: %q default %v, want /flag/bzImage, not the default", p, def)
	}
	if p, def := Kernel(""); p != "/env/bzImage" || def {
		t.Errorf("from the environment: %q default %v, want /env/bzImage, not the default", p, def)
	}
	t.Setenv(KernelEnv, "")
	if p, def := Kernel(""); p != DefaultKernelPath() || !def {
		t.Errorf("neither: %q default %v, want %q, the default", p, def, DefaultKernelPath())
	}
}

// TestDefaultKernelPath: build/kernel/bzImage beside the binary's
// directory.
func TestDefaultKernelPath(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(filepath.Dir(filepath.Dir(exe)), "build", "kernel", "bzImage")
	if got := DefaultKernelPath(); got != want {
		t.Errorf("DefaultKernelPath() = %q, want %q", got, want)
	}
}

// TestCheckDefaultKernel: a missing default names its path once, the
// reason, and how to build it; one that is there passes.
func TestCheckDefaultKernel(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "bzImage")
	err := CheckDefaultKernel(missing)
	want := "kernel " + missing + ": no such file or directory (no --kernel and no $MICROVM_KERNEL, so this is the default: build it with make kernel, or give one)"
	if err == nil || err.Error() != want {
		t.Errorf("missing: %v, want %q", err, want)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v does not wrap fs.ErrNotExist", err)
	}
	if strings.Count(err.Error(), missing) != 1 {
		t.Errorf("missing: %q names the path more than once", err)
	}
	if err := os.WriteFile(missing, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckDefaultKernel(missing); err != nil {
		t.Errorf("present: %v", err)
	}
}

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
