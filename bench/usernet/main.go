// Command usernet measures the user-mode network of `--net user`
// (devices/virtionet/usernet) on its own, in one process and one run:
// TCP throughput and connection set-up from a guest to a server on the
// host's loopback, and from the host into the guest through a published
// port, each next to the same over the host's loopback alone.
//
//	go run ./bench/usernet [-mib 256] [-conns 200] [-json build/bench/usernet.json]
//
// The guest is usernettest's second gVisor netstack on the device's end of
// the network's socketpair, where a VM's kernel and virtio-net would be:
// the figures are the network's own cost (its netstack, switch and
// socketpair, and the guest stack's), not a VM's. CPU is the process's
// user+sys (both stacks run in it) per MiB moved. Compare the ratios of
// one run; absolute figures move with the host.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sort"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/devices/virtionet/usernet"
	"github.com/microvm/microvm/devices/virtionet/usernet/usernettest"
	"github.com/microvm/microvm/internal/testing/testenv"
)

type row struct {
	Path        string        `json:"path"`
	MiB         int           `json:"mib"`
	MBps        benchenv.Num  `json:"mb_per_s"`
	CPUmsPerMiB benchenv.Num  `json:"cpu_ms_per_mib"`
	ConnMedian  time.Duration `json:"connect_median_ns"`
	ConnP90     time.Duration `json:"connect_p90_ns"`
}

func main() {
	mib := flag.Int("mib", 256, "MiB to send on each path")
	conns := flag.Int("conns", 200, "connections to time on each path")
	jsonPath := flag.String("json", "", "also write the results here")
	flag.Parse()
	if err := run(*mib, *conns, *jsonPath); err != nil {
		fmt.Fprintln(os.Stderr, "bench/usernet:", err)
		os.Exit(1)
	}
}

func run(mib, conns int, jsonPath string) error {
	quiet := logrus.New()
	quiet.Out = io.Discard
	logrus.StandardLogger().Out = io.Discard // gvisor-tap-vsock's messages
	log.SetOutput(io.Discard)                // its port forwarder's (tcpproxy)

	// A host sink: reads everything, then answers one byte.
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer sink.Close()
	go serveSink(sink)
	sinkPort := uint16(sink.Addr().(*net.TCPAddr).Port)

	pubPort, err := testenv.FreeLoopbackPort("tcp")
	if err != nil {
		return err
	}
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}
	// HostLoopback: the guest's end dials the sink on this machine's
	// loopback through usernet.HostIP.
	n, err := usernet.New(usernet.Config{GuestMAC: mac, Log: quiet, HostLoopback: true,
		Publish: []virtionet.Publish{{Proto: "tcp", HostIP: "127.0.0.1", HostPort: pubPort, GuestPort: 9000}}})
	if err != nil {
		return err
	}
	defer n.Close()
	g, err := usernettest.New(n, mac)
	if err != nil {
		return err
	}
	defer g.Close()
	gl, err := g.Listen(9000)
	if err != nil {
		return err
	}
	defer gl.Close()
	go serveSink(gl)

	ctx := context.Background()
	hostDial := func() (net.Conn, error) { return net.Dial("tcp", sink.Addr().String()) }
	guestDial := func() (net.Conn, error) { return g.Dial(ctx, usernet.HostIP, sinkPort) }
	pubDial := func() (net.Conn, error) { return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", pubPort)) }

	var rows []row
	for _, p := range []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"host loopback", hostDial},
		{"guest -> host (usernet egress)", guestDial},
		{"host -> guest (--publish)", pubDial},
	} {
		r := row{Path: p.name, MiB: mib}
		mbps, cpu, err := throughput(p.dial, mib)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		r.MBps, r.CPUmsPerMiB = benchenv.Num(mbps), benchenv.Num(cpu)
		if r.ConnMedian, r.ConnP90, err = connectTimes(p.dial, conns); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		rows = append(rows, r)
	}

	fmt.Printf("user-mode network, in process (no VM: a second netstack is the guest); %d MiB, %d connections per path\n\n", mib, conns)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tMB/s\tCPU ms/MiB\tconnect+1 B median\tconnect+1 B p90\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%v\t%v\t\n", r.Path, float64(r.MBps), float64(r.CPUmsPerMiB),
			r.ConnMedian.Round(time.Microsecond), r.ConnP90.Round(time.Microsecond))
	}
	for _, r := range rows[1:] {
		fmt.Fprintf(tw, "%s / loopback\t%.2f\t%.2f\t%.1f\t\t\n", r.Path, float64(r.MBps/rows[0].MBps),
			float64(r.CPUmsPerMiB/rows[0].CPUmsPerMiB), float64(r.ConnMedian)/float64(rows[0].ConnMedian))
	}
	tw.Flush()
	if jsonPath != "" {
		return benchenv.WriteJSON(jsonPath, map[string]any{"host": benchenv.HostInfo(), "rows": rows})
	}
	return nil
}

// serveSink reads each connection to its end and answers one byte.
func serveSink(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(io.Discard, c)
			c.Write([]byte{1})
		}()
	}
}

// throughput sends mib MiB on one connection and waits for the sink's
// answer: MB/s and the process's CPU ms per MiB.
func throughput(dial func() (net.Conn, error), mib int) (float64, float64, error) {
	c, err := dial()
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	cpu0 := cpuTime()
	start := time.Now()
	for sent := 0; sent < mib<<20; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			return 0, 0, err
		}
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return 0, 0, fmt.Errorf("the sink's answer: %w", err)
	}
	d := time.Since(start)
	cpu := cpuTime() - cpu0
	return float64(mib<<20) / d.Seconds() / 1e6, float64(cpu.Milliseconds()) / float64(mib), nil
}

// connectTimes times n connections from dial to the sink's answer to one
// byte: set-up end to end (through a published port, the host's accept
// alone would say nothing of the guest).
func connectTimes(dial func() (net.Conn, error), n int) (time.Duration, time.Duration, error) {
	var ds []time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		c, err := dial()
		if err != nil {
			return 0, 0, err
		}
		_, err = c.Write([]byte{0})
		if cw, ok := c.(interface{ CloseWrite() error }); ok && err == nil {
			err = cw.CloseWrite()
		}
		var ack [1]byte
		if err == nil {
			_, err = io.ReadFull(c, ack[:])
		}
		c.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("connection %d: %w", i, err)
		}
		ds = append(ds, time.Since(t))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], ds[len(ds)*9/10], nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
