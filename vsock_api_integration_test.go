package microvm_test

// KVM tests of the in-process vsock API with the bundled test guest
// (docs/testguest.md): DialVsock to the guest's echo mode, and ListenVsock
// for the guest's connect mode, next to the "<uds>_<port>" fallback.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/hybrid"
)

// vsockPromptly bounds calls that must return at once (the host may be loaded).
const vsockPromptly = 2 * time.Second

// TestDialVsock: a few MiB echoed through DialVsock, a port nobody listens
// on (ErrVsockRefused), a context that expires or is cancelled before the
// guest's driver is up (ErrVsockTimeout, context.Canceled), and a machine
// without vsock (ErrNoVsock).
func TestDialVsock(t *testing.T) {
	testenv.RequireKVM(t)

	t.Run("echo and refused", func(t *testing.T) {
		g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=1", vsockTestPort))
		data := randomBytes(t, 4<<20)
		g.waitListening(vsockTestPort)

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := g.m.DialVsock(ctx, 9999)
		if !errors.Is(err, microvm.ErrVsockRefused) || errors.Is(err, microvm.ErrVsockTimeout) {
			t.Errorf("DialVsock to a port nobody listens on: %v, want ErrVsockRefused only", err)
		}
		if d := time.Since(start); d > vsockPromptly {
			t.Errorf("refusal took %v", d)
		}

		nc, err := g.m.DialVsock(ctx, vsockTestPort)
		if err != nil {
			t.Fatalf("DialVsock: %v; log:\n%s", err, g.log)
		}
		c, ok := nc.(*hybrid.Conn)
		if !ok {
			t.Fatalf("DialVsock returned a %T, want *hybrid.Conn", nc)
		}
		defer c.Close()
		checkHostPort(t, uint64(c.HostPort()))
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		if err := echo(&hostConn{UnixConn: c.UnixConn, port: uint64(c.HostPort())}, data); err != nil {
			t.Fatalf("echo: %v; console:\n%s", err, g.console)
		}
		c.Close()
		g.wait(0, 20*time.Second)
		// The guest will not run again: no waiting for it.
		start = time.Now()
		if _, err := g.m.DialVsock(ctx, vsockTestPort); !errors.Is(err, microvm.ErrStopped) || errors.Is(err, microvm.ErrVsockRefused) {
			t.Errorf("DialVsock after the machine stopped: %v, want ErrStopped", err)
		}
		if d := time.Since(start); d > vsockPromptly {
			t.Errorf("DialVsock after the machine stopped took %v", d)
		}
		if s := g.m.VsockStats(); s.GuestErrors != 0 || s.TxBytes != 4<<20 || s.RxBytes != 4<<20 {
			t.Errorf("device: %d guest errors, tx %d rx %d bytes; want 0, %d, %d", s.GuestErrors, s.TxBytes, s.RxBytes, 4<<20, 4<<20)
		}
	})

	// The machine is created but not run: the guest driver never comes
	// up, so only the context ends the wait.
	t.Run("deadline", func(t *testing.T) {
		g := newVsockGuest(t, "testguest.mode=echo testguest.port=1024")
		const timeout = 200 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		c, err := g.m.DialVsock(ctx, vsockTestPort)
		d := time.Since(start)
		if err == nil {
			c.Close()
			t.Fatal("DialVsock succeeded on a machine that is not running")
		}
		if !errors.Is(err, microvm.ErrVsockTimeout) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, microvm.ErrVsockRefused) {
			t.Errorf("DialVsock: %v, want ErrVsockTimeout and context.DeadlineExceeded", err)
		}
		if d < timeout-10*time.Millisecond || d > timeout+vsockPromptly {
			t.Errorf("DialVsock returned after %v, want about %v", d, timeout)
		}
		if err := g.m.ResetVsockTransport(); !errors.Is(err, vsock.ErrNotActive) {
			t.Errorf("ResetVsockTransport before the guest's driver is up: %v, want vsock.ErrNotActive", err)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		g := newVsockGuest(t, "testguest.mode=echo testguest.port=1024")
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		c, err := g.m.DialVsock(ctx, vsockTestPort)
		d := time.Since(start)
		if err == nil {
			c.Close()
			t.Fatal("DialVsock succeeded on a machine that is not running")
		}
		if !errors.Is(err, context.Canceled) || errors.Is(err, microvm.ErrVsockTimeout) {
			t.Errorf("DialVsock: %v, want context.Canceled", err)
		}
		// The device's own connect timeout (2 s) must not be what ended it.
		if d > time.Second {
			t.Errorf("DialVsock returned %v after the start, 100 ms after a cancel", d)
		}
		// Already done: fails before touching the device.
		if _, err := g.m.DialVsock(ctx, vsockTestPort); !errors.Is(err, context.Canceled) {
			t.Errorf("DialVsock with a cancelled context: %v, want context.Canceled", err)
		}
	})

	// A dial waiting for the guest's driver ends when the machine stops,
	// with ErrStopped, not after the device's connect timeout.
	t.Run("stopped while waiting", func(t *testing.T) {
		g := newVsockGuest(t, "testguest.mode=echo testguest.port=1024")
		errc := make(chan error, 1)
		start := time.Now()
		go func() {
			c, err := g.m.DialVsock(context.Background(), vsockTestPort)
			if err == nil {
				c.Close()
			}
			errc <- err
		}()
		time.Sleep(100 * time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := g.m.Run(ctx); err != nil {
			t.Fatalf("Run: %v", err)
		}
		err := <-errc
		if !errors.Is(err, microvm.ErrStopped) {
			t.Errorf("DialVsock: %v, want ErrStopped", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("DialVsock returned %v after the start, 100 ms after the stop", d)
		}
	})

	t.Run("no vsock device", func(t *testing.T) {
		m, err := microvm.New(microvm.Config{Kernel: testenv.TestGuest(t), MemoryBytes: 64 << 20, Log: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if _, err := m.DialVsock(context.Background(), vsockTestPort); !errors.Is(err, microvm.ErrNoVsock) {
			t.Errorf("DialVsock: %v, want ErrNoVsock", err)
		}
		if _, err := m.ListenVsock(5000); !errors.Is(err, microvm.ErrNoVsock) {
			t.Errorf("ListenVsock: %v, want ErrNoVsock", err)
		}
		if err := m.ResetVsockTransport(); !errors.Is(err, microvm.ErrNoVsock) {
			t.Errorf("ResetVsockTransport: %v, want ErrNoVsock", err)
		}
	})
}

// patternSum is the SHA-256 of the first n bytes of the test guest's data
// pattern (docs/testguest.md: byte i is (i*7 + (i >> 8)) & 0xff).
func patternSum(n int) [sha256.Size]byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return sha256.Sum256(b)
}

// TestListenVsock: the guest's connect mode reaches an in-process listener
// (data both ways: the host checks the pattern's SHA-256, the guest checks
// the echo), and a port nobody listens on in-process still goes to
// "<uds>_<port>".
func TestListenVsock(t *testing.T) {
	testenv.RequireKVM(t)
	const port, n = 5000, 4 << 20

	t.Run("accept", func(t *testing.T) {
		g := newVsockGuest(t, fmt.Sprintf("testguest.mode=connect testguest.port=%d testguest.bytes=%d", port, n))
		l, err := g.m.ListenVsock(port)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := g.m.ListenVsock(port); err == nil {
			t.Error("a second ListenVsock on an open port succeeded")
		}
		if got := l.Addr().String(); got != fmt.Sprintf("2:%d", port) {
			t.Errorf("Addr = %q", got)
		}
		g.start()
		c, err := testenv.AcceptWithin(t, l, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := c.LocalAddr().String(); got != fmt.Sprintf("2:%d", port) {
			t.Errorf("LocalAddr = %q", got)
		}
		if ra := c.RemoteAddr().(*microvm.VsockAddr); ra.CID != 3 || ra.Port < 1024 {
			t.Errorf("RemoteAddr = %v, want CID 3 and the guest's port (>= 1024)", ra)
		}
		// Echo what the guest sends and hash it; the guest checks the
		// echo, then shuts the connection down (end of stream here).
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		h := sha256.New()
		got, err := io.Copy(io.MultiWriter(c, h), c)
		if err != nil {
			t.Fatalf("echo after %d bytes: %v; console:\n%s", got, err, g.console)
		}
		c.Close()
		if want := patternSum(n); got != n || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Errorf("received %d bytes (SHA-256 %x), want %d bytes of the pattern (%x)", got, h.Sum(nil), n, want)
		}
		g.wait(0, 30*time.Second)
		if !strings.Contains(g.console.String(), fmt.Sprintf("testguest: connect ok: %d bytes echoed", n)) {
			t.Errorf("no 'connect ok' line; console:\n%s", g.console)
		}
		l.Close()
		// The port is free again after Close.
		l2, err := g.m.ListenVsock(port)
		if err != nil {
			t.Errorf("ListenVsock after Close: %v", err)
		} else {
			l2.Close()
		}
	})

	t.Run("other port goes to the Unix socket", func(t *testing.T) {
		g := newVsockGuest(t, fmt.Sprintf("testguest.mode=connect testguest.port=%d testguest.bytes=%d", port, n))
		l, err := g.m.ListenVsock(port + 1)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		echoed := echoServer(t, fmt.Sprintf("%s_%d", g.uds, port))
		g.start()
		g.wait(0, 30*time.Second)
		deadline := time.Now().Add(5 * time.Second)
		for echoed() != n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := echoed(); got != n {
			t.Errorf("Unix-socket echo server echoed %d bytes, want %d", got, n)
		}
		// No connection reached the listener: one queued there would come
		// out of Accept at once; an empty listener's Accept ends only when
		// the listener closes.
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := l.Accept() // nil once l is closed
			accepted <- c
		}()
		var c net.Conn
		select {
		case c = <-accepted:
		case <-time.After(vsockPromptly):
			l.Close()
			c = <-accepted
		}
		if c != nil {
			c.Close()
			t.Errorf("a connection reached the listener on port %d", port+1)
		}
	})

	t.Run("machine close closes listeners", func(t *testing.T) {
		g := newVsockGuest(t, "testguest.mode=echo testguest.port=1024")
		l, err := g.m.ListenVsock(port)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.m.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Machine.Close: %v, want net.ErrClosed", err)
		}
	})
}

// TestResetVsockTransport: a host-side transport reset in the middle of an
// echo ends that connection on the host (end of stream) and reaches the
// test guest's driver as a TRANSPORT_RESET event (it drops the connection,
// logs it and posts the event buffer again, which lets the device set up
// connections again); the next connection echoes in full and the guest,
// having seen both connections close, exits 0.
func TestResetVsockTransport(t *testing.T) {
	g := startVsockGuest(t, fmt.Sprintf("testguest.mode=echo testguest.port=%d testguest.conns=2", vsockTestPort))
	g.waitListening(vsockTestPort)
	c, err := g.connect(vsockTestPort)
	if err != nil {
		t.Fatalf("connect: %v; log:\n%s", err, g.log)
	}
	defer c.Close()
	if _, err := c.Write([]byte("before the reset")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("before the reset"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "before the reset" {
		t.Fatalf("echo before the reset: %q, %v", got, err)
	}
	if err := g.m.ResetVsockTransport(); err != nil {
		t.Fatalf("ResetVsockTransport: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(vsockPromptly))
	if n, err := c.Read(got); err != io.EOF {
		t.Errorf("host end after the reset: %d bytes, %v; want end of stream", n, err)
	}
	if !g.console.WaitFor("vsock: transport reset", 20*time.Second, g.done) {
		t.Fatalf("the guest did not see the event; console:\n%s\nlog:\n%s", g.console, g.log)
	}
	c2, err := g.connect(vsockTestPort)
	if err != nil {
		t.Fatalf("connect after the reset: %v; log:\n%s", err, g.log)
	}
	defer c2.Close()
	if err := echo(c2, randomBytes(t, 1<<20)); err != nil {
		t.Fatalf("echo after the reset: %v; console:\n%s", err, g.console)
	}
	g.wait(0, 20*time.Second)
	// The guest's repost of the event buffer, not the timeout, lifted
	// the device's fence on new connections.
	if strings.Contains(g.log.String(), "transport reset: the driver") {
		t.Errorf("the device did not see the guest handle the event; log:\n%s", g.log)
	}
	if s := g.m.VsockStats(); s.TransportResets != 1 || s.EventsSent != 1 || s.GuestErrors != 0 {
		t.Errorf("device: %d resets, %d events, %d guest errors; want 1, 1, 0", s.TransportResets, s.EventsSent, s.GuestErrors)
	}
}
