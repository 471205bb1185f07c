package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// cyclesConfig is one start/stop soak: Cycles machines started and stopped
// one after the other in this process through the Go API.
type cyclesConfig struct {
	Guest   string `json:"guest"`   // the test guest ELF
	Cycles  int    `json:"cycles"`  // machines started and stopped
	Every   int    `json:"every"`   // measure after every Every cycles
	Payload int    `json:"payload"` // bytes echoed through vsock per cycle
	Memory  uint64 `json:"memory"`  // guest RAM
	// CheckMemory applies the RSS and VmSize bounds (between the middle
	// and the last sample); meaningful only over hundreds of cycles.
	CheckMemory bool `json:"check_memory"`
}

// Leak bounds of the start/stop soak. A leak of one descriptor or
// goroutine per cycle passes a small constant after a few cycles; memory
// is judged over the second half only (the heap and the allocator's
// caches grow to their working size in the first), against about one
// guest's RAM: a guest mapping never unmapped, or 64 KiB a cycle kept,
// crosses it within 500 cycles.
const (
	leakSlackFDs        = 2
	leakSlackGoroutines = 2
	leakSlackMemory     = 64 << 20
)

// cyclePhase is where one cycle's time went, in milliseconds: New, Run
// to the guest listening, the connection and its echo, the stop (the
// guest's exit after the close, or Run's return after the cancel), and
// Close.
type cyclePhase struct {
	Cycle  int        `json:"cycle"`
	Cancel bool       `json:"cancel"`
	Ms     [5]float64 `json:"ms_new_boot_echo_stop_close"`
}

// cycleSample is the process measured after Cycle cycles.
type cycleSample struct {
	Cycle int `json:"cycle"`
	usage
}

// cyclesResult is what a start/stop soak measured.
type cyclesResult struct {
	Config  cyclesConfig  `json:"config"`
	Samples []cycleSample `json:"samples"`
	// CycleMs are the fastest, median and slowest cycle in milliseconds:
	// New, boot to listening, a vsock connection and its echo, the stop
	// (guest exit or cancel) and Close.
	CycleMs [3]float64 `json:"cycle_ms_min_median_max"`
	// P99Ms is the 99th percentile cycle, Over1s how many cycles took
	// more than a second, and Slowest the slowest cycle's phases.
	P99Ms     float64    `json:"cycle_ms_p99"`
	Over1s    int        `json:"cycles_over_1s"`
	Slowest   cyclePhase `json:"slowest"`
	Exited    int        `json:"cycles_guest_exited"`   // cycles that ended by the guest's exit (the connection closed)
	Canceled  int        `json:"cycles_canceled"`       // cycles stopped by canceling Run with the connection open
	EchoBytes int64      `json:"echo_bytes_checked"`    // bytes echoed and compared, both ways counted once
	Failures  []string   `json:"failures,omitempty"`    // leak bounds crossed
	Elapsed   float64    `json:"elapsed_s"`             // the whole soak
	NoFile    uint64     `json:"rlimit_nofile"`         // the soft RLIMIT_NOFILE in force
	Warmup    string     `json:"warmup"`                // what ran before sample 0
	HostKVM   string     `json:"host_kvm"`              // testenv.Host
	Notes     []string   `json:"notes,omitempty"`       // how to read the figures
	Dates     [2]string  `json:"start_end,omitempty"`   // RFC 3339
	Threshold [3]uint64  `json:"bounds_fds_gor_memory"` // the leak bounds applied
}

// runCycles starts and stops cfg.Cycles machines one after the other. Each
// cycle: New, Run on a goroutine, wait for the guest to listen, connect
// through the vsock Unix socket, echo cfg.Payload random bytes and compare;
// then even cycles close the connection, so the guest (conns=1) exits by
// itself, and odd ones cancel Run with the connection still open, so the
// stop path has a live connection to tear down (the host end must see end
// of stream); then Close, which must remove the socket file. One cycle runs
// first as a warm-up (it opens what a process opens once: Go's netpoller,
// the first KVM handles' caches); then the process is measured after 0
// cycles and every cfg.Every. A sample waits up to 2 s for goroutines to
// come back down to the first sample's count.
//
// It returns an error for a cycle that failed; leak bounds crossed go in
// Failures (fds or goroutines grown by more than the slack over the run;
// with CheckMemory, RSS or VmSize grown by more than leakSlackMemory in the
// second half).
func runCycles(cfg cyclesConfig, progress io.Writer) (*cyclesResult, error) {
	if cfg.Every <= 0 {
		cfg.Every = max(cfg.Cycles/10, 1)
	}
	if cfg.Memory == 0 {
		cfg.Memory = 32 << 20
	}
	res := &cyclesResult{Config: cfg, Warmup: "one cycle", HostKVM: testenv.Host().String(),
		Threshold: [3]uint64{leakSlackFDs, leakSlackGoroutines, leakSlackMemory}}
	var err error
	if res.NoFile, err = raiseNoFile(1024); err != nil {
		return nil, err
	}
	dir, err := socketDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	uds := socketPath(dir, "v.sock")
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, cfg.Payload)
	var ph cyclePhase
	cycle := func(i int) error {
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		ph = cyclePhase{Cycle: i, Cancel: i%2 == 1}
		return oneCycle(cfg, uds, buf, ph.Cancel, &ph)
	}
	if err := cycle(0); err != nil {
		return nil, fmt.Errorf("warm-up cycle: %w", err)
	}
	start := time.Now()
	res.Dates[0] = start.Format(time.RFC3339)
	time.Sleep(200 * time.Millisecond) // the warm-up's last goroutines end
	u0, err := settle(0, 0)
	if err != nil {
		return nil, err
	}
	res.Samples = append(res.Samples, cycleSample{0, u0})
	var times []float64
	for i := 1; i <= cfg.Cycles; i++ {
		t0 := time.Now()
		if err := cycle(i); err != nil {
			return res, fmt.Errorf("cycle %d: %w", i, err)
		}
		ms := float64(time.Since(t0).Microseconds()) / 1000
		times = append(times, ms)
		if ms > 1000 {
			res.Over1s++
		}
		if ms >= slices.Max(times) {
			res.Slowest = ph
		}
		if i%2 == 1 {
			res.Canceled++
		} else {
			res.Exited++
		}
		res.EchoBytes += int64(cfg.Payload)
		if i%cfg.Every == 0 || i == cfg.Cycles {
			u, err := settle(u0.Goroutines, 2*time.Second)
			if err != nil {
				return res, err
			}
			res.Samples = append(res.Samples, cycleSample{i, u})
			if progress != nil {
				fmt.Fprintf(progress, "soak cycles: %d/%d: fds %d, goroutines %d, RSS %s MiB\n", i, cfg.Cycles, u.FDs, u.Goroutines, mib(u.RSS))
			}
		}
	}
	res.Elapsed = time.Since(start).Seconds()
	res.Dates[1] = time.Now().Format(time.RFC3339)
	slices.Sort(times)
	if len(times) > 0 {
		res.CycleMs = [3]float64{times[0], times[len(times)/2], times[len(times)-1]}
		res.P99Ms = times[min(len(times)*99/100, len(times)-1)]
	}
	res.Failures = cycleLeaks(res.Samples, cfg.CheckMemory)
	return res, nil
}

// cycleLeaks judges the samples against the leak bounds.
func cycleLeaks(s []cycleSample, memory bool) []string {
	if len(s) < 2 {
		return nil
	}
	var out []string
	first, mid, last := s[0], s[len(s)/2], s[len(s)-1]
	if d := last.FDs - first.FDs; d > leakSlackFDs {
		out = append(out, fmt.Sprintf("open descriptors grew by %d over %d cycles (%d -> %d)", d, last.Cycle, first.FDs, last.FDs))
	}
	if d := last.Goroutines - first.Goroutines; d > leakSlackGoroutines {
		out = append(out, fmt.Sprintf("goroutines grew by %d over %d cycles (%d -> %d)", d, last.Cycle, first.Goroutines, last.Goroutines))
	}
	if memory {
		if last.RSS > mid.RSS+leakSlackMemory {
			out = append(out, fmt.Sprintf("RSS grew by %s MiB between cycles %d and %d", mib(last.RSS-mid.RSS), mid.Cycle, last.Cycle))
		}
		if last.VmSize > mid.VmSize+leakSlackMemory {
			out = append(out, fmt.Sprintf("VmSize grew by %s MiB between cycles %d and %d", mib(last.VmSize-mid.VmSize), mid.Cycle, last.Cycle))
		}
	}
	return out
}

// oneCycle is one machine's life: see runCycles.
func oneCycle(cfg cyclesConfig, uds string, payload []byte, cancel bool, ph *cyclePhase) (err error) {
	cmdline := fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", guestPort)
	t := time.Now()
	lap := func(i int) {
		ph.Ms[i] = float64(time.Since(t).Microseconds()) / 1000
		t = time.Now()
	}
	v, err := startVM(cfg.Guest, cmdline, uds, cfg.Memory)
	if err != nil {
		return err
	}
	lap(0)
	defer func() {
		t = time.Now()
		if cerr := v.close(); err == nil {
			err = cerr
		}
		lap(4)
	}()
	stopped := false
	defer func() {
		if !stopped {
			_ = v.stop(10 * time.Second)
		}
	}()
	if err := v.waitListening(guestPort, 20*time.Second); err != nil {
		return err
	}
	lap(1)
	c, _, err := testenv.VsockConnect(uds, guestPort, 10*time.Second)
	if err != nil {
		return fmt.Errorf("connect: %w%s", err, v.output())
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := echoOnce(c, payload); err != nil {
		return fmt.Errorf("echo: %w%s", err, v.output())
	}
	lap(2)
	if cancel {
		stopped = true
		if err := v.stop(10 * time.Second); err != nil {
			return err
		}
		lap(3)
		// Run closed the device: the host end must see the end.
		if _, err := readAll(c); err != nil {
			return fmt.Errorf("host end after the stop: %w", err)
		}
		return nil
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	if n, err := readAll(c); err != nil || n != 0 {
		return fmt.Errorf("after half-close: %d more bytes, %v%s", n, err, v.output())
	}
	stopped = true
	err = v.wait(0, 20*time.Second)
	lap(3)
	return err
}

// echoOnce writes p and reads the same bytes back.
func echoOnce(c net.Conn, p []byte) error {
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(p)
		werr <- err
	}()
	got := make([]byte, len(p))
	_, rerr := io.ReadFull(c, got)
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if rerr != nil {
		return fmt.Errorf("read: %w", rerr)
	}
	if !bytes.Equal(got, p) {
		return fmt.Errorf("the %d bytes echoed differ from those sent", len(p))
	}
	return nil
}
