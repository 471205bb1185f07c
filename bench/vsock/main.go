// Command vsock measures microvm's virtio-vsock data path with the bundled
// test guest, next to a host-only AF_UNIX socket pair moving the same bytes.
//
//	go run ./bench/vsock [-microvm bin/microvm] [-guest bin/testguest] [-reps 5] [-scale 1]
//	    [-idle 2s] [-conn-buffer SIZE] [-bufsize N] [-vsock-opt LIST] [-json build/bench/vsock.json]
//
// For 64 B, 4 KiB and 64 KiB I/O sizes and both directions it runs a fresh
// microvm per transfer:
//
//   - host->guest: the guest runs testguest.mode=sink; the host writes N
//     bytes in writes of the size, half-closes, and stops the clock when the
//     guest's SHUTDOWN closes the stream (the guest has consumed everything).
//     Checked: the guest's stats line counts exactly N bytes received.
//   - guest->host: the guest runs testguest.mode=source testguest.bytes=N;
//     the host reads to EOF with reads of the size and checks every byte
//     against the guest's pattern. Checked: N bytes, pattern intact, the
//     guest counts N bytes sent.
//
// A run that fails a check, or whose microvm does not exit 0, is reported
// as failed and never timed, so a broken run cannot look fast.
//
// Per run it reports Gbit/s, messages/s (N divided by the I/O size, per
// second), and the CPU time (utime+stime from /proc/<pid>/stat) of the
// microvm process and of its vCPU thread over the timed window. The vCPU
// thread is the thread whose guest_time (stat field 43) grew: the kernel
// charges guest_time only to a thread inside KVM_RUN while the guest runs
// (see proc.go). The AF_UNIX baseline moves the same bytes with the same
// I/O sizes between two goroutines of this process over socketpair(2); the
// ratio column is vsock/AF_UNIX throughput.
//
// It also measures an idle guest (listening, no connection) for the cost
// of the paravirtual wait port when nothing happens, and repeats the 4 KiB
// rows and the idle guest with testguest.wait=0 (the guest polls instead of
// sleeping on the port) for a second table: port on against off
// (docs/benchmarks.md).
//
// It is a measurement, not a test: it exits 1 only when runs failed.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

// Direction of a transfer.
const (
	hostToGuest = "host->guest"
	guestToHost = "guest->host"
)

// sizes are the I/O sizes measured, and baseBytes how much each transfer of
// that size moves at -scale 1: enough for about a second here (10 ms CPU
// clock ticks make shorter windows coarse), so that the whole benchmark
// takes a few minutes.
var (
	sizes     = []int{64, 4 << 10, 64 << 10}
	baseBytes = map[int]int64{64: 32 << 20, 4 << 10: 256 << 20, 64 << 10: 1 << 30}
)

// transferLimit bounds one transfer: at -scale 1 the slowest takes a few
// seconds here.
const transferLimit = 5 * time.Minute

// rate is the throughput of one timed transfer.
type rate struct {
	Seconds  float64 `json:"seconds"`
	Gbps     float64 `json:"gbit_per_s"`
	MsgsPerS float64 `json:"msgs_per_s"`
}

// vsockSample is one timed transfer through microvm.
type vsockSample struct {
	rate
	VMMCPU    float64 `json:"vmm_cpu_s"`          // utime+stime of the microvm process
	VCPUCPU   float64 `json:"vcpu_cpu_s"`         // utime+stime of its vCPU thread
	GuestTime float64 `json:"vcpu_guest_s"`       // guest_time of the vCPU thread (part of vcpu_cpu_s)
	VCPUTID   string  `json:"vcpu_tid"`           // the vCPU thread
	VCPUHow   string  `json:"vcpu_identified_by"` // how it was found (proc.go)
	Threads   int     `json:"vmm_threads"`
	Waits     uint64  `json:"guest_waits"` // the guest's wait-port writes (its stats line)
}

// unixSample is one timed transfer over the AF_UNIX socket pair.
type unixSample struct {
	rate
	HostCPU float64 `json:"host_cpu_s"` // this process's utime+stime (both ends)
}

// row is one direction and size: every run of both transports.
type row struct {
	Dir      string        `json:"direction"`
	Size     int           `json:"io_size"`
	Bytes    int64         `json:"bytes"`
	Vsock    []vsockSample `json:"vsock"`
	Unix     []unixSample  `json:"af_unix"`
	Failures []string      `json:"failures,omitempty"`
	// Median is the vsock run with the median throughput; UnixMedian the
	// AF_UNIX one.
	Median     *vsockSample `json:"vsock_median,omitempty"`
	UnixMedian *unixSample  `json:"af_unix_median,omitempty"`
	Ratio      float64      `json:"ratio_vsock_af_unix,omitempty"`
}

type report struct {
	Date    string            `json:"date"`
	Host    map[string]string `json:"host"`
	MicroVM string            `json:"microvm"`
	Guest   string            `json:"guest"`
	Reps    int               `json:"reps"`
	// ConnBuffer and GuestBufsize are the -conn-buffer and -bufsize flags
	// (empty, 0: the defaults).
	ConnBuffer   string       `json:"conn_buffer,omitempty"`
	GuestBufsize int          `json:"guest_bufsize,omitempty"`
	VsockOpt     string       `json:"vsock_opt,omitempty"` // -vsock-opt
	Rows         []*row       `json:"rows"`
	Idle         *vsockSample `json:"idle,omitempty"`
	IdleErr      string       `json:"idle_error,omitempty"`
	// NoWait repeats the 4 KiB rows and the idle guest with the test
	// guest's paravirtual wait port off (testguest.wait=0: pure polling).
	NoWait     []*row       `json:"no_wait,omitempty"`
	IdleNoWait *vsockSample `json:"idle_no_wait,omitempty"`
	Notes      []string     `json:"notes"`
}

func main() {
	microvm := flag.String("microvm", "bin/microvm", "microvm binary")
	guest := flag.String("guest", "bin/testguest", "test guest ELF")
	reps := flag.Int("reps", 5, "runs per direction, size and transport (the median is shown)")
	scale := flag.Float64("scale", 1, "multiply every transfer's byte count")
	jsonOut := flag.String("json", "build/bench/vsock.json", "write the results here (empty: don't)")
	idle := flag.Duration("idle", 2*time.Second, "how long to measure the idle guest (0: skip)")
	connBuf := flag.String("conn-buffer", "", "microvm --vsock-conn-buffer (empty: microvm's default)")
	bufsize := flag.Int("bufsize", 0, "testguest.bufsize, the guest's RX buffer payload (0: the guest's default)")
	vsockOpt := flag.String("vsock-opt", "", "microvm --vsock-opt, the optimisation switches (empty: microvm's defaults)")
	flag.Parse()
	tgt := target{microvm: *microvm, guest: *guest, connBuffer: *connBuf, bufsize: *bufsize, vsockOpt: *vsockOpt}
	for _, p := range []string{*microvm, *guest} {
		if _, err := os.Stat(p); err != nil {
			fmt.Fprintf(os.Stderr, "vsock bench: %v (make bin/microvm bin/testguest)\n", err)
			os.Exit(2)
		}
	}
	rep := &report{Date: time.Now().Format(time.RFC3339), Host: benchenv.HostInfo(), MicroVM: *microvm, Guest: *guest, Reps: *reps,
		ConnBuffer: *connBuf, GuestBufsize: *bufsize, VsockOpt: *vsockOpt,
		Notes: []string{
			"msgs_per_s: bytes / io_size per second (host writes for host->guest, host reads of io_size for guest->host)",
			"cpu times: utime+stime from /proc (10 ms ticks) over the timed window; vCPU thread = the thread whose guest_time grew",
			"no_wait: the same transfers with testguest.wait=0, the guest polling without ever sleeping on the wait port",
		}}
	failed := false
	for _, dir := range []string{hostToGuest, guestToHost} {
		for _, size := range sizes {
			r := &row{Dir: dir, Size: size, Bytes: int64(float64(baseBytes[size]) * *scale)}
			for i := 0; i < *reps; i++ {
				s, err := runVsock(tgt, dir, size, r.Bytes)
				if err != nil {
					r.Failures = append(r.Failures, err.Error())
					fmt.Fprintf(os.Stderr, "FAILED vsock %s %d B: %v\n", dir, size, err)
				} else {
					r.Vsock = append(r.Vsock, s)
				}
				u, err := runUnix(dir, size, r.Bytes)
				if err != nil {
					r.Failures = append(r.Failures, "af_unix: "+err.Error())
					fmt.Fprintf(os.Stderr, "FAILED af_unix %s %d B: %v\n", dir, size, err)
				} else {
					r.Unix = append(r.Unix, u)
				}
			}
			r.Median, r.UnixMedian = median(r.Vsock, vsockSample.gbps), median(r.Unix, unixSample.gbps)
			if r.Median != nil && r.UnixMedian != nil {
				r.Ratio = r.Median.Gbps / r.UnixMedian.Gbps
			}
			failed = failed || len(r.Failures) > 0
			rep.Rows = append(rep.Rows, r)
			fmt.Fprintf(os.Stderr, "done %s %s\n", dir, sizeName(size))
		}
	}
	// The paravirtual wait port on and off, at one size in each direction.
	off := tgt
	off.nowait = true
	for _, dir := range []string{hostToGuest, guestToHost} {
		size := 4096
		r := &row{Dir: dir, Size: size, Bytes: int64(float64(baseBytes[size]) * *scale)}
		for i := 0; i < *reps; i++ {
			s, err := runVsock(off, dir, size, r.Bytes)
			if err != nil {
				r.Failures = append(r.Failures, err.Error())
				fmt.Fprintf(os.Stderr, "FAILED vsock wait=0 %s %d B: %v\n", dir, size, err)
				continue
			}
			r.Vsock = append(r.Vsock, s)
		}
		r.Median = median(r.Vsock, vsockSample.gbps)
		failed = failed || len(r.Failures) > 0
		rep.NoWait = append(rep.NoWait, r)
	}
	if *idle > 0 {
		if s, err := runIdle(off, *idle); err == nil {
			rep.IdleNoWait = &s
		} else {
			fmt.Fprintf(os.Stderr, "FAILED idle wait=0: %v\n", err)
			failed = true
		}
	}
	if *idle > 0 {
		s, err := runIdle(tgt, *idle)
		if err != nil {
			rep.IdleErr = err.Error()
			fmt.Fprintf(os.Stderr, "FAILED idle: %v\n", err)
			failed = true
		} else {
			rep.Idle = &s
		}
	}
	rep.print(os.Stdout)
	if *jsonOut != "" {
		if err := benchenv.WriteJSON(*jsonOut, rep); err != nil {
			fmt.Fprintf(os.Stderr, "vsock bench: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", *jsonOut)
	}
	if failed {
		os.Exit(1)
	}
}

// runVsock times one transfer through a fresh microvm.
func runVsock(tgt target, dir string, size int, total int64) (vsockSample, error) {
	cmdline := fmt.Sprintf("testguest.mode=sink testguest.port=%d testguest.conns=1", guestPort)
	if dir == guestToHost {
		cmdline = fmt.Sprintf("testguest.mode=source testguest.port=%d testguest.bytes=%d testguest.conns=1", guestPort, total)
	}
	v, err := startVM(tgt, cmdline)
	if err != nil {
		return vsockSample{}, err
	}
	fail := func(err error) (vsockSample, error) {
		v.kill()
		return vsockSample{}, err
	}
	before, err := snapshot(v.pid())
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	c, err := v.connect(guestPort)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	// A stalled transfer fails instead of hanging the benchmark.
	_ = c.SetDeadline(start.Add(transferLimit))
	var n int64
	switch dir {
	case hostToGuest:
		if _, err := send(c, total, size); err != nil {
			return fail(err)
		}
		if err := c.CloseWrite(); err != nil {
			return fail(err)
		}
		// The sink answers our SHUTDOWN(SEND) with SHUTDOWN(both) once it
		// has consumed every byte: EOF here ends the transfer.
		if m, _, err := receive(c, maxIO, false); err != nil || m != 0 {
			return fail(fmt.Errorf("waiting for the guest's shutdown: %d bytes, %v", m, err))
		}
		n = total
	case guestToHost:
		if n, _, err = receive(c, size, true); err != nil {
			return fail(err)
		}
		if n != total {
			return fail(fmt.Errorf("received %d bytes, want %d", n, total))
		}
	}
	el := time.Since(start)
	after, err := snapshot(v.pid())
	if err != nil {
		return fail(err)
	}
	c.Close() // the device resets the guest's connection; the guest exits 0
	if err := v.wait(30 * time.Second); err != nil {
		return vsockSample{}, err
	}
	gs, err := v.stats()
	if err != nil {
		return vsockSample{}, fmt.Errorf("%w\n%s", err, v.output())
	}
	if dir == hostToGuest && gs.RxBytes != uint64(total) {
		return vsockSample{}, fmt.Errorf("guest received %d bytes, host sent %d", gs.RxBytes, total)
	}
	if dir == guestToHost && gs.TxBytes != uint64(total) {
		return vsockSample{}, fmt.Errorf("guest sent %d bytes, host received %d", gs.TxBytes, total)
	}
	u := usage(before, after)
	s := vsockSample{rate: rates(n, size, el)}
	s.VMMCPU, s.VCPUCPU, s.GuestTime = u.VMM.Seconds(), u.VCPU.Seconds(), u.Guest.Seconds()
	s.VCPUTID, s.VCPUHow, s.Threads, s.Waits = u.VCPUTID, u.VCPUHow, u.NThreads, gs.Waits
	return s, nil
}

// runUnix moves the same bytes over an AF_UNIX socket pair: the writer
// stands in for the sending side (host client or source guest, which sends
// up to 64 KiB at a time), the reader for the receiving side.
func runUnix(dir string, size int, total int64) (unixSample, error) {
	a, b, err := unixPair()
	if err != nil {
		return unixSample{}, err
	}
	defer a.Close()
	defer b.Close()
	wsize, rsize, check := size, maxIO, false
	if dir == guestToHost {
		wsize, rsize, check = maxIO, size, true
	}
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	werr := make(chan error, 1)
	go func() {
		_, err := send(a, total, wsize)
		if err == nil {
			err = a.CloseWrite()
		}
		werr <- err
	}()
	n, _, rerr := receive(b, rsize, check)
	el := time.Since(start)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	if err := <-werr; err != nil {
		return unixSample{}, err
	}
	if rerr != nil {
		return unixSample{}, rerr
	}
	if n != total {
		return unixSample{}, fmt.Errorf("received %d bytes, want %d", n, total)
	}
	s := unixSample{rate: rates(n, size, el)}
	cpu := func(r *syscall.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	s.HostCPU = (cpu(&ru1) - cpu(&ru0)).Seconds()
	return s, nil
}

// runIdle measures a guest that listens with nothing to do: the vCPU
// sleeps on the wait port between 1 ms timeouts.
func runIdle(tgt target, d time.Duration) (vsockSample, error) {
	v, err := startVM(tgt, fmt.Sprintf("testguest.mode=sink testguest.port=%d testguest.conns=1", guestPort))
	if err != nil {
		return vsockSample{}, err
	}
	before, err := snapshot(v.pid())
	if err != nil {
		v.kill()
		return vsockSample{}, err
	}
	start := time.Now()
	time.Sleep(d)
	after, err := snapshot(v.pid())
	el := time.Since(start)
	if err != nil {
		v.kill()
		return vsockSample{}, err
	}
	// One empty connection ends the guest with status 0.
	c, err := v.connect(guestPort)
	if err != nil {
		v.kill()
		return vsockSample{}, err
	}
	_ = c.CloseWrite()
	_, _, _ = receive(c, maxIO, false)
	c.Close()
	if err := v.wait(30 * time.Second); err != nil {
		return vsockSample{}, err
	}
	gs, err := v.stats()
	if err != nil {
		return vsockSample{}, err
	}
	u := usage(before, after)
	return vsockSample{rate: rate{Seconds: el.Seconds()}, VMMCPU: u.VMM.Seconds(), VCPUCPU: u.VCPU.Seconds(), GuestTime: u.Guest.Seconds(),
		VCPUTID: u.VCPUTID, VCPUHow: u.VCPUHow, Threads: u.NThreads, Waits: gs.Waits}, nil
}

func rates(n int64, size int, el time.Duration) rate {
	sec := el.Seconds()
	return rate{Seconds: sec, Gbps: float64(n) * 8 / sec / 1e9, MsgsPerS: float64(n) / float64(size) / sec}
}

func (s vsockSample) gbps() float64 { return s.Gbps }
func (s unixSample) gbps() float64  { return s.Gbps }

// median returns the sample with the median throughput (the lower middle
// one for an even count), nil for none.
func median[T any](s []T, gbps func(T) float64) *T {
	if len(s) == 0 {
		return nil
	}
	c := append([]T(nil), s...)
	sort.Slice(c, func(i, j int) bool { return gbps(c[i]) < gbps(c[j]) })
	m := c[(len(c)-1)/2]
	return &m
}

func sizeName(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func bytesName(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

func pct(cpu, wall float64) string {
	return fmt.Sprintf("%.2f (%3.0f%%)", cpu, 100*cpu/wall)
}

func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "microvm vsock benchmark, %s\n", rep.Date)
	fmt.Fprintf(w, "host: %s, %s CPUs, kernel %s, %s\n", rep.Host["cpu"], rep.Host["cpus"], rep.Host["kernel"], rep.Host["kvm"])
	fmt.Fprintf(w, "median of %d runs per row (by throughput); CPU in seconds (%% of wall)\n\n", rep.Reps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "direction\tio size\tbytes\tGbit/s\tmsgs/s\twall s\tVMM CPU s\tvCPU CPU s\tguest waits\tAF_UNIX Gbit/s\tAF_UNIX msgs/s\tvsock/AF_UNIX\t")
	for _, r := range rep.Rows {
		cols := []string{r.Dir, sizeName(r.Size), bytesName(r.Bytes)}
		if m := r.Median; m != nil {
			cols = append(cols, fmt.Sprintf("%.3f", m.Gbps), fmt.Sprintf("%.0f", m.MsgsPerS), fmt.Sprintf("%.2f", m.Seconds),
				pct(m.VMMCPU, m.Seconds), pct(m.VCPUCPU, m.Seconds), fmt.Sprint(m.Waits))
		} else {
			cols = append(cols, "FAILED", "-", "-", "-", "-", "-")
		}
		if u := r.UnixMedian; u != nil {
			cols = append(cols, fmt.Sprintf("%.3f", u.Gbps), fmt.Sprintf("%.0f", u.MsgsPerS))
		} else {
			cols = append(cols, "FAILED", "-")
		}
		if r.Ratio > 0 {
			cols = append(cols, fmt.Sprintf("%.2f", r.Ratio))
		} else {
			cols = append(cols, "-")
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	}
	tw.Flush()
	if s := rep.Idle; s != nil {
		fmt.Fprintf(w, "\nidle guest (listening, no connection) for %.1f s: VMM CPU %s s, vCPU CPU %s s, guest waits %d (%.0f/s)\n",
			s.Seconds, pct(s.VMMCPU, s.Seconds), pct(s.VCPUCPU, s.Seconds), s.Waits, float64(s.Waits)/s.Seconds)
	}
	if rep.IdleErr != "" {
		fmt.Fprintf(w, "\nidle guest: FAILED: %s\n", rep.IdleErr)
	}
	for _, r := range rep.Rows {
		if m := r.Median; m != nil && m.VCPUHow != "guest_time grew" {
			fmt.Fprintf(w, "note: %s %s: vCPU thread %s identified by %s\n", r.Dir, sizeName(r.Size), m.VCPUTID, m.VCPUHow)
		}
		for _, f := range r.Failures {
			fmt.Fprintf(w, "FAILED %s %s: %s\n", r.Dir, sizeName(r.Size), f)
		}
	}
	if len(rep.NoWait) > 0 || rep.IdleNoWait != nil {
		fmt.Fprintln(w, "\nparavirtual wait port (0x600) on vs off (testguest.wait=0: the guest polls instead of sleeping):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "direction\tio\tGbit/s on\tGbit/s off\tvCPU CPU s on\tvCPU CPU s off\tVMM CPU s on\tVMM CPU s off\t")
		for _, nw := range rep.NoWait {
			var on *row
			for _, r := range rep.Rows {
				if r.Dir == nw.Dir && r.Size == nw.Size {
					on = r
				}
			}
			if on == nil || on.Median == nil || nw.Median == nil {
				fmt.Fprintf(tw, "%s\t%s\tFAILED\t\t\t\t\t\t\n", nw.Dir, sizeName(nw.Size))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", nw.Dir, sizeName(nw.Size),
				on.Median.Gbps, nw.Median.Gbps, on.Median.VCPUCPU, nw.Median.VCPUCPU, on.Median.VMMCPU, nw.Median.VMMCPU)
		}
		if on, off := rep.Idle, rep.IdleNoWait; on != nil && off != nil {
			fmt.Fprintf(tw, "idle\t-\t-\t-\t%.2f\t%.2f\t%.2f\t%.2f\t\n", on.VCPUCPU, off.VCPUCPU, on.VMMCPU, off.VMMCPU)
		}
		tw.Flush()
	}
}
