package conformance

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Guest ports the scenarios use. Listening scenarios (the host connects)
// are below 2000, dialing ones (the guest connects to <uds>_P) above.
const (
	portEcho          = 1024
	portHalfCloseHost = 1025
	portHostRefused   = 3000 // nobody listens in the guest
	portSend          = 2001
	portRecv          = 2002
	portHalfCloseGst  = 2003
	portSlow          = 2004
	portConcurrent    = 2005
	portConnect       = 2006
	portGuestRefused  = 2999 // no <uds>_2999 on the host
)

const (
	echoSize = 16 << 20
	echoSeed = 100
)

// waitEcho waits for the guest's echo scenario to listen.
func waitEcho(t *testing.T, v *vm) {
	if p := v.listening(t, "echo"); p != portEcho {
		t.Fatalf("echo listens on %d, want %d", p, portEcho)
	}
}

// hostEcho is the host-initiated echo, once the guest listens: CONNECT,
// write 16 MiB, shut down writing, read the echo to EOF; the guest's echo
// scenario must then report one connection of exactly that many bytes.
func hostEcho(t *testing.T, v *vm, uds string) {
	c, err := hostConnect(uds, portEcho)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	res, err := exchange(c, payload(echoSeed), echoSize)
	if err != nil {
		t.Fatal(err)
	}
	if res.got.n != echoSize || res.got.Sum() != res.sent.Sum() {
		t.Errorf("echo: sent %d bytes sha256=%s, got back %d sha256=%s", res.sent.n, res.sent.Sum(), res.got.n, res.got.Sum())
	}
	f := v.result(t, "echo")
	if f["conns"] != "1" || f["bytes"] != strconv.Itoa(echoSize) {
		t.Errorf("guest echo result %v, want conns=1 bytes=%d", f, echoSize)
	}
	t.Logf("16 MiB echoed in %v", time.Since(start).Round(time.Millisecond))
}

// runData boots one guest on tg and runs every data scenario, checking each
// on both sides: a refused host connection, a 16 MiB host echo, half-close
// from either side, guest send and receive, a slow host reader (credit), 32
// concurrent guest connections, a refused guest connection, and SEQPACKET
// messages up to 64 KiB echoed both ways (guest- and host-initiated). It returns
// the guest once every scenario reported, for the caller to finish and
// check the device's log.
func runData(t *testing.T, tg target) *vm {
	const (
		sendSize, sendSeed   = 4 << 20, 11
		recvSize, recvSeed   = 4 << 20, 12
		hcgSize, hcgSeed     = 1 << 20, 13
		slowSize, slowSeed   = 4 << 20, 14
		concConns, concSize  = 32, 256 << 10
		concSeed             = 200
		hchSize, hchSeed     = 1 << 20, 15
		refusedWithin        = 2 * time.Second
		slowStall, slowChunk = 500 * time.Millisecond, 16 << 10
		slowPause            = 4 * time.Millisecond
	)
	recvSum := payloadSum(recvSeed, recvSize)

	// Host sides of the guest-initiated scenarios, up before the guest dials.
	sendL := listenGuest(t, tg.uds(), portSend, 1, func(c *net.UnixConn) hostResult {
		r := hostResult{got: newDigest()}
		_, r.err = io.Copy(r.got, c)
		return r
	})
	recvL := listenGuest(t, tg.uds(), portRecv, 1, func(c *net.UnixConn) hostResult {
		r := hostResult{sent: newDigest()}
		_, r.err = io.CopyN(io.MultiWriter(c, r.sent), payload(recvSeed), recvSize)
		return r
	})
	hcgL := listenGuest(t, tg.uds(), portHalfCloseGst, 1, func(c *net.UnixConn) hostResult {
		// Read to the guest's shutdown, then answer: the guest must still
		// receive after shutting down its writing side.
		r := hostResult{got: newDigest(), sent: newDigest()}
		data, err := io.ReadAll(c)
		r.got.Write(data)
		if err != nil {
			r.err = fmt.Errorf("read before the guest's shutdown: %w", err)
			return r
		}
		if _, err := c.Write(data); err != nil {
			r.err = fmt.Errorf("reply after the guest's shutdown: %w", err)
		}
		r.sent.Write(data)
		return r
	})
	slowL := listenGuest(t, tg.uds(), portSlow, 1, func(c *net.UnixConn) hostResult {
		// Stall, then read in small chunks with pauses: far slower than the
		// guest writes, so it runs out of credit again and again.
		r := hostResult{got: newDigest()}
		time.Sleep(slowStall)
		buf := make([]byte, slowChunk)
		for {
			n, err := c.Read(buf)
			r.got.Write(buf[:n])
			if errors.Is(err, io.EOF) {
				return r
			}
			if err != nil {
				r.err = fmt.Errorf("read after %d bytes: %w", r.got.n, err)
				return r
			}
			time.Sleep(slowPause)
		}
	})
	var open, maxOpen atomic.Int32
	concL := listenGuest(t, tg.uds(), portConcurrent, concConns, func(c *net.UnixConn) hostResult {
		n := open.Add(1)
		for m := maxOpen.Load(); n > m && !maxOpen.CompareAndSwap(m, n); m = maxOpen.Load() {
		}
		defer open.Add(-1)
		return echoServe(c)
	})

	seqL := listenGuestNet(t, "unixpacket", tg.uds(), portSeqpacket, 1, recordEchoServe)

	v := tg.boot(t, append(seqpacketParams(),
		"microvm.scenarios=echo,halfclose-host,send,recv,halfclose-guest,slowreader,concurrent,refused,seqpacket,seqpacket-echo",
		fmt.Sprintf("microvm.echo.port=%d", portEcho),
		fmt.Sprintf("microvm.halfclose-host.port=%d", portHalfCloseHost),
		fmt.Sprintf("microvm.send.port=%d microvm.send.size=%d microvm.send.seed=%d", portSend, sendSize, sendSeed),
		fmt.Sprintf("microvm.recv.port=%d microvm.recv.size=%d microvm.recv.sha256=%s", portRecv, recvSize, recvSum),
		fmt.Sprintf("microvm.halfclose-guest.port=%d microvm.halfclose-guest.size=%d microvm.halfclose-guest.seed=%d", portHalfCloseGst, hcgSize, hcgSeed),
		fmt.Sprintf("microvm.slowreader.port=%d microvm.slowreader.size=%d microvm.slowreader.seed=%d", portSlow, slowSize, slowSeed),
		fmt.Sprintf("microvm.concurrent.port=%d microvm.concurrent.conns=%d microvm.concurrent.size=%d microvm.concurrent.seed=%d", portConcurrent, concConns, concSize, concSeed),
		fmt.Sprintf("microvm.refused.port=%d microvm.refused.within=%v", portGuestRefused, refusedWithin),
	))
	if l := v.next(t, "vsock CID line", bootTimeout, func(l string) bool { return len(l) > 12 && l[:12] == "init: vsock " }); l != fmt.Sprintf("init: vsock cid=%d", guestCID) {
		t.Fatalf("guest: %s", l)
	}

	waitEcho(t, v)
	t.Run("refused-host-to-guest", func(t *testing.T) {
		// While the guest listens on the echo port only, a CONNECT to
		// another port must be answered by closing the Unix connection.
		start := time.Now()
		c, err := hostConnect(tg.uds(), portHostRefused)
		if err == nil {
			c.Close()
			t.Fatalf("CONNECT %d succeeded; nobody listens there", portHostRefused)
		}
		if !errors.Is(err, io.EOF) {
			t.Fatalf("want the connection closed without OK, got %v", err)
		}
		if d := time.Since(start); d > refusedWithin {
			t.Errorf("refusal took %v, want under %v", d, refusedWithin)
		}
		t.Logf("refused in %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("echo-host-16MiB", func(t *testing.T) { hostEcho(t, v, tg.uds()) })

	t.Run("halfclose-host", func(t *testing.T) {
		v.listening(t, "halfclose-host")
		c, err := hostConnect(tg.uds(), portHalfCloseHost)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The guest answers only after our shutdown(SHUT_WR): everything
		// read here arrived after we stopped writing.
		res, err := exchange(c, payload(hchSeed), hchSize)
		if err != nil {
			t.Fatal(err)
		}
		if res.got.n != hchSize || res.got.Sum() != res.sent.Sum() {
			t.Errorf("reply after our shutdown: %d bytes sha256=%s, want %d sha256=%s", res.got.n, res.got.Sum(), res.sent.n, res.sent.Sum())
		}
		checkSum(t, "halfclose-host", v.result(t, "halfclose-host"), res.sent.n, res.sent.Sum())
	})

	t.Run("send-guest-to-host", func(t *testing.T) {
		f := v.result(t, "send")
		r := sendL.wait(t)
		if r.err != nil {
			t.Fatal(r.err)
		}
		checkSum(t, "send (host read)", f, r.got.n, r.got.Sum())
		checkSum(t, "send (payload)", f, sendSize, payloadSum(sendSeed, sendSize))
	})

	t.Run("recv-host-to-guest", func(t *testing.T) {
		f := v.result(t, "recv")
		r := recvL.wait(t)
		if r.err != nil {
			t.Fatal(r.err)
		}
		checkSum(t, "recv", f, r.sent.n, r.sent.Sum())
		checkSum(t, "recv (payload)", f, recvSize, recvSum)
	})

	t.Run("halfclose-guest", func(t *testing.T) {
		f := v.result(t, "halfclose-guest")
		r := hcgL.wait(t)
		if r.err != nil {
			t.Fatal(r.err)
		}
		checkSum(t, "halfclose-guest", f, r.got.n, payloadSum(hcgSeed, hcgSize))
		if f["reply_bytes"] != strconv.Itoa(hcgSize) || f["after_shutdown"] != strconv.Itoa(hcgSize) {
			t.Errorf("guest got reply_bytes=%s after_shutdown=%s, want %d of them after its shutdown", f["reply_bytes"], f["after_shutdown"], hcgSize)
		}
	})

	t.Run("slowreader-credit", func(t *testing.T) {
		f := v.result(t, "slowreader")
		r := slowL.wait(t)
		if r.err != nil {
			t.Fatal(r.err) // a reset shows here as ECONNRESET
		}
		checkSum(t, "slowreader (host read)", f, r.got.n, r.got.Sum())
		checkSum(t, "slowreader (payload)", f, slowSize, payloadSum(slowSeed, slowSize))
		t.Logf("guest: elapsed=%s rate=%s", f["elapsed"], f["rate"])
	})

	t.Run("concurrent-32", func(t *testing.T) {
		f := v.result(t, "concurrent")
		want := map[string]bool{}
		for i := range concConns {
			want[payloadSum(concSeed+uint64(i), concSize)] = true
		}
		for range concConns {
			r := concL.wait(t)
			if r.err != nil {
				t.Error(r.err)
				continue
			}
			if r.got.n != concSize || !want[r.got.Sum()] {
				t.Errorf("a connection carried %d bytes sha256=%s: not one of the %d payloads, or a duplicate", r.got.n, r.got.Sum(), concConns)
			}
			delete(want, r.got.Sum())
		}
		if f["conns"] != strconv.Itoa(concConns) {
			t.Errorf("guest result %v", f)
		}
		if m := maxOpen.Load(); m < 2 {
			t.Errorf("at most %d connection(s) open at once on the host", m)
		} else {
			t.Logf("%d of %d connections open at once on the host", m, concConns)
		}
	})

	t.Run("refused-guest-to-host", func(t *testing.T) {
		f := v.result(t, "refused")
		if f["errno"] != "ECONNRESET" && f["errno"] != "ECONNREFUSED" {
			t.Errorf("guest result %v", f)
		}
		if _, err := os.Stat(fmt.Sprintf("%s_%d", tg.uds(), portGuestRefused)); err == nil {
			t.Errorf("%s_%d exists", tg.uds(), portGuestRefused)
		}
		t.Logf("guest: errno=%s elapsed=%s", f["errno"], f["elapsed"])
	})

	t.Run("seqpacket-guest-to-host", func(t *testing.T) { checkGuestSeqpacket(t, v, seqL) })
	t.Run("seqpacket-host-to-guest", func(t *testing.T) { hostSeqpacketEcho(t, v, tg.uds()) })
	return v
}

// target is a machine under test as the data scenarios see it: the QEMU
// and back-end pair (qemuTarget), or a microvm run process (microvmTarget).
type target interface {
	// uds is the host Unix socket of the guest's vsock device: host
	// clients CONNECT there, and guest connections to port P go to
	// <uds>_P.
	uds() string
	// boot starts the guest with these microvm.* kernel parameters.
	boot(t *testing.T, params []string) *vm
}

// qemuTarget is QEMU with a vhost-user-vsock-device served by the back-end.
type qemuTarget struct {
	be     *backend
	legacy bool
}

func (q qemuTarget) uds() string { return q.be.uds }

func (q qemuTarget) boot(t *testing.T, params []string) *vm {
	return boot(t, q.be, bootOpts{legacy: q.legacy, params: params})
}

// TestModern boots one guest over modern virtio-mmio and runs every data
// scenario against the back-end, checking each on both sides.
func TestModern(t *testing.T) {
	be := startBackend(t, need(t))
	v := runData(t, qemuTarget{be: be})
	v.finish(t)
	be.waitLog(t, "front-end disconnected", 1)
	be.alive(t)
	be.checkClean(t)
	f := be.features(t)
	if f&(1<<32) == 0 {
		t.Errorf("modern virtio-mmio negotiated features %#x, without VERSION_1", f)
	}
	if f&(1<<1) == 0 {
		t.Errorf("negotiated features %#x, without VIRTIO_VSOCK_F_SEQPACKET", f)
	}
	t.Logf("negotiated features %#x", f)
}

// TestLegacyMMIO runs a host-initiated and a guest-initiated echo with QEMU's
// default (legacy, virtio 0.9.5) virtio-mmio transport.
func TestLegacyMMIO(t *testing.T) {
	be := startBackend(t, need(t))
	const connectSize, connectSeed = 1 << 20, 31
	connL := listenGuest(t, be.uds, portConnect, 1, echoServe)
	v := boot(t, be, bootOpts{legacy: true, params: []string{
		"microvm.scenarios=echo,connect",
		fmt.Sprintf("microvm.echo.port=%d", portEcho),
		fmt.Sprintf("microvm.connect.port=%d microvm.connect.size=%d microvm.connect.seed=%d", portConnect, connectSize, connectSeed),
	}})
	waitEcho(t, v)
	t.Run("echo-host-16MiB", func(t *testing.T) { hostEcho(t, v, be.uds) })
	t.Run("connect-guest", func(t *testing.T) {
		f := v.result(t, "connect")
		r := connL.wait(t)
		if r.err != nil {
			t.Fatal(r.err)
		}
		checkSum(t, "connect", f, r.got.n, r.got.Sum())
		checkSum(t, "connect (payload)", f, connectSize, payloadSum(connectSeed, connectSize))
	})
	v.finish(t)
	be.waitLog(t, "front-end disconnected", 1)
	be.alive(t)
	be.checkClean(t)
	// The legacy transport cannot negotiate VIRTIO_F_VERSION_1 (bit 32).
	f := be.features(t)
	if f&(1<<32) != 0 {
		t.Errorf("legacy virtio-mmio negotiated features %#x, with VERSION_1", f)
	}
	t.Logf("negotiated features %#x", f)
}

// TestQEMURestart kills QEMU with SIGKILL in the middle of a host
// connection, checks the back-end closes that connection and keeps running,
// then boots a new QEMU against the same back-end process and echoes 16 MiB.
func TestQEMURestart(t *testing.T) {
	be := startBackend(t, need(t))
	params := []string{"microvm.scenarios=echo", fmt.Sprintf("microvm.echo.port=%d", portEcho)}

	v := boot(t, be, bootOpts{params: params})
	waitEcho(t, v)
	c, err := hostConnect(be.uds, portEcho)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Stream far more than will be echoed before the kill.
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.CopyN(c, payload(echoSeed), 1<<30) })
	buf := make([]byte, 64<<10)
	var got int64
	for got < 1<<20 {
		n, err := c.Read(buf)
		got += int64(n)
		if err != nil {
			t.Fatalf("echo before the kill, after %d bytes: %v", got, err)
		}
	}
	killed := time.Now()
	v.kill()
	if v.waitErr == nil {
		t.Fatalf("QEMU exited cleanly; want killed")
	}
	// The old connection must end: EOF or an error, and soon.
	_ = c.SetReadDeadline(time.Now().Add(backendTimeout))
	var readErr error
	for readErr == nil {
		var n int
		n, readErr = c.Read(buf)
		got += int64(n)
	}
	if ne, ok := readErr.(net.Error); ok && ne.Timeout() {
		t.Fatalf("host connection still open %v after QEMU was killed", backendTimeout)
	}
	closedIn := time.Since(killed)
	c.Close() // stops the writer
	wg.Wait()
	t.Logf("host connection ended %v after the kill (%v; %d bytes echoed)", closedIn.Round(time.Millisecond), readErr, got)
	be.waitLog(t, "front-end disconnected", 1)
	be.alive(t)
	be.checkClean(t)

	v2 := boot(t, be, bootOpts{params: params})
	waitEcho(t, v2)
	t.Run("echo-after-restart", func(t *testing.T) { hostEcho(t, v2, be.uds) })
	v2.finish(t)
	be.waitLog(t, "front-end disconnected", 2)
	be.alive(t)
	be.checkClean(t)
	if n := be.count("front-end connected"); n != 2 {
		t.Errorf("backend served %d front-ends, want 2", n)
	}
}
