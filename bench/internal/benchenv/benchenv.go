// Package benchenv holds what the benchmark programs share: a description
// of the host they ran on, and writing their JSON results.
package benchenv

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// HostInfo describes the machine: OS, architecture, CPU count and model,
// kernel release, and whether KVM is PVM-backed (guest CPL0 code emulated),
// which changes what the figures mean.
func HostInfo() map[string]string {
	h := map[string]string{"goos": runtime.GOOS, "goarch": runtime.GOARCH, "cpus": fmt.Sprint(runtime.NumCPU())}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				h["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h["kernel"] = strings.TrimSpace(string(b))
	}
	h["kvm"] = "kvm"
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		h["kvm"] = "kvm_pvm (PVM: guest CPL0 code is emulated)"
	}
	return h
}

// WriteJSON writes v, indented, to path, creating its directory.
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
