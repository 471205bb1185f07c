package vsock_test

// The fault matrix (docs/fault-matrix.md): each test breaks one thing while
// data flows and checks that nothing is lost on the connections the fault
// does not touch, that the broken one ends cleanly (no hang, no leak), and
// that the device keeps serving. Faults that tests elsewhere already cover
// are listed in the document with those tests' names.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// mmioTransport drives the device through microvm's virtio-mmio transport,
// as a Linux driver does: the guest's activation becomes register writes
// (status, features, queue addresses, DRIVER_OK) and its reset a write of 0
// to the status register. Guest memory stays the same across activations.
type mmioTransport struct {
	tb  testing.TB
	m   *virtio.MMIO
	mem *virtiotest.Memory
}

func newMMIOTransport(tb testing.TB, e *env, memSize uint64) *mmioTransport {
	tb.Helper()
	t := &mmioTransport{tb: tb, mem: virtiotest.NewMemory(tb, memSize)}
	m, err := virtio.NewMMIO(e.dev, t.mem.Memory, func() {}, quietLog())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	t.m = m
	return t
}

func (t *mmioTransport) r(off uint64) uint32 {
	var b [4]byte
	t.m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (t *mmioTransport) w(off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	t.m.Write(off, b[:])
}

// Activate implements vsocktest.Transport: the virtio 1.2 (3.1.1) driver
// initialisation sequence.
func (t *mmioTransport) Activate(g *vsocktest.Guest, a virtio.Activation) ([]*eventfd.EventFD, error) {
	t.w(virtio.RegStatus, 0)
	t.w(virtio.RegStatus, virtio.StatusAcknowledge)
	t.w(virtio.RegStatus, virtio.StatusAcknowledge|virtio.StatusDriver)
	t.w(virtio.RegDriverFeaturesSel, 1)
	t.w(virtio.RegDriverFeatures, uint32(a.Features>>32))
	t.w(virtio.RegDriverFeaturesSel, 0)
	t.w(virtio.RegDriverFeatures, uint32(a.Features))
	t.w(virtio.RegStatus, virtio.StatusAcknowledge|virtio.StatusDriver|virtio.StatusFeaturesOK)
	for i, q := range a.Queues {
		if q == nil {
			continue
		}
		c := q.Config()
		t.w(virtio.RegQueueSel, uint32(i))
		t.w(virtio.RegQueueNum, uint32(c.Size))
		t.w(virtio.RegQueueDescLow, uint32(c.Desc))
		t.w(virtio.RegQueueDescHigh, uint32(c.Desc>>32))
		t.w(virtio.RegQueueDriverLow, uint32(c.Avail))
		t.w(virtio.RegQueueDriverHigh, uint32(c.Avail>>32))
		t.w(virtio.RegQueueDeviceLow, uint32(c.Used))
		t.w(virtio.RegQueueDeviceHigh, uint32(c.Used>>32))
		t.w(virtio.RegQueueReady, 1)
	}
	t.w(virtio.RegStatus, virtio.StatusAcknowledge|virtio.StatusDriver|virtio.StatusFeaturesOK|virtio.StatusDriverOK)
	if s := t.r(virtio.RegStatus); s&virtio.StatusDriverOK == 0 || s&virtio.StatusNeedsReset != 0 {
		t.tb.Fatalf("status after DRIVER_OK: %s", virtio.StatusString(s))
	}
	return t.m.KickFDs(), nil
}

// Reset implements vsocktest.Transport: the driver writes 0 to the status
// register.
func (t *mmioTransport) Reset(*vsocktest.Guest) {
	t.w(virtio.RegStatus, 0)
	if s := t.r(virtio.RegStatus); s != 0 {
		t.tb.Fatalf("status after reset: %s", virtio.StatusString(s))
	}
}

// Row "guest resets the device mid-transfer": the driver writes 0 to the
// virtio-mmio status register while data flows both ways on connections
// opened from either side. Every host socket is closed, the workers stop
// (the harness checks no goroutine is left), no descriptor leaks, and after
// the driver initialises the device again through the same transport,
// connections both ways carry data intact. TestResetWhileBusy does the same
// through Device.Reset directly; this is the path a guest takes.
func TestFaultGuestResetMidTransfer(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{EventIdx: true}})
	e.g.Reset()
	tr := newMMIOTransport(t, e, 16<<20)
	e.g.Opts.Transport = tr
	e.g.Opts.NewMemory = func(testing.TB) *virtiotest.Memory { return tr.mem }
	e.g.Activate()
	fds := openFDs(t)

	var conns []*vsocktest.Conn
	var waits []func() bool
	for i := uint32(0); i < 2; i++ {
		c, h := e.connectGuest(100+i, 2000+i)
		c2, h2 := e.connectHost(3000+i, nil)
		conns = append(conns, c, c2)
		waits = append(waits, busyHost(h, uint64(i)), busyHost(h2, uint64(10+i)))
	}
	out := vsocktest.Pattern(2, 32<<10)
	e.g.WaitFor("traffic both ways", func() bool {
		for _, c := range conns {
			c.TryWrite(out)
			c.Consume(c.Buffered())
		}
		s := e.dev.Stats()
		return s.TxBytes > 512<<10 && s.RxBytes > 512<<10
	})
	e.g.Reset() // status 0, with TX chains and RX data in flight
	if s := e.dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open after the reset", s.ConnsOpen)
	}
	for i, w := range waits {
		if !w() {
			t.Fatalf("host end %d still open after the guest's reset", i)
		}
	}
	waitFDs(t, fds+4) // the host ends of the 4 connections, still open here

	e.g.Activate()
	c, h := e.connectGuest(100, 2000)
	e.transfer(c, h, vsocktest.Pattern(3, 1<<20), vsocktest.Pattern(4, 1<<20))
	c2, h2 := e.connectHost(3000, nil)
	e.transfer(c2, h2, vsocktest.Pattern(5, 1<<20), vsocktest.Pattern(6, 1<<20))
	if n := tr.m.GuestErrors(); n != 0 {
		t.Errorf("the transport counted %d guest errors", n)
	}
}

// clientEnv names the environment variable that turns this test binary into
// the host client of TestFaultHostClientKilled (TestFaultHostClientProcess).
const clientEnv = "VSOCK_FAULT_CLIENT"

// faultChunk is the period of the byte pattern the killed client's
// connection carries: byte i is Pattern(seed, faultChunk)[i % faultChunk].
const faultChunk = 1 << 20

// TestFaultHostClientProcess is not a test: run by TestFaultHostClientKilled
// as a separate process with $VSOCK_FAULT_CLIENT = "h2g|g2h|pending uds
// port", it connects to the device's Unix socket, sends CONNECT, and then
// either writes the pattern for ever (h2g), printing "sent N" after each
// write, or reads and checks it (g2h), printing "got N" after each read and
// "mismatch at N" (exit 3) if a byte is wrong, or (pending) waits without
// reading the device's answer. It is killed with SIGKILL.
func TestFaultHostClientProcess(t *testing.T) {
	spec := os.Getenv(clientEnv)
	if spec == "" {
		t.Skip("helper process for TestFaultHostClientKilled")
	}
	var mode, path string
	var port uint32
	if _, err := fmt.Sscan(spec, &mode, &path, &port); err != nil {
		fmt.Println("bad spec:", err)
		os.Exit(2)
	}
	if mode == "pending" {
		// CONNECT, then wait for the kill without reading the answer.
		c, err := net.Dial("unix", path)
		if err == nil {
			_, err = fmt.Fprintf(c, "CONNECT %d\n", port)
		}
		if err != nil {
			fmt.Println("connect:", err)
			os.Exit(2)
		}
		fmt.Println("connected 0")
		select {}
	}
	c, hp, err := testenv.VsockConnect(path, port, waitTimeout)
	if err != nil {
		fmt.Println("connect:", err)
		os.Exit(2)
	}
	fmt.Println("connected", hp)
	pat := vsocktest.Pattern(faultSeed(mode), faultChunk)
	var n int
	if mode == "h2g" {
		for {
			off := n % faultChunk
			k, err := c.Write(pat[off:min(off+64<<10, faultChunk)])
			n += k
			fmt.Println("sent", n)
			if err != nil {
				fmt.Println("write:", err)
				os.Exit(2)
			}
		}
	}
	buf := make([]byte, 64<<10)
	for {
		k, err := c.Read(buf)
		for i, b := range buf[:k] {
			if b != pat[(n+i)%faultChunk] {
				fmt.Println("mismatch at", n+i)
				os.Exit(3)
			}
		}
		n += k
		fmt.Println("got", n)
		if err != nil {
			fmt.Println("read:", err)
			os.Exit(2)
		}
	}
}

func faultSeed(mode string) uint64 {
	if mode == "h2g" {
		return 71
	}
	return 72
}

// clientProc is the host client process of TestFaultHostClientKilled.
type clientProc struct {
	cmd   *exec.Cmd
	count atomic.Int64 // the last "sent N" or "got N"
	bad   atomic.Value // a line that is not a count (string)
	done  chan struct{}
}

func startClient(t *testing.T, mode, uds string, port uint32) *clientProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultHostClientProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", clientEnv, mode, uds, port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &clientProc{cmd: cmd, done: make(chan struct{})}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var what string
			var n int64
			if _, err := fmt.Sscan(sc.Text(), &what, &n); err == nil && (what == "sent" || what == "got") {
				p.count.Store(n)
			} else if !strings.HasPrefix(sc.Text(), "connected") {
				p.bad.Store(sc.Text())
			}
		}
		_ = cmd.Wait()
	}()
	return p
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *clientProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(waitTimeout):
		t.Fatal("client process not gone after SIGKILL")
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("client process ended with %v; want killed by SIGKILL (line %v)", p.cmd.ProcessState, p.bad.Load())
	}
}

// serveUDS serves the device's Unix socket (in a fresh short directory:
// sun_path holds 107 bytes) with the given handshake timeout until the end
// of the test.
func (e *env) serveUDS(timeout time.Duration) *vsock.UDS {
	e.tb.Helper()
	dir, err := os.MkdirTemp("", "vfault")
	if err != nil {
		e.tb.Fatal(err)
	}
	e.tb.Cleanup(func() { os.RemoveAll(dir) })
	uds, err := vsock.ListenUDS(filepath.Join(dir, "v.sock"), e.dev, timeout, quietLog())
	if err != nil {
		e.tb.Fatal(err)
	}
	served := make(chan struct{})
	go func() { uds.Serve(); close(served) }()
	e.tb.Cleanup(func() { uds.Close(); <-served })
	return uds
}

// dialUDS connects to uds for guest port port on another goroutine (the
// guest must answer on this one) and returns a function that waits for the
// result.
func dialUDS(uds *vsock.UDS, port uint32) func() (*net.UnixConn, error) {
	type dialed struct {
		c   *net.UnixConn
		err error
	}
	dc := make(chan dialed, 1)
	go func() {
		h, _, err := testenv.VsockConnect(uds.Path(), port, waitTimeout)
		dc <- dialed{h, err}
	}()
	return func() (*net.UnixConn, error) {
		d := <-dc
		return d.c, d.err
	}
}

// Row "host client killed mid-transfer": a host client connected through
// the Unix socket (CONNECT) is a separate process, killed with SIGKILL while
// 1 MiB or more has moved in one direction. Meanwhile a second connection
// carries 2 MiB each way.
//
//   - h2g (the client was writing): the guest receives every byte the client
//     wrote before it died (at least its last "sent" count), in order, then
//     SHUTDOWN: the kernel keeps a dead writer's bytes readable and then
//     reports end of stream.
//   - g2h (the client was reading): the device's next write or read fails
//     (the dead reader left unread bytes: ECONNRESET), the guest gets RST
//     or SHUTDOWN promptly, and the client saw only correct bytes.
//
// In both, the other connection's data arrives intact, the device counts
// no guest error and keeps serving, and no descriptor is left.
func TestFaultHostClientKilled(t *testing.T) {
	for _, mode := range []string{"h2g", "g2h"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: vsocktest.Options{Timeout: pairTimeout}})
			uds := e.serveUDS(waitTimeout)
			fds := openFDs(t)

			const port = 4000
			p := startClient(t, mode, uds.Path(), port)
			c := e.g.Accept(port)
			other := e.newTrafficPair(5000, 1025, 2<<20)

			pat := vsocktest.Pattern(faultSeed(mode), faultChunk)
			var got []byte
			sentC := 0
			// pump moves data on both connections, checking what the
			// guest receives on c against the client's pattern.
			pump := func() {
				if mode == "g2h" && !c.Rst && c.Shut == 0 {
					for c.Credit() > 0 {
						off := sentC % faultChunk
						k := c.TryWrite(pat[off:min(off+32<<10, faultChunk)])
						sentC += k
						if k == 0 {
							break
						}
					}
				}
				if b := c.Consume(c.Buffered()); len(b) > 0 {
					for i, x := range b {
						if x != pat[(len(got)+i)%faultChunk] {
							t.Fatalf("guest byte %d from the client is wrong", len(got)+i)
						}
					}
					got = append(got, b...)
				}
				other.pump()
			}
			e.g.WaitFor("1 MiB moved on the client's connection", func() bool {
				pump()
				return p.count.Load() >= 1<<20 && (mode == "g2h" || len(got) >= 1<<20)
			})
			p.kill(t)
			last := p.count.Load()
			e.g.WaitFor("the end of the killed client's connection and of the other transfer", func() bool {
				pump()
				return (c.Rst || c.Shut != 0) && other.pump()
			})
			if mode == "h2g" {
				if int64(len(got)) < last {
					t.Errorf("the guest received %d bytes; the client had written %d before it died", len(got), last)
				}
				if c.Shut&vsock.ShutdownSend == 0 {
					t.Errorf("connection ended with %v; want SHUTDOWN(SEND) after the data", c.Ctl)
				}
			} else if last > int64(sentC) {
				t.Errorf("the client read %d bytes; the guest sent only %d", last, sentC)
			}
			if b := p.bad.Load(); b != nil && strings.HasPrefix(b.(string), "mismatch") {
				t.Errorf("client: %s", b)
			}
			t.Logf("%s: client's last count %d, guest received %d, sent %d; ended with %v", mode, last, len(got), sentC, c.Ctl[len(c.Ctl)-1].Op)
			other.check(t)
			if !c.Rst {
				c.Reset() // the guest closes its side
			} else {
				c.Forget()
			}
			e.g.Sync()
			e.g.WaitFor("the killed client's connection to close", func() bool { return e.dev.Stats().ConnsOpen == 1 })
			// The device still serves the Unix socket.
			wait := dialUDS(uds, port+1)
			c2 := e.g.Accept(port + 1)
			h2, err := wait()
			if err != nil {
				t.Fatalf("connect after the kill: %v", err)
			}
			e.transfer(c2, h2, vsocktest.Pattern(3, 256<<10), vsocktest.Pattern(4, 256<<10))
			if s := e.dev.Stats(); s.GuestErrors != 0 {
				t.Errorf("%d guest errors", s.GuestErrors)
			}
			h2.Close()
			other.h.Close()
			c2.Reset()
			other.c.Reset()
			e.g.Sync()
			waitFDs(t, fds)
		})
	}
}

// Row "host client killed before the guest accepts": the client process
// sends CONNECT and is killed with SIGKILL while the REQUEST waits in the
// guest. When the guest then accepts, the device's "OK" line finds the
// socket dead: the guest gets RST at once, and a transfer on another
// connection is unaffected.
func TestFaultHostClientKilledBeforeAccept(t *testing.T) {
	e := newEnv(t, envOpts{})
	uds := e.serveUDS(waitTimeout)
	fds := openFDs(t)
	const port = 4000
	other := e.newTrafficPair(5000, 1025, 1<<20)
	p := startClient(t, "pending", uds.Path(), port)
	e.pumpAll("the client's REQUEST", nil, func() bool {
		other.pump()
		for _, q := range e.g.Pending() {
			if q.Hdr.Op == vsock.OpRequest && q.Hdr.DstPort == port {
				return true
			}
		}
		return false
	})
	p.kill(t)
	c := e.g.Accept(port)
	e.pumpAll("the RST for the dead client and the other transfer", []*trafficPair{other}, func() bool { return c.Rst })
	other.check(t)
	c.Forget()
	e.g.WaitFor("the dead client's connection to close", func() bool { return e.dev.Stats().ConnsOpen == 1 })
	other.c.Reset()
	other.h.Close()
	e.g.Sync()
	waitFDs(t, fds)
}

// trafficPair is a guest connection with host goroutines that send h2g and
// collect what arrives, for checking that a fault elsewhere loses nothing.
type trafficPair struct {
	c        *vsocktest.Conn
	h        net.Conn // the host end
	g2h, h2g []byte
	sent     int
	got      []byte
	hostGot  chan []byte
}

func (e *env) newTrafficPair(hostPort, guestPort uint32, size int) *trafficPair {
	e.tb.Helper()
	c, h := e.connectGuest(hostPort, guestPort)
	p := &trafficPair{c: c, h: h, g2h: vsocktest.Pattern(uint64(guestPort), size),
		h2g: vsocktest.Pattern(uint64(guestPort)+1000, size), hostGot: make(chan []byte, 1)}
	// The host side gives the whole test time, not one exchange: a test
	// does other things while the pair moves (-race on a loaded machine
	// makes that seconds).
	go func() {
		b, _ := vsocktest.ReadFull(h, size, pairTimeout)
		p.hostGot <- b
	}()
	go func() {
		_ = h.SetWriteDeadline(time.Now().Add(pairTimeout))
		_, _ = h.Write(p.h2g)
	}()
	return p
}

// pairTimeout bounds a trafficPair's host side.
const pairTimeout = time.Minute

// pump moves what it can without waiting and reports whether the pair is
// done both ways.
func (p *trafficPair) pump() bool {
	if !p.c.Rst {
		p.sent += p.c.TryWrite(p.g2h[p.sent:])
	}
	p.got = append(p.got, p.c.Consume(p.c.Buffered())...)
	return p.sent == len(p.g2h) && len(p.got) >= len(p.h2g)
}

// check checks both directions arrived intact.
func (p *trafficPair) check(tb testing.TB) {
	tb.Helper()
	if p.c.Rst {
		tb.Fatalf("connection %d<->%d was reset", p.c.HostPort, p.c.GuestPort)
	}
	vsocktest.CheckEqual(tb, fmt.Sprintf("%d<->%d host->guest", p.c.HostPort, p.c.GuestPort), p.got, p.h2g)
	vsocktest.CheckEqual(tb, fmt.Sprintf("%d<->%d guest->host", p.c.HostPort, p.c.GuestPort), <-p.hostGot, p.g2h)
}

// pumpAll pumps every pair until all are done, also calling extra (if not
// nil) on each poll until it returns true.
func (e *env) pumpAll(what string, ps []*trafficPair, extra func() bool) {
	e.tb.Helper()
	extraDone := extra == nil
	e.g.WaitFor(what, func() bool {
		done := true
		for _, p := range ps {
			if !p.pump() {
				done = false
			}
		}
		if !extraDone {
			extraDone = extra()
		}
		return done && extraDone
	})
}

// Row "guest overruns its credit": in the middle of three transfers a
// guest connection sends one byte more than the buffer the device
// advertised. That connection alone is reset (RST to the guest, host socket
// closed) and the violation counted in GuestErrors; the three others carry
// all their bytes. (TestCreditGuestOverrun and TestHostStopsReading/overrun
// check the reset itself on a quiet device.)
func TestFaultCreditOverrun(t *testing.T) {
	const buf = 64 << 10
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: buf}, guest: vsocktest.Options{Timeout: pairTimeout}})
	e.allowGuestErrs = true
	var ps []*trafficPair
	for i := uint32(0); i < 3; i++ {
		ps = append(ps, e.newTrafficPair(5000, 1100+i, 2<<20))
	}
	bad, bh := e.connectGuest(5000, 1200)
	// The host end of bad never reads: everything the guest sends stays
	// in the device or the socket, and the credit runs out.
	e.pumpAll("half of the first transfer", nil, func() bool {
		for _, p := range ps {
			p.pump()
		}
		return ps[0].sent > 1<<20
	})
	e.stallGuest(bad, vsocktest.Pattern(9, 8<<20))
	before := e.dev.Stats()
	bad.Send(vsock.OpRW, 0, []byte{1}) // one byte past the credit
	e.pumpAll("the other transfers and the overrun's RST", ps, func() bool { return bad.Rst })
	hostClosed(t, bh)
	for _, p := range ps {
		p.check(t)
	}
	s := e.dev.Stats()
	if s.GuestErrors != before.GuestErrors+1 || s.RstSent != before.RstSent+1 {
		t.Errorf("guest errors %d -> %d, RSTs %d -> %d; want one more of each", before.GuestErrors, s.GuestErrors, before.RstSent, s.RstSent)
	}
	if s.ConnsOpen != 3 {
		t.Errorf("%d connections open; want the 3 others", s.ConnsOpen)
	}
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(t *testing.T) (user, sys time.Duration) {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// idleWindow is how long TestFaultRxRingEmpty leaves the RX ring empty.
const idleWindow = 10 * time.Second

// Row "RX ring left empty while the host sends": the guest stops posting RX
// buffers while it still has credit and the host keeps writing (until its
// socket is full). For 10 s nothing can move; the device must sleep, not
// spin on the readable socket or re-poll the empty ring. The process's CPU
// time over the window (getrusage: the device's workers, the test's host
// writer blocked in write, the Go runtime) is printed; the assertion is
// generous (20% of one CPU, 4x the 5% target: a spinning worker takes
// ~100%, or at least half a CPU on a loaded machine), so it is not timing-
// flaky. Then the guest posts buffers again and every byte arrives.
func TestFaultRxRingEmpty(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{GuestBuf: 8 << 20, RxBuffers: 64, Timeout: time.Minute}})
	c, h := e.connectGuest(5000, 1025)
	e.g.AutoRepost = false
	data := vsocktest.Pattern(8, 4<<20)
	wrote := make(chan error, 1)
	go func() {
		_ = h.SetWriteDeadline(time.Now().Add(idleWindow + 2*waitTimeout))
		_, err := h.Write(data)
		wrote <- err
	}()
	var got []byte
	e.g.WaitFor("the RX ring to run empty", func() bool {
		got = append(got, c.Consume(c.Buffered())...)
		return e.g.RxPosted() == 0
	})
	got = append(got, c.Consume(c.Buffered())...)
	if c.GuestCredit() == 0 || len(got) >= len(data) {
		t.Fatalf("credit %d, %d of %d bytes read: the test must leave the device with data and credit but no buffer", c.GuestCredit(), len(got), len(data))
	}
	rx0, _ := e.g.Received()
	u0, s0 := cpuTime(t)
	start := time.Now()
	time.Sleep(idleWindow)
	u1, s1 := cpuTime(t)
	wall := time.Since(start)
	rx1, _ := e.g.Received()
	cpu := (u1 - u0) + (s1 - s0)
	share := float64(cpu) / float64(wall)
	t.Logf("RX ring empty for %v with host data waiting: CPU user %v + sys %v = %v, %.2f%% of one CPU (target < 5%%)",
		wall.Round(time.Millisecond), (u1 - u0).Round(time.Millisecond), (s1 - s0).Round(time.Millisecond), cpu.Round(time.Millisecond), 100*share)
	if rx1 != rx0 {
		t.Fatalf("%d packets arrived without RX buffers", rx1-rx0)
	}
	if share > 0.20 {
		t.Errorf("the device used %.1f%% of a CPU while the guest had no RX buffer: it spins", 100*share)
	}
	e.g.AutoRepost = true
	e.g.PostRX(vsock.DefaultQueueSize)
	e.g.WaitFor("the rest of the data", func() bool {
		got = append(got, c.Consume(c.Buffered())...)
		return len(got) >= len(data)
	})
	if err := <-wrote; err != nil {
		t.Fatalf("host write: %v", err)
	}
	vsocktest.CheckEqual(t, "guest read", got, data)
}

// floodOutcome is how one CONNECT attempt of TestFaultConnectFlood ended.
type floodOutcome int

const (
	floodClosed  floodOutcome = iota // end of stream or ECONNRESET, nothing read: the protocol's error
	floodOK                          // "OK <port>" (an accepted CONNECT)
	floodDialErr                     // connect(2) itself failed (EAGAIN: the listen backlog was full)
	floodTimeout                     // nothing within the bound: a hang
	floodGarbage                     // bytes that are not the protocol
	floodOutcomes
)

var floodNames = [floodOutcomes]string{"closed", "OK", "connect error", "timeout", "garbage"}

// floodBound is how long one attempt of the flood may take before it counts
// as hung. The device itself answers within its handshake timeout (500 ms
// here); the bound leaves room for a -race run on a loaded machine, and
// the slowest attempt is printed.
const floodBound = time.Minute

// floodAttempt makes attempt i of the flood: a mix of CONNECTs the guest
// refuses or accepts, clients that hang up at once, send a bad or overlong
// line, or stay silent past the handshake deadline.
func floodAttempt(path string, i int, refusePort, acceptPort uint32) floodOutcome {
	c, err := net.DialTimeout("unix", path, floodBound)
	if err != nil {
		return floodDialErr
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(floodBound))
	var line string
	switch i % 50 {
	case 49: // silent
	case 48, 47, 46, 45:
		return floodClosed // hang up before CONNECT
	case 44, 43:
		line = "HELLO 1\n"
	case 42, 41:
		line = strings.Repeat("C", 100)
	default:
		if i%3 == 0 {
			line = fmt.Sprintf("CONNECT %d\n", acceptPort)
		} else {
			line = fmt.Sprintf("CONNECT %d\n", refusePort)
		}
	}
	if line != "" {
		if _, err := c.Write([]byte(line)); err != nil {
			return floodClosed // the device closed it first (handshake slots full)
		}
	}
	b := make([]byte, 64)
	n, err := io.ReadAtLeast(c, b, 1)
	switch {
	case n > 0 && strings.HasPrefix(string(b[:n]), "OK "):
		return floodOK
	case n > 0:
		return floodGarbage
	case errors.Is(err, os.ErrDeadlineExceeded):
		return floodTimeout
	default:
		return floodClosed // io.EOF, ECONNRESET
	}
}

// Row "CONNECT flood": 10,000 attempts on the host Unix socket from 200
// clients at once, with a device limited to 64 connections (and so 64
// handshakes): CONNECTs to a port the guest refuses or accepts, clients
// that hang up, send garbage or an overlong line, or say nothing. Every
// attempt ends cleanly within the bound (an "OK" line, or the socket closed:
// the protocol's error; connect(2) failing is allowed too; the slowest is
// printed), goroutines and
// descriptors stay bounded while it lasts and return to where they were,
// and the device then carries a transfer through the same socket.
func TestFaultConnectFlood(t *testing.T) {
	const (
		attempts   = 10000
		clients    = 200
		maxConns   = 64
		refusePort = 7000
		acceptPort = 7001
	)
	// The guest's waits are bounded by the whole flood, not one exchange.
	e := newEnv(t, envOpts{cfg: vsock.Config{MaxConns: maxConns}, guest: vsocktest.Options{Timeout: 3 * time.Minute}})
	uds := e.serveUDS(500 * time.Millisecond)
	fds0, gs0 := openFDs(t), runtime.NumGoroutine()

	jobs := make(chan int)
	var outcomes [floodOutcomes]atomic.Int64
	var finished, slowest atomic.Int64
	for range clients {
		go func() {
			for i := range jobs {
				start := time.Now()
				outcomes[floodAttempt(uds.Path(), i, refusePort, acceptPort)].Add(1)
				d := int64(time.Since(start))
				for {
					old := slowest.Load()
					if d <= old || slowest.CompareAndSwap(old, d) {
						break
					}
				}
				finished.Add(1)
			}
		}()
	}
	go func() {
		for i := range attempts {
			jobs <- i
		}
		close(jobs)
	}()
	start := time.Now()
	peakFDs, peakGs, polls := 0, 0, 0
	// The guest refuses refusePort, accepts acceptPort, and answers the
	// device's SHUTDOWN (the client hung up) with RST, as Linux does.
	e.g.WaitFor("the flood to end", func() bool {
		for _, p := range e.g.TakePending() {
			h := p.Hdr
			reply := func(op vsock.Op) {
				r := e.g.Header(op, h.DstPort, h.SrcPort)
				r.BufAlloc = vsocktest.DefaultGuestBuf
				e.g.Send(r, nil)
			}
			switch {
			case h.Op == vsock.OpRequest && h.DstPort == acceptPort:
				reply(vsock.OpResponse)
			case h.Op == vsock.OpRequest, h.Op == vsock.OpShutdown:
				reply(vsock.OpRst)
			}
		}
		if polls++; polls%64 == 0 {
			peakFDs, peakGs = max(peakFDs, openFDs(t)), max(peakGs, runtime.NumGoroutine())
		}
		return finished.Load() == attempts
	})
	elapsed := time.Since(start)
	var sum []string
	for k := range floodOutcomes {
		sum = append(sum, fmt.Sprintf("%s %d", floodNames[k], outcomes[k].Load()))
	}
	s := e.dev.Stats()
	t.Logf("%d attempts in %v, the slowest %v: %s; peak %d descriptors (%d before), %d goroutines (%d before); device: %d connections opened, %d RSTs sent",
		attempts, elapsed.Round(time.Millisecond), time.Duration(slowest.Load()).Round(time.Millisecond), strings.Join(sum, ", "),
		peakFDs, fds0, peakGs, gs0, s.ConnsOpened, s.RstSent)
	if n := outcomes[floodTimeout].Load() + outcomes[floodGarbage].Load(); n > 0 {
		t.Errorf("%d attempts hung or read garbage", n)
	}
	if outcomes[floodOK].Load() == 0 || outcomes[floodClosed].Load() == 0 {
		t.Error("the flood never got both an OK and a refusal")
	}
	// Each client holds at most one socket, the device at most one per
	// handshake or connection, plus the dups a handshake makes.
	if limit := fds0 + clients + 3*maxConns + 32; peakFDs > limit {
		t.Errorf("peak of %d descriptors; want at most %d", peakFDs, limit)
	}
	if limit := gs0 + clients + maxConns + 32; peakGs > limit {
		t.Errorf("peak of %d goroutines; want at most %d", peakGs, limit)
	}
	e.g.WaitFor("every connection to close", func() bool {
		for _, p := range e.g.TakePending() {
			if p.Hdr.Op == vsock.OpShutdown {
				r := e.g.Header(vsock.OpRst, p.Hdr.DstPort, p.Hdr.SrcPort)
				e.g.Send(r, nil)
			}
		}
		return e.dev.Stats().ConnsOpen == 0
	})
	waitFDs(t, fds0)
	// The device still serves the socket.
	wait := dialUDS(uds, 8000)
	c := e.g.Accept(8000)
	h, err := wait()
	if err != nil {
		t.Fatalf("connect after the flood: %v", err)
	}
	defer h.Close()
	e.transfer(c, h, vsocktest.Pattern(1, 1<<20), vsocktest.Pattern(2, 1<<20))
	if s := e.dev.Stats(); s.GuestErrors != 0 {
		t.Errorf("%d guest errors", s.GuestErrors)
	}
}

// stuckListener listens at path with a backlog of one and never accepts.
func stuckListener(t *testing.T, path string) (closeFn func()) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	// Backlog 0: Linux queues one connection, then refuses with EAGAIN.
	if err := unix.Listen(fd, 0); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	var once sync.Once
	closeFn = func() { once.Do(func() { unix.Close(fd) }) }
	t.Cleanup(closeFn)
	return closeFn
}

// echoListener accepts connections at path and echoes each.
func echoListener(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
}

// Row "<uds>_<port> listener that never accepts, backlog full": guest
// connections to a port whose host listener never calls accept(2) and has
// a backlog of one. The first fills the backlog and is established (a Unix
// connect succeeds once queued, as with Firecracker); every further attempt
// is refused at once (EAGAIN) and the guest gets RST, never waiting out a
// timeout; none of it blocks a worker. The established one stalls on credit
// when its socket fills, and is reset when the listener finally closes.
// Meanwhile a connection to an echoing listener carries 1 MiB both ways.
func TestFaultListenerStuck(t *testing.T) {
	dir, err := os.MkdirTemp("", "vstuck")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	base := filepath.Join(dir, "v.sock")
	const connectTimeout = 2 * time.Second
	e := newEnv(t, envOpts{cfg: vsock.Config{Dialer: vsock.UDSDialer{Path: base}, ConnectTimeout: connectTimeout}})
	const stuckPort, echoPort, attempts = 5000, 6000, 8
	closeStuck := stuckListener(t, fmt.Sprintf("%s_%d", base, stuckPort))
	echoListener(t, fmt.Sprintf("%s_%d", base, echoPort))

	echo, err := e.g.Connect(echoPort, 1000)
	if err != nil {
		t.Fatal(err)
	}
	data := vsocktest.Pattern(1, 1<<20)
	var sent int
	var back []byte
	pumpEcho := func() bool {
		sent += echo.TryWrite(data[sent:])
		back = append(back, echo.Consume(echo.Buffered())...)
		return len(back) >= len(data)
	}
	var tries []*vsocktest.Conn
	start := time.Now()
	for i := uint32(0); i < attempts; i++ {
		tries = append(tries, e.g.Dial(stuckPort, 2000+i))
	}
	var slowest time.Duration
	e.g.WaitFor("every attempt to be answered", func() bool {
		pumpEcho()
		for _, c := range tries {
			if !c.Established && !c.Rst {
				return false
			}
		}
		slowest = time.Since(start)
		return true
	})
	var est []*vsocktest.Conn
	for _, c := range tries {
		if c.Established {
			est = append(est, c)
		}
	}
	t.Logf("%d attempts answered within %v: %d established (queued in the backlog), %d reset", attempts, slowest.Round(time.Millisecond), len(est), attempts-len(est))
	if len(est) == 0 || len(est) == attempts {
		t.Fatalf("%d of %d attempts established; want the backlog's worth, the rest refused", len(est), attempts)
	}
	if slowest >= connectTimeout {
		t.Errorf("answers took %v: some attempt waited out the connect timeout", slowest)
	}
	for _, c := range tries {
		if c.Rst {
			c.Forget()
		}
	}
	// The queued connection takes data until its socket and the device's
	// buffer are full; the echo goes on.
	stalled := e.stallGuest(est[0], vsocktest.Pattern(2, 8<<20))
	e.g.WaitFor("the echo", pumpEcho)
	vsocktest.CheckEqual(t, "echo", back, data)
	// The listener goes away without ever accepting: the kernel resets
	// the queued connection and the device passes that on.
	closeStuck()
	e.g.WaitFor("the queued connection to end", func() bool { return est[0].Rst || est[0].Shut != 0 })
	t.Logf("the never-accepted connection took %d bytes, then ended with %v", stalled, est[0].Ctl[len(est[0].Ctl)-1].Op)
	if !est[0].Rst {
		est[0].Reset()
	}
	e.g.Sync()
	e.g.WaitFor("only the echo connection to stay", func() bool { return e.dev.Stats().ConnsOpen == 1 })
	more := vsocktest.Pattern(3, 64<<10)
	sent, back, data = 0, nil, more
	e.g.WaitFor("an echo after the listener closed", pumpEcho)
	vsocktest.CheckEqual(t, "echo after", back, more)
}
