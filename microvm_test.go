package microvm

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
		got, err := ParseSize(tc.in)
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
		{DefaultMemory, "256M"},
		{3 << 30, "3G"},
		{3<<30 + 2<<20, "3074M"},
		{1 << 40, "1T"},
		{5 << 40, "5T"},
		{1<<64 - 1, "18446744073709551615B"},
	}
	for _, tc := range tests {
		if got := FormatSize(tc.in); got != tc.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestParseSizeRoundTrip: FormatSize's output parses back to the same value.
// Regression: "1536B" used to parse as 1536 MiB.
func TestParseSizeRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 512, 1536, 1 << 10, 3 << 20, 64 << 20, 1<<20 + 1<<10, 7 << 30, 1 << 40, 1<<64 - 1} {
		s := FormatSize(v)
		got, err := ParseSize(s)
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
		cfg        Config
		wantConfig bool   // errors.Is(err, ErrConfig): the CLI exits 2
		wantMsg    string // substring of the message
	}{
		{"no kernel", Config{}, true, "no kernel given"},
		{"too many vCPUs", Config{Kernel: kernel, CPUs: MaxCPUs + 1}, true, "33 vCPUs; microvm supports 1..32"},
		{"negative vCPUs", Config{Kernel: kernel, CPUs: -1}, true, "-1 vCPUs"},
		{"too little memory", Config{Kernel: kernel, MemoryBytes: 4 << 20}, true, "memory 4M; microvm supports 8M..1T"},
		{"too much memory", Config{Kernel: kernel, MemoryBytes: 2 << 40}, true, "memory 2T"},
		{"memory not 2 MiB aligned", Config{Kernel: kernel, MemoryBytes: 9 << 20}, true, "not a multiple of 2 MiB"},
		{"unknown CPU feature", Config{Kernel: kernel, HideCPUFeatures: []string{"cx16", "warp"}}, true, `unknown CPU feature "warp"`},
		{"vsock CID reserved", Config{Kernel: kernel, Vsock: &VsockConfig{CID: 2, UDSPath: "/tmp/x"}}, true, "vsock CID 2"},
		{"vsock datagrams without socket", Config{Kernel: kernel, Vsock: &VsockConfig{CID: 3, Dgram: true}}, true, "Unix socket path"},
		// Regression: ConnBuffer was converted to uint32 unchecked, so 4G
		// silently became the 64 KiB default and 5G became 1 GiB.
		{"vsock buffer wraps uint32", Config{Kernel: kernel, Vsock: &VsockConfig{CID: 3, UDSPath: "/tmp/x", ConnBuffer: 4 << 30}}, true, "vsock connection buffer 4294967296"},
		{"vsock buffer over 1G", Config{Kernel: kernel, Vsock: &VsockConfig{CID: 3, UDSPath: "/tmp/x", ConnBuffer: 1<<30 + 1}}, true, "vsock connection buffer 1073741825"},
		{"vsock buffer negative", Config{Kernel: kernel, Vsock: &VsockConfig{CID: 3, UDSPath: "/tmp/x", ConnBuffer: -1}}, true, "vsock connection buffer -1"},
		{"vsock connections negative", Config{Kernel: kernel, Vsock: &VsockConfig{CID: 3, UDSPath: "/tmp/x", MaxConnections: -5}}, true, "vsock connection limit -5"},
		{"missing kernel file", Config{Kernel: "/nonexistent/bzImage"}, false, "kernel /nonexistent/bzImage: no such file or directory"},
		{"missing initrd file", Config{Kernel: kernel, Initrd: "/nonexistent/initrd"}, false, "initrd /nonexistent/initrd: no such file or directory"},
		{"garbage kernel", Config{Kernel: kernel}, false, "kernel " + kernel + ": not a bzImage or ELF kernel"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Log = quietLog()
			m, err := New(tc.cfg)
			if err == nil {
				m.Close()
				t.Fatal("New succeeded")
			}
			if got := errors.Is(err, ErrConfig); got != tc.wantConfig {
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
	_, err := New(Config{Kernel: "/nonexistent/bzImage", Log: quietLog()})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing kernel: errors.Is(%v, fs.ErrNotExist) = false", err)
	}
}

func TestExitKindString(t *testing.T) {
	got := map[ExitKind]string{}
	for k := ExitDebugPort; k <= ExitError; k++ {
		got[k] = k.String()
	}
	want := map[ExitKind]string{
		ExitDebugPort: "debug-exit", ExitReset: "reset", ExitPowerOff: "power-off",
		ExitTripleFault: "triple-fault", ExitCanceled: "canceled", ExitError: "error",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ExitKind names (-want +got):\n%s", diff)
	}
}
