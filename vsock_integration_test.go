package microvm_test

// KVM integration tests of the virtio-vsock device with the bundled test
// guest (docs/testguest.md): bulk data both ways, the Firecracker host
// protocol's acceptance checks, many connections, the interrupt path and
// the reserved-CID usage error. The machine runs in-process (New, Run in a
// goroutine, Close), so the tests can read the device's and the wait port's
// counters; the CID check also runs the CLI binary for its exit status.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testing/consoletest"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/vsock"
)

// Test guest ports and exit statuses (docs/testguest.md).
const (
	vsockTestPort       = 1024
	guestExitRefused    = 6
	guestExitBadCmdline = 8
)

// vsockGuest is the test guest with a vsock device, running in the
// background. The test goroutine drives it; Run's goroutine only fills res
// and err before closing done.
type vsockGuest struct {
	t       *testing.T
	m       *microvm.Machine
	uds     string
	console *consoletest.Console
	log     *consoletest.Console
	stuck   bool          // Run did not return after cancel: do not Close
	done    chan struct{} // closed when Run returned
	res     microvm.Result
	err     error
}

// startVsockGuest boots bin/testguest with cmdline and a vsock device
// (CID 3). Cleanup stops the machine.
func startVsockGuest(t *testing.T, cmdline string) *vsockGuest {
	t.Helper()
	g := newVsockGuest(t, cmdline)
	g.start()
	return g
}

// newVsockGuest creates the machine without starting it, so that host
// listeners on "<uds>_<port>" can be set up first. The host socket lives in
// a fresh, short directory: sun_path holds 107 bytes and t.TempDir() names
// can be longer.
func newVsockGuest(t *testing.T, cmdline string) *vsockGuest {
	t.Helper()
	return newVsockGuestConfig(t, cmdline, nil)
}

// newVsockGuestConfig is newVsockGuest with a hook that adjusts the Config.
func newVsockGuestConfig(t *testing.T, cmdline string, adjust func(*microvm.Config)) *vsockGuest {
	t.Helper()
	testenv.RequireKVM(t)
	kernel := testenv.TestGuest(t)
	g, log := newGuestHost(t)
	cfg := microvm.Config{
		Kernel: kernel, Cmdline: cmdline, MemoryBytes: 64 << 20,
		Console: g.console, Log: log,
		Vsock: &microvm.VsockConfig{CID: 3, UDSPath: g.uds},
	}
	if adjust != nil {
		adjust(&cfg)
	}
	var err error
	if g.m, err = microvm.New(cfg); err != nil {
		t.Fatalf("New: %v", err)
	}
	g.closeOnCleanup()
	return g
}

// newGuestHost makes a vsockGuest's host side, before its machine: a
// fresh, short directory for the host socket, the console and the log.
func newGuestHost(t *testing.T) (*vsockGuest, *logrus.Logger) {
	t.Helper()
	dir, err := os.MkdirTemp("", "mvsock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	log, logged := logBuffer()
	return &vsockGuest{t: t, uds: filepath.Join(dir, "v.sock"), console: consoletest.New(), log: logged, done: make(chan struct{})}, log
}

// closeOnCleanup closes the machine when the test ends. Registered before
// the run's cleanup (start), it runs after it.
func (g *vsockGuest) closeOnCleanup() {
	g.t.Cleanup(func() {
		if g.stuck {
			return
		}
		if err := g.m.Close(); err != nil {
			g.t.Errorf("Close: %v", err)
		}
	})
}

// start runs the machine in the background; cleanup cancels and waits.
func (g *vsockGuest) start() {
	t := g.t
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(g.done)
		g.res, g.err = g.m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-g.done:
		case <-time.After(10 * time.Second):
			g.stuck = true // Close would race with the running vCPUs
			t.Errorf("Run did not return 10 s after cancel; console:\n%s", g.console)
		}
	})
}

// waitListening waits for the guest's "listening <port>" line: before it,
// host connections would reach a device the driver has not set up.
func (g *vsockGuest) waitListening(port int) {
	g.t.Helper()
	if !g.console.WaitFor(fmt.Sprintf("testguest: listening %d\n", port), 20*time.Second, g.done) {
		g.t.Fatalf("guest not listening on %d; console:\n%s\nlog:\n%s", port, g.console, g.log)
	}
}

// wait waits for the guest to end by itself and checks it chose status.
func (g *vsockGuest) wait(status int, timeout time.Duration) {
	g.t.Helper()
	select {
	case <-g.done:
	case <-time.After(timeout):
		g.t.Fatalf("guest still running after %v; console:\n%s\nlog:\n%s", timeout, g.console, g.log)
	}
	if g.err != nil {
		g.t.Fatalf("Run: %v; console:\n%s\nlog:\n%s", g.err, g.console, g.log)
	}
	if g.res.Kind != microvm.ExitDebugPort || g.res.Status != status {
		g.t.Fatalf("guest ended with %v status %d, want debug-exit status %d; console:\n%s\nlog:\n%s",
			g.res.Kind, g.res.Status, status, g.console, g.log)
	}
}

// hostConn is a host client connection to a guest port.
type hostConn struct {
	*net.UnixConn
	port uint64 // the host port from "OK <port>"
}

// connect opens a host connection to the guest's port (testenv.VsockConnect)
// with a 60 s deadline for everything that follows.
func (g *vsockGuest) connect(port int) (*hostConn, error) {
	c, hp, err := testenv.VsockConnect(g.uds, uint32(port), 60*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	return &hostConn{UnixConn: c, port: uint64(hp)}, nil
}

// checkHostPort checks the Firecracker convention for host-side ports:
// 2^30 <= port < 2^31.
func checkHostPort(t *testing.T, port uint64) {
	t.Helper()
	if port < 1<<30 || port >= 1<<31 {
		t.Errorf("OK %d: host port outside [2^30, 2^31)", port)
	}
}

// echo sends data on c (then half-closes), reads everything the guest echoes
// until it closes, and checks length and SHA-256.
func echo(c *hostConn, data []byte) error {
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, rerr := io.Copy(h, c)
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if rerr != nil {
		return fmt.Errorf("read after %d bytes: %w", n, rerr)
	}
	if n != int64(len(data)) {
		return fmt.Errorf("echoed %d bytes, sent %d", n, len(data))
	}
	if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) {
		return fmt.Errorf("SHA-256 of the %d echoed bytes differs from what was sent", n)
	}
	return nil
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// echoServer accepts connections on path and echoes them; it returns the
// total number of bytes echoed so far.
func echoServer(t *testing.T, path string) func() int64 {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var total int64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(60 * time.Second))
				n, _ := io.Copy(c, c)
				mu.Lock()
				total += n
				mu.Unlock()
			}()
		}
	}()
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return total
	}
}

func parseGuestStats(t *testing.T, console string) testenv.GuestStats {
	t.Helper()
	st, err := testenv.ParseGuestStats(console)
	if err != nil {
		t.Fatalf("%v; console:\n%s", err, console)
	}
	return st
}

// TestVsockEcho64MiB: 64 MiB of random bytes through the guest's echo mode
// come back intact, and microvm ends with status 0 once the connection closed.
func TestVsockEcho64MiB(t *testing.T) {
	g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
	data := randomBytes(t, 64<<20)
	g.waitListening(vsockTestPort)
	c, err := g.connect(vsockTestPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkHostPort(t, c.port)
	start := time.Now()
	if err := echo(c, data); err != nil {
		t.Fatalf("echo: %v; console:\n%s", err, g.console)
	}
	el := time.Since(start)
	c.Close()
	g.wait(0, 30*time.Second)
	t.Logf("64 MiB echoed in %v (%.0f MB/s each way)", el.Round(time.Millisecond), float64(len(data))/el.Seconds()/1e6)
	s := g.m.VsockStats()
	if s.TxBytes != 64<<20 || s.RxBytes != 64<<20 {
		t.Errorf("device payload bytes tx %d rx %d, want %d each", s.TxBytes, s.RxBytes, 64<<20)
	}
	if s.GuestErrors != 0 {
		t.Errorf("device counted %d guest errors", s.GuestErrors)
	}
}

// TestVsockConnect64MiB: the guest connects to a host echo server on
// "<uds>_<port>", sends 64 MiB of the pattern, checks the echo itself and
// exits 0.
func TestVsockConnect64MiB(t *testing.T) {
	const port, n = 5000, 64 << 20
	g := newVsockGuest(t, fmt.Sprintf("testguest.mode=connect testguest.port=%d testguest.bytes=%d", port, n))
	echoed := echoServer(t, fmt.Sprintf("%s_%d", g.uds, port))
	g.start()
	g.wait(0, 45*time.Second)
	if !strings.Contains(g.console.String(), fmt.Sprintf("testguest: connect ok: %d bytes echoed", n)) {
		t.Errorf("no 'connect ok' line; console:\n%s", g.console)
	}
	// The server goroutine counts after its io.Copy returns; give it a moment.
	deadline := time.Now().Add(5 * time.Second)
	for echoed() != n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := echoed(); got != n {
		t.Errorf("host echo server echoed %d bytes, want %d", got, n)
	}
}

// TestVsockAcceptance runs vsock's acceptance checks.
func TestVsockAcceptance(t *testing.T) {
	t.Run("OK port range", func(t *testing.T) {
		g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=3", vsockTestPort))
		g.waitListening(vsockTestPort)
		seen := map[uint64]bool{}
		for i := 0; i < 3; i++ {
			c, err := g.connect(vsockTestPort)
			if err != nil {
				t.Fatal(err)
			}
			checkHostPort(t, c.port)
			if seen[c.port] {
				t.Errorf("host port %d handed out twice", c.port)
			}
			seen[c.port] = true
			if err := echo(c, []byte("ping\n")); err != nil {
				t.Error(err)
			}
			c.Close()
		}
		g.wait(0, 20*time.Second)
	})

	// Bad host clients are closed promptly, and the device keeps serving:
	// a good connection afterwards works and ends the guest.
	t.Run("bad clients closed, device keeps serving", func(t *testing.T) {
		g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
		g.waitListening(vsockTestPort)
		bad := []struct {
			name string
			send []byte
		}{
			{"CONNECT to a port nobody listens on", []byte("CONNECT 9999\n")},
			{"not a CONNECT line", []byte("HELLO\n")},
			{"200 bytes without a newline", bytes.Repeat([]byte("x"), 200)},
		}
		for _, b := range bad {
			c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: g.uds, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := c.Write(b.send); err != nil {
				t.Errorf("%s: write: %v", b.name, err)
			}
			_ = c.SetReadDeadline(start.Add(2 * time.Second))
			got, err := io.ReadAll(c)
			el := time.Since(start)
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				t.Errorf("%s: still open after %v", b.name, el.Round(time.Millisecond))
			case len(got) != 0:
				t.Errorf("%s: got %q before the close, want nothing", b.name, got)
			default:
				t.Logf("%s: closed after %v (%v)", b.name, el.Round(time.Millisecond), err)
			}
			c.Close()
		}
		c, err := g.connect(vsockTestPort)
		if err != nil {
			t.Fatalf("good connection after the bad ones: %v; log:\n%s", err, g.log)
		}
		if err := echo(c, randomBytes(t, 100_000)); err != nil {
			t.Error(err)
		}
		c.Close()
		g.wait(0, 20*time.Second)
	})

	t.Run("guest connect to host echo server", func(t *testing.T) {
		const port = 5000
		g := newVsockGuest(t, fmt.Sprintf("testguest.mode=connect testguest.port=%d testguest.bytes=1048576", port))
		echoServer(t, fmt.Sprintf("%s_%d", g.uds, port))
		g.start()
		g.wait(0, 30*time.Second)
	})

	t.Run("guest connect refused", func(t *testing.T) {
		g := startVsockGuest(t, "testguest.mode=connect testguest.port=5001 testguest.bytes=1048576")
		g.wait(guestExitRefused, 30*time.Second)
		if !strings.Contains(g.console.String(), "testguest: ") {
			t.Errorf("no reason line before exit %d; console:\n%s", guestExitRefused, g.console)
		}
	})
}

// connSize is the size of connection i in the many-connection tests: a
// spread that includes 0, 1 and sizes around the 4 KiB guest buffers and
// the 64 KiB packet limit.
func connSize(i int) int {
	special := []int{0, 1, 4095, 4096, 4097, 65535, 65536, 65537, 256 << 10}
	if i < len(special) {
		return special[i]
	}
	return (i * 7919) % 200_000
}

// TestVsockSequentialConnections: 100 connections one after the other, each
// checksummed; the guest exits 0 after the last.
func TestVsockSequentialConnections(t *testing.T) {
	const n = 100
	g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=%d", vsockTestPort, n))
	data := randomBytes(t, 256<<10)
	g.waitListening(vsockTestPort)
	ports := map[uint64]int{}
	for i := 0; i < n; i++ {
		c, err := g.connect(vsockTestPort)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		checkHostPort(t, c.port)
		if j, ok := ports[c.port]; ok {
			t.Errorf("connections %d and %d both got host port %d", j, i, c.port)
		}
		ports[c.port] = i
		if err := echo(c, data[:connSize(i)]); err != nil {
			t.Fatalf("connection %d (%d bytes): %v; console:\n%s", i, connSize(i), err, g.console)
		}
		c.Close()
	}
	g.wait(0, 20*time.Second)
	if s := g.m.VsockStats(); s.ConnsOpened != n || s.ConnsOpen != 0 {
		t.Errorf("device: %d connections opened, %d open; want %d, 0", s.ConnsOpened, s.ConnsOpen, n)
	}
}

// TestVsockConcurrentConnections: 32 connections at once, each with its own
// random data and checksum; the guest exits 0 after the last.
func TestVsockConcurrentConnections(t *testing.T) {
	const n = 32
	g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=%d", vsockTestPort, n))
	data := randomBytes(t, n<<20)
	g.waitListening(vsockTestPort)
	oneConn := func(i int) error {
		c, err := g.connect(vsockTestPort)
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		defer c.Close()
		if c.port < 1<<30 || c.port >= 1<<31 {
			return fmt.Errorf("connection %d: host port %d outside [2^30, 2^31)", i, c.port)
		}
		size := 512<<10 + (i*7919)%(512<<10) // 512 KiB .. 1 MiB
		if err := echo(c, data[i<<20:i<<20+size]); err != nil {
			return fmt.Errorf("connection %d (%d bytes): %w", i, size, err)
		}
		return nil
	}
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Go(func() { errs <- oneConn(i) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("%v", err)
		}
	}
	if t.Failed() {
		t.Fatalf("console:\n%s", g.console)
	}
	g.wait(0, 20*time.Second)
	if s := g.m.VsockStats(); s.ConnsOpened != n || s.ConnsOpen != 0 || s.GuestErrors != 0 {
		t.Errorf("device: %d connections opened, %d open, %d guest errors; want %d, 0, 0", s.ConnsOpened, s.ConnsOpen, s.GuestErrors, n)
	}
}

// TestVsockInterruptPath checks the device's interrupt path as far as a PVM
// host allows. Guests cannot take interrupts there (docs/testguest.md), so
// delivery through the irqfd into the guest's IDT is not observable; the
// irqfd registration itself is tested in the kvm package. What is checked:
// the device raised interrupts (each one signals the irqfd and notifies the
// paravirtual wait port), the guest slept on the wait port, and
// notifications, not only the port's 1 ms timeout, ended its waits.
func TestVsockInterruptPath(t *testing.T) {
	g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
	g.waitListening(vsockTestPort)
	c, err := g.connect(vsockTestPort)
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(c, randomBytes(t, 8<<20)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	g.wait(0, 20*time.Second)
	s := g.m.VsockStats()
	vm := g.m.Metrics()
	waits, wakeups := vm.PVWaits, vm.PVWakeups
	gs := parseGuestStats(t, g.console.String())
	t.Logf("device: %d interrupts, %d tx kicks, %d rx kicks; wait port: %d waits, %d ended by a notification; guest: %d waits",
		s.Interrupts, s.TxKicks, s.RxKicks, waits, wakeups, gs.Waits)
	if s.Interrupts == 0 {
		t.Error("the device raised no interrupt while moving 8 MiB each way")
	}
	if gs.Waits == 0 || waits < gs.Waits {
		t.Errorf("guest counted %d waits, the wait port %d: want the guest to have slept on the port", gs.Waits, waits)
	}
	if wakeups == 0 {
		t.Error("no wait ended by a device notification: the interrupt path does not reach the wait port")
	}
	if gs.RxBytes != 8<<20 || gs.TxBytes != 8<<20 {
		t.Errorf("guest moved rx %d tx %d bytes, want %d each", gs.RxBytes, gs.TxBytes, 8<<20)
	}
}

// TestVsockIRQMode: testguest.irq=1 completes by interrupts (through
// microvm's IOAPIC or KVM's, and the irqfd) instead of the wait port, with
// both irqchip models. Guests cannot take interrupts on PVM hosts, so there
// it runs in the nested-KVM box.
func TestVsockIRQMode(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedInterrupts)
	// The split irqchip once more with irq-coalesce off, for the
	// interrupt counts beside it.
	noCoalesce := vsock.DefaultOptions
	noCoalesce.IRQCoalesce = false
	for _, tc := range []struct {
		name string
		chip microvm.IRQChip
		opts *vsock.Options
	}{{string(microvm.IRQChipSplit), microvm.IRQChipSplit, nil}, {string(microvm.IRQChipKernel), microvm.IRQChipKernel, nil}, {"split-no-irq-coalesce", microvm.IRQChipSplit, &noCoalesce}} {
		chip := tc.chip
		t.Run(tc.name, func(t *testing.T) {
			g := newVsockGuestConfig(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1 testguest.irq=1", vsockTestPort),
				func(c *microvm.Config) { c.IRQChip = chip; c.Vsock.Options = tc.opts })
			g.start()
			select {
			case <-g.done:
				t.Fatalf("guest ended with %v status %d before listening; console:\n%s", g.res.Kind, g.res.Status, g.console)
			case <-time.After(60 * time.Second):
				t.Fatalf("irq mode: guest neither listened nor exited; console:\n%s", g.console)
			case <-g.listening(vsockTestPort):
			}
			c, err := g.connect(vsockTestPort)
			if err != nil {
				t.Fatal(err)
			}
			if err := echo(c, randomBytes(t, 1<<20)); err != nil {
				t.Fatal(err)
			}
			c.Close()
			g.wait(0, 60*time.Second)
			s := g.m.VsockStats()
			// The guest's stats line counts the interrupts its IDT handler took.
			m := guestIRQsRE.FindStringSubmatch(g.console.String())
			if m == nil {
				t.Fatalf("no irq count in the guest's stats line; console:\n%s", g.console)
			}
			// With irq-coalesce (the default) on this one virtio-mmio
			// line, TX completions of credit updates ride on RX
			// interrupts: the guest finishing at all shows none was lost.
			t.Logf("device raised %d RX and %d TX interrupts (%d TX ones served by an RX one), the guest took %s",
				s.Interrupts, s.TxInterrupts, s.TxInterruptsCovered, m[1])
			if s.Interrupts == 0 || m[1] == "0" {
				t.Errorf("irq mode: device raised %d interrupts, guest took %s; want both above 0", s.Interrupts, m[1])
			}
		})
	}
}

// guestIRQsRE finds the interrupt count in the test guest's irq-mode stats.
var guestIRQsRE = regexp.MustCompile(`, irqs (\d+) \(no status`)

// listening returns a channel closed once the guest listens on port.
func (g *vsockGuest) listening(port int) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		if g.console.WaitFor(fmt.Sprintf("testguest: listening %d\n", port), 20*time.Second, g.done) {
			close(ch)
		}
	}()
	return ch
}

// TestVsockReservedCID: CID 2 is the host's. New refuses it as a
// configuration error, and the CLI exits 2 with a one-line message.
func TestVsockReservedCID(t *testing.T) {
	dir, err := os.MkdirTemp("", "mvsock")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	uds := filepath.Join(dir, "v.sock")
	kernel := filepath.Join(dir, "kernel")
	if err := os.WriteFile(kernel, testenv.TinyELF(testenv.Program{}.Exit(0)), 0o644); err != nil {
		t.Fatal(err)
	}
	const want = "vsock CID 2: must be at least 3"

	_, err = microvm.New(microvm.Config{Kernel: kernel, MemoryBytes: 16 << 20, Log: quietLog(), Vsock: &microvm.VsockConfig{CID: 2, UDSPath: uds}})
	if !errors.Is(err, microvm.ErrConfig) || !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("New with CID 2: %v; want ErrConfig containing %q", err, want)
	}

	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to build the CLI (%v); checked New only", err)
	}
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "microvm")
	build := exec.Command(goTool, "build", "-o", exe, "./cmd/microvm")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/microvm: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(exe, "run", "--kernel", kernel, "--vsock-cid", "2", "--vsock-uds", uds)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != microvm.StatusUsage {
		t.Errorf("microvm run --vsock-cid 2: %v, want exit status %d; stderr:\n%s", err, microvm.StatusUsage, &stderr)
	}
	lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "microvm: ") || !strings.Contains(lines[0], want) {
		t.Errorf("stderr = %q, want one line \"microvm: ...%s...\"", stderr.String(), want)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", &stdout)
	}
	if _, err := os.Lstat(uds); err == nil {
		t.Errorf("%s was created although the configuration was refused", uds)
	}
}
