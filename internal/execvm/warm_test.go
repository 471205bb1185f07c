package execvm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentimage"
)

// TestCheckWarmStart: a missing or empty directory is this run's to make;
// a directory that holds something other than an exec snapshot is
// refused; the key changes with what shapes the machine and with its
// files, and not with the log.
func TestCheckWarmStart(t *testing.T) {
	tmp := t.TempDir()
	kernel := filepath.Join(tmp, "bzImage")
	agent := filepath.Join(tmp, "agent")
	for _, p := range []string{kernel, agent} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := microvm.Config{Kernel: kernel, CPUs: 1, MemoryBytes: 128 << 20}
	img := agentimage.Options{Agent: agent}
	key := func(cfg microvm.Config, img agentimage.Options) string {
		t.Helper()
		k, err := machineKey(cfg, img)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	base := key(cfg, img)

	for _, dir := range []string{filepath.Join(tmp, "missing"), t.TempDir()} {
		w, err := CheckWarmStart(dir, cfg, img)
		if err != nil || w.snap != nil || w.key != base || w.dir != dir {
			t.Errorf("CheckWarmStart(%s): %+v, %v; want this run's to make, key %s", dir, w, err, base)
		}
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckWarmStart(other, cfg, img); err == nil || !strings.HasPrefix(err.Error(), "exec --snapshot "+other+": ") {
		t.Errorf("CheckWarmStart of a directory with a file: %v; want an exec --snapshot error", err)
	}

	logged := cfg
	logged.Log = logrus.New()
	if k := key(logged, img); k != base {
		t.Errorf("key with a log: %s; want %s", k, base)
	}
	more := cfg
	more.CPUs = 2
	if key(more, img) == base {
		t.Error("the key does not change with the CPUs")
	}
	if err := os.WriteFile(agent, []byte("xy"), 0o644); err != nil {
		t.Fatal(err)
	}
	if key(cfg, img) == base {
		t.Error("the key does not change with the agent's size")
	}
	if _, err := machineKey(microvm.Config{Kernel: filepath.Join(tmp, "none")}, img); err == nil {
		t.Error("machineKey with no kernel file: no error")
	}
}
