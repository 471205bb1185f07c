package kvmbox

import (
	"bufio"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// registersAnswer is QEMU 7.2's `info registers -a` for a two-vCPU box,
// trimmed to the lines parseRegisters reads and a few it must skip; vCPU 1
// at rip1.
func registersAnswer(rip1 string) string {
	return strings.ReplaceAll(`info registers -a
CPU#0
RAX=0000000000000000 RBX=ffffffff82012940 RCX=0000000000000001 RDX=0000000000000000
RIP=ffffffff81002c23 RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1
CR0=80050033 CR2=00007f1c2a1e5000 CR3=000000000260a000 CR4=000006f0
EFER=0000000000001d01

CPU#1
RAX=0000000000000001 RBX=ffff88800f83a000 RCX=0000000000000000 RDX=0000000000000001
RIP=`+rip1+` RFL=00000086 [--S--P-] CPL=0 II=0 A20=1 SMM=0 HLT=0
CR0=80050033 CR2=0000000000000000 CR3=000000000260a000 CR4=000006f0
`, "\n", "\r\n")
}

// fakeMonitor serves QEMU's human monitor protocol on a Unix socket: the
// banner and prompt, then for each command line its echo, the next of
// answers and a prompt. silent: accept and never say anything.
func fakeMonitor(t *testing.T, silent bool, answers ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "monitor")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if silent {
			_, _ = c.Read(make([]byte, 1)) // until the client gives up
			return
		}
		_, _ = c.Write([]byte("QEMU 7.2.22 monitor - type 'help' for more information\r\n(qemu) "))
		r := bufio.NewReader(c)
		for _, a := range answers {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			// The echo carries cursor moves, and "(qemu) " only after a newline.
			_, _ = c.Write([]byte("i\x1b[K\x1b[Din\x1b[K(qemu) x\r\n" + a + "(qemu) "))
		}
	}()
	return path
}

func TestSampleVCPUs(t *testing.T) {
	path := fakeMonitor(t, false, registersAnswer("ffffffff810a1b2c"), registersAnswer("ffffffff810a1b40"))
	s := sampleVCPUs(path, 5*time.Second, 0)
	if s.err != nil {
		t.Fatal(s.err)
	}
	raw, summary := s.raw, s.summary()
	want := "vCPU 0 halted at 0xffffffff81002c23 (CPL 0, interrupts on, unchanged 1 s later); " +
		"vCPU 1 running at 0xffffffff810a1b2c (CPL 0, interrupts off, 1 s later at 0xffffffff810a1b40)"
	if summary != want {
		t.Errorf("summary:\n got %s\nwant %s", summary, want)
	}
	if strings.Count(raw, "CPU#1") != 2 {
		t.Errorf("raw answers lack the two samples:\n%s", raw)
	}
}

// A QEMU whose main loop is stuck accepts on its monitor socket and never
// answers: the snapshot gives up after its timeout with an error saying so.
func TestSampleVCPUsSilentMonitor(t *testing.T) {
	path := fakeMonitor(t, true)
	start := time.Now()
	s := sampleVCPUs(path, 200*time.Millisecond, 0)
	if s.err == nil || !strings.Contains(s.err.Error(), "no prompt") || s.summary() != "" || s.spinning() {
		t.Fatalf("silent monitor: summary %q, err %v; want a no-prompt error", s.summary(), s.err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gave up after %v, want about the 200ms timeout", d)
	}
	// And no monitor at all (QEMU gone): an error, not a hang.
	if s := sampleVCPUs(filepath.Join(t.TempDir(), "none"), time.Second, 0); s.err == nil {
		t.Error("missing monitor socket: no error")
	}
}

func TestParseRegisters(t *testing.T) {
	got := parseRegisters(registersAnswer("ffffffff810a1b2c"))
	want := []vcpuRegs{
		{CPU: 0, RIP: 0xffffffff81002c23, RFlags: 0x246, Halted: true},
		{CPU: 1, RIP: 0xffffffff810a1b2c, RFlags: 0x86},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("vCPU %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	// 32-bit mode (a vCPU still in the firmware) names them EIP and EFL;
	// a vCPU line with a bad number and text without vCPUs are skipped.
	got = parseRegisters("CPU#0\r\nEIP=000f01e1 EFL=00000006 [-----P-] CPL=0 II=0 A20=1 SMM=0 HLT=1\r\n" +
		"CPU#1\r\nRIP=zz RFL=00000246 CPL=0 HLT=0\r\nRIP=ffffffff81000000 (no CPU line)\r\n")
	if len(got) != 1 || got[0] != (vcpuRegs{CPU: 0, RIP: 0xf01e1, RFlags: 6, Halted: true}) {
		t.Errorf("32-bit and bad lines: got %+v", got)
	}
}

// TestSpinning: only a sample in which every vCPU ran with interrupts off
// at the same address in both answers is a certain hang; a halted vCPU,
// interrupts on, a vCPU that moved or one missing from an answer is not.
func TestSpinning(t *testing.T) {
	spin := func(cpu int, rip uint64) vcpuRegs { return vcpuRegs{CPU: cpu, RIP: rip, RFlags: 0x86} }
	a, b := spin(0, 0xffffffff8135c252), spin(1, 0xffffffff8108d82f)
	halted, irqOn, moved := b, b, b
	halted.Halted = true
	irqOn.RFlags |= 0x200
	moved.RIP += 4
	for _, tc := range []struct {
		name          string
		first, second []vcpuRegs
		want          bool
	}{
		{"both spin", []vcpuRegs{a, b}, []vcpuRegs{a, b}, true},
		{"one vCPU spins", []vcpuRegs{a}, []vcpuRegs{a}, true},
		{"one halted", []vcpuRegs{a, b}, []vcpuRegs{a, halted}, false},
		{"interrupts on", []vcpuRegs{a, irqOn}, []vcpuRegs{a, irqOn}, false},
		{"one moved", []vcpuRegs{a, b}, []vcpuRegs{a, moved}, false},
		{"one missing later", []vcpuRegs{a, b}, []vcpuRegs{a}, false},
		{"other vCPU later", []vcpuRegs{a, b}, []vcpuRegs{a, spin(2, b.RIP)}, false},
		{"no vCPUs", nil, nil, false},
	} {
		if got := (vcpuSample{first: tc.first, second: tc.second}).spinning(); got != tc.want {
			t.Errorf("%s: spinning %v, want %v", tc.name, got, tc.want)
		}
	}
	if (vcpuSample{first: []vcpuRegs{a}, second: []vcpuRegs{a}, err: net.ErrClosed}).spinning() {
		t.Error("a sample with an error: spinning")
	}
	// The fake monitor's vCPU 0 is halted: not spinning.
	s := sampleVCPUs(fakeMonitor(t, false, registersAnswer("ffffffff810a1b2c"), registersAnswer("ffffffff810a1b2c")), 5*time.Second, 0)
	if s.err != nil || s.spinning() {
		t.Errorf("halted vCPU 0 from the monitor: spinning %v (err %v), want false", s.spinning(), s.err)
	}
}
