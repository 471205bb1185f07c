package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/agentguest"
	"github.com/microvm/microvm/vsock"
)

// guestCID is the guest's vsock context id; each VM is alone.
const guestCID = 3

// vm is one booted machine and a connection to its agent. The goroutine
// that booted it owns it and calls shutdown; Run runs on a goroutine of its
// own, which shutdown waits for.
type vm struct {
	m       *microvm.Machine
	console *tailBuffer
	conn    *agentConn

	stop   context.CancelFunc
	done   chan struct{} // closed when Run has returned
	res    microvm.Result
	runErr error // Run's error; read after done is closed

	// newTook is the time microvm.New took; ready the time from just
	// before New to the first successful Health call.
	newTook, ready time.Duration
}

// bootVM creates and starts a machine on kernel with initrd, and waits for
// its agent to answer a Health call over Machine.DialVsock, for at most
// timeout. uds is the device's Unix socket path (required by the device,
// not used here: everything goes through DialVsock).
func bootVM(ctx context.Context, cfg *config, initrd, uds string, log logrus.FieldLogger) (*vm, error) {
	v := &vm{console: &tailBuffer{max: 4 << 10}, done: make(chan struct{})}
	start := time.Now()
	vc := &microvm.VsockConfig{CID: guestCID, UDSPath: uds}
	if cfg.plain {
		vc.Options = &vsock.Options{}
	}
	m, err := microvm.New(microvm.Config{
		Kernel: cfg.kernel, Initrd: initrd, CPUs: cfg.cpus, MemoryBytes: cfg.memory,
		Cmdline: agentguest.Cmdline, Console: v.console, Log: log,
		Vsock: vc,
	})
	if err != nil {
		return nil, err
	}
	v.newTook = time.Since(start)
	v.m = m
	var runCtx context.Context
	runCtx, v.stop = context.WithCancel(context.Background())
	go func() {
		defer close(v.done)
		v.res, v.runErr = m.Run(runCtx)
	}()

	bctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	// Until the agent listens the guest refuses, and Connect dials again;
	// if the VM stops first, DialVsock says so and Connect gives up.
	v.conn, err = connectAgent(bctx, func(ctx context.Context) (net.Conn, error) {
		return m.DialVsock(ctx, agentguest.AgentPort)
	})
	if err == nil {
		err = v.conn.health(bctx)
	}
	v.ready = time.Since(start)
	if err != nil {
		return nil, v.fail(err)
	}
	return v, nil
}

// describe adds to err what the VM says: how Run ended, if it has, and
// the tail of its console.
func (v *vm) describe(err error) error {
	if v.ended() {
		err = fmt.Errorf("%w (the VM ended: %v, status %d, %v)", err, v.res.Kind, v.res.Status, v.runErr)
	}
	if con := strings.TrimSpace(v.console.String()); con != "" {
		err = fmt.Errorf("%w; console: %q", err, con)
	}
	if !v.ended() {
		// A stall: do the device's counters and the vCPUs still move?
		a := v.m.Metrics()
		time.Sleep(2 * time.Second)
		b := v.m.Metrics()
		err = fmt.Errorf("%w; state (2 s apart): %s | %s", err, stallState(a), stallState(b))
	}
	return err
}

// stallState is what tells a stuck device from a stuck guest.
func stallState(m microvm.Metrics) string {
	var exits uint64
	for _, c := range m.VCPUs {
		for _, n := range c.Exits {
			exits += n
		}
	}
	s := fmt.Sprintf("exits %d", exits)
	if v := m.Vsock; v != nil {
		s += fmt.Sprintf(" vsock tx %d pkts/%d B rx %d pkts/%d B kicks tx %d rx %d irqs %d credit-upd %d hostWriteStalls %d granted %d creditStalls %d open %d",
			v.TxPackets, v.TxBytes, v.RxPackets, v.RxBytes, v.TxKicks, v.RxKicks, v.Interrupts,
			v.CreditUpdatesSent, v.HostWriteStalls, v.BufferGranted, v.CreditStalls, v.ConnsOpen)
	}
	return s
}

// fail describes err and shuts the machine down.
func (v *vm) fail(err error) error {
	err = v.describe(err)
	v.shutdown()
	return err
}

// ended reports whether the machine has stopped on its own.
func (v *vm) ended() bool {
	return agentguest.Ended(v.done)
}

// shutdown closes the agent connection, stops the machine, waits for Run
// and releases the machine.
func (v *vm) shutdown() {
	if v.conn != nil {
		v.conn.close()
		v.conn = nil
	}
	v.stop()
	<-v.done
	v.m.Close()
}

// tailBuffer keeps about the last max bytes written to it (the guest's
// console, for error messages). The machine's serial device writes it;
// String may be called from any goroutine.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	b     []byte // guarded by mu
	total int64  // guarded by mu: bytes ever written
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(len(p))
	t.b = append(t.b, p...)
	if len(t.b) > 2*t.max { // trim now and then, not on every write
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

// written returns how many bytes have been written in all.
func (t *tailBuffer) written() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b[max(0, len(t.b)-t.max):])
}

// udsPath is the device socket of boot i in dir.
func udsPath(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("vsock-%d.sock", i)) }
