package containerdshim

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/kernelpath"
)

// Config is what the shim boots each VM with. containerd starts its shims
// with its own environment, so an operator sets these on containerd's
// service (docs/containerd.md).
type Config struct {
	Kernel      string        // MICROVM_KERNEL; default build/kernel/bzImage beside the shim's bin/
	Agent       string        // MICROVM_AGENT; default microvm-agent beside the shim
	CPUs        int           // MICROVM_SHIM_CPUS; default 1
	Memory      uint64        // MICROVM_SHIM_MEMORY (a SIZE); default 512M
	BootTimeout time.Duration // MICROVM_SHIM_BOOT_TIMEOUT (a Go duration); default 2m
	Rootfs      RootfsMethod  // MICROVM_SHIM_ROOTFS (ext4 or 9p); default ext4; a pod's RootfsAnnotation wins
}

// ConfigFromEnv reads Config from getenv, with defaults found from the
// shim binary's path self.
func ConfigFromEnv(getenv func(string) string, self string) (Config, error) {
	dir := filepath.Dir(self)
	// The CLIs' kernel rule, from the directory of the path the shim was
	// started by rather than os.Executable's.
	kernel, _ := kernelpath.Choose("", getenv, dir)
	c := Config{
		Kernel:      kernel,
		Agent:       filepath.Join(dir, "microvm-agent"),
		CPUs:        1,
		Memory:      512 << 20,
		BootTimeout: 2 * time.Minute,
		Rootfs:      RootfsExt4,
	}
	if v := getenv("MICROVM_AGENT"); v != "" {
		c.Agent = v
	}
	if v := getenv("MICROVM_SHIM_CPUS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > microvm.MaxCPUs {
			return c, fmt.Errorf("MICROVM_SHIM_CPUS=%q: want 1..%d", v, microvm.MaxCPUs)
		}
		c.CPUs = n
	}
	if v := getenv("MICROVM_SHIM_MEMORY"); v != "" {
		n, err := microvm.ParseSize(v)
		if err != nil {
			return c, fmt.Errorf("MICROVM_SHIM_MEMORY=%q: %w", v, err)
		}
		c.Memory = n
	}
	if v := getenv("MICROVM_SHIM_BOOT_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("MICROVM_SHIM_BOOT_TIMEOUT=%q: want a positive duration such as 90s", v)
		}
		c.BootTimeout = d
	}
	if v := getenv("MICROVM_SHIM_ROOTFS"); v != "" {
		m, err := parseRootfsMethod(v)
		if err != nil {
			return c, fmt.Errorf("MICROVM_SHIM_ROOTFS: %w", err)
		}
		c.Rootfs = m
	}
	for what, p := range map[string]string{"kernel (" + kernelpath.Env + ")": c.Kernel, "guest agent (MICROVM_AGENT)": c.Agent} {
		if _, err := os.Stat(p); err != nil {
			return c, fmt.Errorf("%s: %w", what, err)
		}
	}
	return c, nil
}
