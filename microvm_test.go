package microvm_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr string
	}{
		{in: "64", want: 64 << 20}, // a bare number means MiB
		{in: "64M", want: 64 << 20},
		{in: "64m", want: 64 << 20},
		{in: "64MB", want: 64 << 20},
		{in: "64MiB", want: 64 << 20},
		{in: "64mib", want: 64 << 20},
		{in: " 1G ", want: 1 << 30},
		{in: "3g", want: 3 << 30},
		{in: "4096K", want: 4 << 20},
		{in: "1KiB", want: 1 << 10},
		{in: "2T", want: 2 << 40},
		{in: "0", want: 0},
		{in: "512B", want: 512}, // B alone: bytes
		{in: "1536b", want: 1536},
		{in: "16777215T", want: 16777215 << 40},
		{in: "16777216T", wantErr: "too large"},
		{in: "17179869184G", wantErr: "too large"},
		{in: "18446744073709551615B", want: 1<<64 - 1},
		{in: "18446744073709551616B", wantErr: "bad size"},
		{in: "", wantErr: "bad size"},
		{in: "M", wantErr: "bad size"},
		{in: "B", wantErr: "bad size"},
		{in: "64iB", wantErr: "bad size"}, // iB needs a unit letter
		{in: "-1", wantErr: "bad size"},
		{in: "1.5G", wantErr: "bad size"},
		{in: "12Q", wantErr: "bad size"},
		{in: "64 M", wantErr: "bad size"},
		{in: "0x40M", wantErr: "bad size"},
		{in: "1E", wantErr: "bad size"},
	}
	for _, tc := range tests {
		got, err := microvm.ParseSize(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseSize(%q) = %d, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("ParseSize(%q): %v", tc.in, err)
		case got != tc.want:
			t.Errorf("ParseSize(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   uint64
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1023, "1023B"},
		{1024, "1K"},
		{1536, "1536B"},
		{1025 << 10, "1025K"},
		{64 << 20, "64M"},
		{microvm.DefaultMemory, "256M"},
		{3 << 30, "3G"},
		{3<<30 + 2<<20, "3074M"},
		{1 << 40, "1T"},
		{5 << 40, "5T"},
		{1<<64 - 1, "18446744073709551615B"},
	}
	for _, tc := range tests {
		if got := microvm.FormatSize(tc.in); got != tc.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestParseSizeRoundTrip: FormatSize's output parses back to the same value.
// Regression: "1536B" used to parse as 1536 MiB.
func TestParseSizeRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 512, 1536, 1 << 10, 3 << 20, 64 << 20, 1<<20 + 1<<10, 7 << 30, 1 << 40, 1<<64 - 1} {
		s := microvm.FormatSize(v)
		got, err := microvm.ParseSize(s)
		if err != nil || got != v {
			t.Errorf("ParseSize(FormatSize(%d) = %q) = %d, %v", v, s, got, err)
		}
	}
}

func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// TestConfigErrors checks the configurations New refuses before it touches
// KVM, so it runs without /dev/kvm.
func TestConfigErrors(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "kernel")
	if err := os.WriteFile(kernel, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		cfg        microvm.Config
		wantConfig bool   // errors.Is(err, ErrConfig): the CLI exits 2
		wantMsg    string // substring of the message
	}{
		{"no kernel", microvm.Config{}, true, "no kernel given"},
		{"too many vCPUs", microvm.Config{Kernel: kernel, CPUs: microvm.MaxCPUs + 1}, true, "33 vCPUs; microvm supports 1..32"},
		{"negative vCPUs", microvm.Config{Kernel: kernel, CPUs: -1}, true, "-1 vCPUs"},
		{"too little memory", microvm.Config{Kernel: kernel, MemoryBytes: 4 << 20}, true, "memory 4M; microvm supports 8M..1T"},
		{"too much memory", microvm.Config{Kernel: kernel, MemoryBytes: 2 << 40}, true, "memory 2T"},
		{"memory not 2 MiB aligned", microvm.Config{Kernel: kernel, MemoryBytes: 9 << 20}, true, "not a multiple of 2 MiB"},
		{"unknown CPU feature", microvm.Config{Kernel: kernel, HideCPUFeatures: []string{"cx16", "warp"}}, true, `unknown CPU feature "warp"`},
		{"vsock CID reserved", microvm.Config{Kernel: kernel, Vsock: &microvm.VsockConfig{CID: 2, UDSPath: "/tmp/x"}}, true, "vsock CID 2"},
		{"vsock datagrams without socket", microvm.Config{Kernel: kernel, Vsock: &microvm.VsockConfig{CID: 3, Dgram: true}}, true, "Unix socket path"},
		// Regression: ConnBuffer was converted to uint32 unchecked, so 4G
		// silently became the 64 KiB default and 5G became 1 GiB.
		{"vsock buffer wraps uint32", microvm.Config{Kernel: kernel, Vsock: &microvm.VsockConfig{CID: 3, UDSPath: "/tmp/x", ConnBuffer: 4 << 30}}, true, "vsock connection buffer 4294967296"},
		{"vsock buffer over 1G", microvm.Config{Kernel: kernel, Vsock: &microvm.VsockConfig{CID: 3, UDSPath: "/tmp/x", ConnBuffer: 1<<30 + 1}}, true, "vsock connection buffer 1073741825"},
		{"vsock buffer negative", microvm.Config{Kernel: kernel, Vsock: &microvm.VsockConfig{CID: 3, UDSPath: "/tmp/x", ConnBuffer: -1}}, true, "vsock connection buffer -1"},
		{"vsock connections negative", microvm.Config{Kernel: kernel, Vsock: &microvm.VsockConfig{CID: 3, UDSPath: "/tmp/x", MaxConnections: -5}}, true, "vsock connection limit -5"},
		{"missing kernel file", microvm.Config{Kernel: "/nonexistent/bzImage"}, false, "kernel /nonexistent/bzImage: no such file or directory"},
		{"missing initrd file", microvm.Config{Kernel: kernel, Initrd: "/nonexistent/initrd"}, false, "initrd /nonexistent/initrd: no such file or directory"},
		{"garbage kernel", microvm.Config{Kernel: kernel}, false, "kernel " + kernel + ": not a bzImage or ELF kernel"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Log = quietLog()
			m, err := microvm.New(tc.cfg)
			if err == nil {
				m.Close()
				t.Fatal("New succeeded")
			}
			if got := errors.Is(err, microvm.ErrConfig); got != tc.wantConfig {
				t.Errorf("errors.Is(%q, ErrConfig) = %v, want %v", err, got, tc.wantConfig)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tc.wantMsg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q spans several lines", err)
			}
		})
	}
	// A missing file is recognisable as such.
	_, err := microvm.New(microvm.Config{Kernel: "/nonexistent/bzImage", Log: quietLog()})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing kernel: errors.Is(%v, fs.ErrNotExist) = false", err)
	}
}

func TestExitKindString(t *testing.T) {
	got := map[microvm.ExitKind]string{}
	for k := microvm.ExitDebugPort; k <= microvm.ExitError; k++ {
		got[k] = k.String()
	}
	want := map[microvm.ExitKind]string{
		microvm.ExitDebugPort: "debug-exit", microvm.ExitReset: "reset", microvm.ExitPowerOff: "power-off",
		microvm.ExitTripleFault: "triple-fault", microvm.ExitCanceled: "canceled", microvm.ExitError: "error",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ExitKind names (-want +got):\n%s", diff)
	}
}
