// Package benchenv holds what the benchmark programs share: a description
// of the host they ran on, writing their JSON results (Num for figures that
// may be missing), and their command line for the nested-KVM box.
package benchenv

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
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

// Num is a float64 that encodes NaN and infinities as JSON null (a figure
// that could not be computed) instead of failing the encoding.
type Num float64

// MarshalJSON implements json.Marshaler.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(f)
}

// BoxCommand is this program's command line, its path made absolute and
// its arguments quoted for sh, to run again inside the nested-KVM box
// (where only the repository keeps its path: file flags should be absolute
// too).
func BoxCommand() string {
	argv := append([]string(nil), os.Args...)
	if exe, err := os.Executable(); err == nil {
		argv[0] = exe
	}
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t'\"$\\") {
			argv[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(argv, " ")
}

// GateLinuxKVM is the -host-check and -force handling of a benchmark that
// boots Linux guests, which needs hardware KVM (testenv.Host). With
// hostCheck it answers and exits (0: yes, 1: no). Otherwise, on a host that
// cannot boot Linux and without force, it says how to run prog in the
// nested-KVM box (what the figures mean there: boxNote) and exits 2.
func GateLinuxKVM(prog string, hostCheck, force bool, boxNote string) {
	host := testenv.Host()
	if hostCheck {
		if host != testenv.KVMHardware {
			fmt.Printf("%s: no: this host's KVM is %q; Linux guests need hardware KVM\n", prog, host)
			os.Exit(1)
		}
		fmt.Printf("%s: yes: /dev/kvm can boot Linux guests\n", prog)
		os.Exit(0)
	}
	if host != testenv.KVMHardware && !force {
		fmt.Fprintf(os.Stderr, "%s: this host's KVM is %q, which cannot boot Linux guests\n", prog, host)
		fmt.Fprintf(os.Stderr, "%s: run it in the nested-KVM box instead (QEMU TCG speed: %s):\n", prog, boxNote)
		fmt.Fprintf(os.Stderr, "  scripts/kvmbox --timeout 30m -- %s\n", BoxCommand())
		fmt.Fprintf(os.Stderr, "%s: or pass -force to try here anyway\n", prog)
		os.Exit(2)
	}
}

// MedianDuration is the median of ds (the upper one of an even count), 0
// for none; ds is not reordered.
func MedianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// MS is d in milliseconds.
func MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
