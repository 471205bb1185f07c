package kvmbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// The L1's vCPUs at a stall, from QEMU's human monitor. A box whose L1
// stops sending its heartbeat leaves no trace in its console (Docker boxes
// lost this way in CI had nothing after their boot), so before Run kills
// QEMU it asks the monitor for every vCPU's registers, twice, a second
// apart: a vCPU halted with interrupts on is waiting for an interrupt that
// never came, one at the same address with interrupts off is spinning, and
// a monitor that does not answer means QEMU itself is stuck, not the L1.
// The samples go into the console log and a summary into the box's error.

// monitorPrompt ends every answer of QEMU's human monitor, on a line of
// its own (the echo of a typed command, with its cursor moves, has no
// newline before the prompt).
const monitorPrompt = "\n(qemu) "

// vcpuRegs is one vCPU's state from `info registers`.
type vcpuRegs struct {
	CPU    int
	RIP    uint64
	RFlags uint64
	CPL    int
	Halted bool
}

// interruptsOn is RFLAGS.IF.
func (r vcpuRegs) interruptsOn() bool { return r.RFlags&0x200 != 0 }

// monitor is a connection to QEMU's human monitor on a Unix socket.
type monitor struct {
	conn net.Conn
	r    *bufio.Reader
}

// dialMonitor connects and reads the banner up to the first prompt, all
// within timeout.
func dialMonitor(path string, timeout time.Duration) (*monitor, error) {
	conn, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return nil, fmt.Errorf("QEMU monitor: %w", err)
	}
	m := &monitor{conn: conn, r: bufio.NewReader(conn)}
	if _, err := m.readAnswer(time.Now().Add(timeout)); err != nil {
		conn.Close()
		return nil, err
	}
	return m, nil
}

func (m *monitor) Close() error { return m.conn.Close() }

// command sends one command line and returns the monitor's answer (the
// echoed command included), failing when no prompt follows within timeout.
func (m *monitor) command(cmd string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	if err := m.conn.SetWriteDeadline(deadline); err != nil {
		return "", err
	}
	if _, err := m.conn.Write([]byte(cmd + "\n")); err != nil {
		return "", fmt.Errorf("QEMU monitor: %s: %w", cmd, err)
	}
	return m.readAnswer(deadline)
}

// readAnswer reads until the prompt; the answer is bounded (64 KiB) so a
// monitor that talks without end cannot grow the host's memory.
func (m *monitor) readAnswer(deadline time.Time) (string, error) {
	const limit = 64 << 10
	if err := m.conn.SetReadDeadline(deadline); err != nil {
		return "", err
	}
	var b bytes.Buffer
	for b.Len() < limit {
		c, err := m.r.ReadByte()
		if err != nil {
			return b.String(), fmt.Errorf("QEMU monitor: no prompt: %w", err)
		}
		b.WriteByte(c)
		if bytes.HasSuffix(b.Bytes(), []byte(monitorPrompt)) {
			return b.String(), nil
		}
	}
	return b.String(), errors.New("QEMU monitor: answer longer than 64 KiB")
}

// parseRegisters reads `info registers -a`: "CPU#N" starts a vCPU, its
// "RIP=... RFL=... CPL=... HLT=..." line gives its state ("EIP=... EFL=..."
// in 32-bit mode). Lines it does not know are skipped; a vCPU without that
// line is left out.
func parseRegisters(s string) []vcpuRegs {
	var out []vcpuRegs
	cpu := -1
	for _, line := range strings.Split(strings.ReplaceAll(s, "\r", ""), "\n") {
		line = strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(line, "CPU#"); ok {
			if v, err := strconv.Atoi(strings.TrimSpace(n)); err == nil {
				cpu = v
			}
			continue
		}
		if cpu < 0 || !(strings.HasPrefix(line, "RIP=") || strings.HasPrefix(line, "EIP=")) {
			continue
		}
		r := vcpuRegs{CPU: cpu}
		ok := true
		for _, f := range strings.Fields(line) {
			k, v, found := strings.Cut(f, "=")
			if !found {
				continue
			}
			var err error
			switch k {
			case "RIP", "EIP":
				r.RIP, err = strconv.ParseUint(v, 16, 64)
			case "RFL", "EFL":
				r.RFlags, err = strconv.ParseUint(v, 16, 64)
			case "CPL":
				r.CPL, err = strconv.Atoi(v)
			case "HLT":
				r.Halted = v == "1"
			}
			if err != nil {
				ok = false
			}
		}
		if ok {
			out = append(out, r)
		}
		cpu = -1
	}
	return out
}

// summarizeRegisters is the error's clause: each vCPU of the first sample,
// and whether the second found it at the same address. "" without samples.
func summarizeRegisters(first, second []vcpuRegs) string {
	later := map[int]vcpuRegs{}
	for _, r := range second {
		later[r.CPU] = r
	}
	var parts []string
	for _, r := range first {
		state := "running"
		if r.Halted {
			state = "halted"
		}
		irq := "interrupts off"
		if r.interruptsOn() {
			irq = "interrupts on"
		}
		p := fmt.Sprintf("vCPU %d %s at %#x (CPL %d, %s", r.CPU, state, r.RIP, r.CPL, irq)
		if l, ok := later[r.CPU]; ok {
			if l.RIP == r.RIP && l.Halted == r.Halted {
				p += ", unchanged 1 s later"
			} else {
				p += fmt.Sprintf(", 1 s later at %#x", l.RIP)
			}
		}
		parts = append(parts, p+")")
	}
	return strings.Join(parts, "; ")
}

// vcpuSample is what QEMU's monitor said about the L1's vCPUs: two
// answers to `info registers -a`, a gap apart.
type vcpuSample struct {
	raw           string // both answers, for the console log
	first, second []vcpuRegs
	err           error // why there are no samples (a monitor that does not answer: QEMU's main loop is stuck)
}

// sampleVCPUs asks the monitor at path for two samples of every vCPU's
// registers, gap apart, each answer within timeout.
func sampleVCPUs(path string, timeout, gap time.Duration) vcpuSample {
	m, err := dialMonitor(path, timeout)
	if err != nil {
		return vcpuSample{err: err}
	}
	defer m.Close()
	a, err := m.command("info registers -a", timeout)
	if err != nil {
		return vcpuSample{raw: a, err: err}
	}
	time.Sleep(gap) // the second sample is the point: has anything moved?
	b, err := m.command("info registers -a", timeout)
	if err != nil {
		return vcpuSample{raw: a + b, err: err}
	}
	s := vcpuSample{raw: a + b, first: parseRegisters(a), second: parseRegisters(b)}
	if len(s.first) == 0 {
		s.err = errors.New("QEMU monitor: no vCPU registers in its answer")
	}
	return s
}

// summary is the box error's clause ("" without samples).
func (s vcpuSample) summary() string {
	if s.err != nil {
		return ""
	}
	return summarizeRegisters(s.first, s.second)
}

// spinning says the L1 cannot beat again: every vCPU was running with
// interrupts off at the same address in both samples, so no timer
// interrupt can reach its scheduler (the shape of every silent L1 stall
// seen, docs/testing.md). A halted vCPU, one with interrupts on or one
// that moved may yet recover, so it is not spinning.
func (s vcpuSample) spinning() bool {
	if s.err != nil || len(s.first) == 0 || len(s.second) != len(s.first) {
		return false
	}
	later := map[int]vcpuRegs{}
	for _, r := range s.second {
		later[r.CPU] = r
	}
	for _, r := range s.first {
		l, ok := later[r.CPU]
		if !ok || r.Halted || l.Halted || r.interruptsOn() || l.interruptsOn() || l.RIP != r.RIP {
			return false
		}
	}
	return true
}

// monitorTimeout bounds each of the monitor's answers at a stall.
const monitorTimeout = 5 * time.Second

// appendConsole adds the monitor's samples (or why there are none) to the
// console log after QEMU ended, so the kept log carries them.
func appendConsole(path, regs string, regsErr error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "\nkvmbox: the L1's vCPUs from QEMU's monitor (`info registers -a`, two samples 1 s apart):\n")
	if regsErr != nil {
		fmt.Fprintf(f, "kvmbox: %v\n", regsErr)
	}
	fmt.Fprint(f, strings.ReplaceAll(regs, "\r", ""))
	fmt.Fprintln(f)
}
