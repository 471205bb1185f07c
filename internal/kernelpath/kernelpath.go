package kernelpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Env names the variable that gives the kernel when none is given.
const Env = "MICROVM_KERNEL"

// BinDir is the directory of the running binary, where the default agent
// is looked for and beside which the default kernel lies.
func BinDir() string {
	exe, _ := os.Executable()
	return filepath.Dir(exe)
}

// Default is the kernel booted when none is given and $MICROVM_KERNEL is
// not set: build/kernel/bzImage beside binDir (the binaries' bin/).
func Default(binDir string) string {
	return filepath.Clean(filepath.Join(binDir, "..", "build", "kernel", "bzImage"))
}

// Choose is the kernel to boot: given when not "", else getenv(Env) when
// set, else Default(binDir), with isDefault true.
func Choose(given string, getenv func(string) string, binDir string) (path string, isDefault bool) {
	if given != "" {
		return given, false
	}
	if env := getenv(Env); env != "" {
		return env, false
	}
	return Default(binDir), true
}

// CheckDefault says, when the default kernel path is not there, that it
// was the default and how to build it: a user who named no kernel would
// otherwise see only a path beside the binary. The hint names the CLIs'
// --kernel.
func CheckDefault(path string) error {
	if _, err := os.Stat(path); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the message names the path already
		}
		return fmt.Errorf("kernel %s: %w (no --kernel and no $%s, so this is the default: build it with make kernel, or give one)",
			path, err, Env)
	}
	return nil
}
