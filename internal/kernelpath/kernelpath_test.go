package kernelpath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChoose: the given kernel wins, then $MICROVM_KERNEL, then the
// default beside the binary's directory, which alone is marked as the
// default.
func TestChoose(t *testing.T) {
	env := map[string]string{Env: "/env/bzImage"}
	getenv := func(k string) string { return env[k] }
	if p, def := Choose("/flag/bzImage", getenv, "/opt/microvm/bin"); p != "/flag/bzImage" || def {
		t.Errorf("given: %q default %v, want /flag/bzImage, not the default", p, def)
	}
	if p, def := Choose("", getenv, "/opt/microvm/bin"); p != "/env/bzImage" || def {
		t.Errorf("from the environment: %q default %v, want /env/bzImage, not the default", p, def)
	}
	env[Env] = ""
	if p, def := Choose("", getenv, "/opt/microvm/bin"); p != "/opt/microvm/build/kernel/bzImage" || !def {
		t.Errorf("neither: %q default %v, want /opt/microvm/build/kernel/bzImage, the default", p, def)
	}
}

// TestDefault: build/kernel/bzImage beside the running binary's
// directory.
func TestDefault(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if BinDir() != filepath.Dir(exe) {
		t.Errorf("BinDir() = %q, want %q", BinDir(), filepath.Dir(exe))
	}
	want := filepath.Join(filepath.Dir(filepath.Dir(exe)), "build", "kernel", "bzImage")
	if got := Default(BinDir()); got != want {
		t.Errorf("Default(BinDir()) = %q, want %q", got, want)
	}
}

// TestCheckDefault: a missing default names its path once, the reason,
// and how to build it; one that is there passes.
func TestCheckDefault(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "bzImage")
	err := CheckDefault(missing)
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
	if err := CheckDefault(missing); err != nil {
		t.Errorf("present: %v", err)
	}
}
