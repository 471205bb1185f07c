package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSplitCmdline(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"   \n", nil},
		{"console=ttyS0 reboot=k\n", []string{"console=ttyS0", "reboot=k"}},
		{"  a\t b  c ", []string{"a", "b", "c"}},
		{`a="x y" b`, []string{`a="x y"`, "b"}},
		{`"a b=c" d`, []string{`"a b=c"`, "d"}},
		{`a="unterminated b c`, []string{`a="unterminated b c`}},
		{`a="" b`, []string{`a=""`, "b"}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, splitCmdline(tt.in)); diff != "" {
			t.Errorf("splitCmdline(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestParseCmdline(t *testing.T) {
	const cmdline = `console=ttyS0 earlycon reboot=k virtio_mmio.device=4K@0xd0000000:5 ` +
		`microvm.scenarios=echo,,connect,echo, microvm.port=1024 microvm.connect.port=2048 ` +
		`microvm.connect.size=64K microvm.halfclose-guest.expect="any" microvm.seed=7 microvm.seed=9 -- microvm.timeout=5s` + "\n"
	p, err := ParseCmdline(cmdline)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"echo", "connect", "echo"}, p.Scenarios()); diff != "" {
		t.Errorf("Scenarios() (-want +got):\n%s", diff)
	}
	echo := p.For("echo")
	connect := p.For("connect")
	hc := p.For("halfclose-guest")
	got := map[string]any{
		"echo.port":       echo.Uint32("port", 1),
		"connect.port":    connect.Uint32("port", 1),
		"connect.size":    connect.Size("size", 1),
		"echo.size":       echo.Size("size", 1),
		"hc.expect":       hc.String("expect", "echo"),
		"echo.seed":       echo.Uint64("seed", 1),
		"connect.timeout": connect.Duration("timeout", time.Minute),
	}
	want := map[string]any{
		"echo.port":       uint32(1024),
		"connect.port":    uint32(2048),
		"connect.size":    int64(64 << 10),
		"echo.size":       int64(1),
		"hc.expect":       "any",
		"echo.seed":       uint64(9),
		"connect.timeout": 5 * time.Second,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parameter values (-want +got):\n%s", diff)
	}
	for _, sp := range []*ScenarioParams{echo, connect, hc} {
		if err := sp.Err(); err != nil {
			t.Errorf("%s: Err() = %v", sp.name, err)
		}
	}
	if diff := cmp.Diff([]string(nil), p.Unused()); diff != "" {
		t.Errorf("Unused() (-want +got):\n%s", diff)
	}
}

func TestParseCmdlineErrors(t *testing.T) {
	for _, in := range []string{"microvm.=1", "microvm..port=1", "microvm.echo.=1"} {
		if _, err := ParseCmdline(in); err == nil {
			t.Errorf("ParseCmdline(%q) succeeded", in)
		}
	}
}

func TestUnused(t *testing.T) {
	p, err := ParseCmdline("microvm.scenarios=echo microvm.prot=1 microvm.echo.port=5 microvm.conect.port=6")
	if err != nil {
		t.Fatal(err)
	}
	p.For("echo").Uint32("port", 0)
	if diff := cmp.Diff([]string{"microvm.conect.port", "microvm.prot"}, p.Unused()); diff != "" {
		t.Errorf("Unused() (-want +got):\n%s", diff)
	}
}

func TestGetterErrors(t *testing.T) {
	tests := []struct {
		value string
		get   func(*ScenarioParams) any
		want  any // the default, returned on error
		err   string
	}{
		{"x", func(s *ScenarioParams) any { return s.Uint32("k", 3) }, uint32(3), "unsigned 32-bit"},
		{"4294967296", func(s *ScenarioParams) any { return s.Uint32("k", 3) }, uint32(3), "unsigned 32-bit"},
		{"-1", func(s *ScenarioParams) any { return s.Uint64("k", 3) }, uint64(3), "unsigned 64-bit"},
		{"33", func(s *ScenarioParams) any { return s.Int("k", 3, 1, 32) }, 3, "[1, 32]"},
		{"0", func(s *ScenarioParams) any { return s.Int("k", 3, 1, 32) }, 3, "[1, 32]"},
		{"12Q", func(s *ScenarioParams) any { return s.Size("k", 3) }, int64(3), "size"},
		{"K", func(s *ScenarioParams) any { return s.Size("k", 3) }, int64(3), "size"},
		{"-1K", func(s *ScenarioParams) any { return s.Size("k", 3) }, int64(3), "size"},
		{"1025G", func(s *ScenarioParams) any { return s.Size("k", 3) }, int64(3), "out of range"},
		{"soon", func(s *ScenarioParams) any { return s.Duration("k", 3) }, time.Duration(3), "duration"},
		{"-5s", func(s *ScenarioParams) any { return s.Duration("k", 3) }, time.Duration(3), "duration"},
	}
	for _, tt := range tests {
		p, err := ParseCmdline("microvm.s.k=" + tt.value)
		if err != nil {
			t.Fatal(err)
		}
		sp := p.For("s")
		if got := tt.get(sp); got != tt.want {
			t.Errorf("value %q: got %v, want default %v", tt.value, got, tt.want)
		}
		if err := sp.Err(); err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "microvm.s.k") {
			t.Errorf("value %q: Err() = %v, want one naming microvm.s.k and %q", tt.value, err, tt.err)
		}
	}
}

func TestGetterValues(t *testing.T) {
	tests := []struct {
		value string
		get   func(*ScenarioParams) any
		want  any
	}{
		{"0x400", func(s *ScenarioParams) any { return s.Uint32("k", 0) }, uint32(1024)},
		{"4294967295", func(s *ScenarioParams) any { return s.Uint32("k", 0) }, uint32(0xffffffff)},
		{"0", func(s *ScenarioParams) any { return s.Size("k", 1) }, int64(0)},
		{"4096", func(s *ScenarioParams) any { return s.Size("k", 1) }, int64(4096)},
		{"8m", func(s *ScenarioParams) any { return s.Size("k", 1) }, int64(8 << 20)},
		{"1G", func(s *ScenarioParams) any { return s.Size("k", 1) }, int64(1 << 30)},
		{"1024G", func(s *ScenarioParams) any { return s.Size("k", 1) }, int64(1 << 40)},
		{"0", func(s *ScenarioParams) any { return s.Duration("k", 1) }, time.Duration(0)},
		{"90", func(s *ScenarioParams) any { return s.Duration("k", 1) }, 90 * time.Second},
		{"250ms", func(s *ScenarioParams) any { return s.Duration("k", 1) }, 250 * time.Millisecond},
		{"", func(s *ScenarioParams) any { return s.String("k", "def") }, ""},
	}
	for _, tt := range tests {
		p, err := ParseCmdline("microvm.k=" + tt.value)
		if err != nil {
			t.Fatal(err)
		}
		sp := p.For("s")
		if got := tt.get(sp); got != tt.want {
			t.Errorf("value %q: got %v, want %v", tt.value, got, tt.want)
		}
		if err := sp.Err(); err != nil {
			t.Errorf("value %q: Err() = %v", tt.value, err)
		}
	}
}
