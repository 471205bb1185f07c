package containerdshim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	root := t.TempDir()
	self := filepath.Join(root, "bin", "containerd-shim-microvm-v2")
	for _, f := range []string{"bin/microvm-agent", "build/kernel/bzImage", "other/kernel"} {
		p := filepath.Join(root, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	c, err := ConfigFromEnv(getenv, self)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kernel != filepath.Join(root, "build/kernel/bzImage") || c.Agent != filepath.Join(root, "bin/microvm-agent") ||
		c.CPUs != 1 || c.Memory != 512<<20 || c.BootTimeout != 2*time.Minute || c.Rootfs != RootfsExt4 {
		t.Errorf("defaults: %+v", c)
	}
	env = map[string]string{"MICROVM_KERNEL": filepath.Join(root, "other/kernel"), "MICROVM_SHIM_CPUS": "2",
		"MICROVM_SHIM_MEMORY": "1G", "MICROVM_SHIM_BOOT_TIMEOUT": "30s", "MICROVM_SHIM_ROOTFS": "9p"}
	if c, err = ConfigFromEnv(getenv, self); err != nil {
		t.Fatal(err)
	}
	if c.Kernel != env["MICROVM_KERNEL"] || c.CPUs != 2 || c.Memory != 1<<30 || c.BootTimeout != 30*time.Second || c.Rootfs != Rootfs9p {
		t.Errorf("from the environment: %+v", c)
	}
	for k, v := range map[string]string{
		"MICROVM_SHIM_CPUS": "0", "MICROVM_SHIM_MEMORY": "lots", "MICROVM_SHIM_BOOT_TIMEOUT": "-1s",
		"MICROVM_KERNEL": "/no/such/kernel", "MICROVM_AGENT": "/no/such/agent", "MICROVM_SHIM_ROOTFS": "virtiofs",
	} {
		env = map[string]string{k: v}
		if _, err := ConfigFromEnv(getenv, self); err == nil || !strings.Contains(err.Error(), k) && !strings.Contains(err.Error(), v) {
			t.Errorf("%s=%s: err %v", k, v, err)
		}
	}
}
