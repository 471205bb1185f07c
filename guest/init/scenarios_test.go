package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeNet stands in for vsock with Unix sockets laid out like a
// Firecracker-style host: the guest dialing host port P reaches the Unix
// socket "<dir>/v.sock_P"; a guest listener on port P is "<dir>/guest_P",
// which the test (playing the host) connects to. Like the VMM, a dial to a
// host port nobody listens on fails with ECONNRESET.
type fakeNet struct{ dir string }

func newFakeNet(t *testing.T) *fakeNet {
	dir, err := os.MkdirTemp("", "ginit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &fakeNet{dir: dir}
}

func (f *fakeNet) hostPath(port uint32) string {
	return filepath.Join(f.dir, fmt.Sprintf("v.sock_%d", port))
}
func (f *fakeNet) guestPath(port uint32) string {
	return filepath.Join(f.dir, fmt.Sprintf("guest_%d", port))
}

func (f *fakeNet) LocalCID() (uint32, error) { return 3, nil }

func (f *fakeNet) Listen(port uint32) (net.Listener, error) {
	os.Remove(f.guestPath(port))
	return net.Listen("unix", f.guestPath(port))
}

func (f *fakeNet) Dial(ctx context.Context, cid, port uint32) (Conn, error) {
	addr := &VsockAddr{CID: cid, Port: port}
	if cid != hostCID && cid != 1 {
		return nil, &net.OpError{Op: "dial", Net: "vsock", Addr: addr, Err: os.NewSyscallError("connect", syscall.ENODEV)}
	}
	path := f.hostPath(port)
	if cid == 1 { // VMADDR_CID_LOCAL: our own listeners
		path = f.guestPath(port)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "vsock", Addr: addr, Err: os.NewSyscallError("connect", syscall.ECONNRESET)}
	}
	return c.(*net.UnixConn), nil
}

func (f *fakeNet) ListenSeqpacket(port uint32) (net.Listener, error) {
	os.Remove(f.guestPath(port))
	ln, err := net.Listen("unixpacket", f.guestPath(port))
	if err != nil {
		return nil, err
	}
	return msgListener{ln}, nil
}

func (f *fakeNet) DialSeqpacket(ctx context.Context, cid, port uint32) (MsgConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", f.hostPath(port))
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "vsock", Addr: &VsockAddr{CID: cid, Port: port}, Err: os.NewSyscallError("connect", syscall.ECONNRESET)}
	}
	return unixMsgConn{c.(*net.UnixConn)}, nil
}

// msgListener hands out unixMsgConns.
type msgListener struct{ net.Listener }

func (l msgListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return unixMsgConn{c.(*net.UnixConn)}, nil
}

// unixMsgConn is a SOCK_SEQPACKET Unix socket as a MsgConn. Unix sockets
// never report MSG_EOR: ReadMsg's eor is always false.
type unixMsgConn struct{ *net.UnixConn }

func (c unixMsgConn) ReadMsg(b []byte) (int, bool, bool, error) {
	n, _, flags, _, err := c.ReadMsgUnix(b, nil)
	if err == nil && n == 0 || errors.Is(err, io.EOF) {
		err = io.EOF
	}
	return n, false, flags&syscall.MSG_TRUNC != 0, err
}

func (c unixMsgConn) WriteMsg(b []byte, _ bool) (int, error) {
	n, _, err := c.WriteMsgUnix(b, nil, nil)
	return n, err
}

// host plays the host side: it serves a guest-dialed port with handler.
func (f *fakeNet) host(t *testing.T, port uint32, handler func(c *net.UnixConn)) {
	t.Helper()
	f.hostNet(t, "unix", port, handler)
}

// hostNet is host for network "unix" or "unixpacket".
func (f *fakeNet) hostNet(t *testing.T, network string, port uint32, handler func(c *net.UnixConn)) {
	t.Helper()
	ln, err := net.Listen(network, f.hostPath(port))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handler(c.(*net.UnixConn))
			})
		}
	})
}

// connect plays a host client of a guest listener, waiting for it to be up.
func (f *fakeNet) connect(t *testing.T, port uint32) *net.UnixConn {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("unix", f.guestPath(port))
		if err == nil {
			return c.(*net.UnixConn)
		}
		if time.Now().After(deadline) {
			t.Errorf("guest listener on port %d never came up: %v", port, err)
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func streamEcho(c *net.UnixConn) { io.Copy(c, c) }

func echoAfterEOF(c *net.UnixConn) {
	b, err := io.ReadAll(c)
	if err == nil {
		c.Write(b)
	}
}

func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	return b
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

var resultRE = regexp.MustCompile(`^init: scenario (\S+) (ok|FAIL)(?: (.*))?$`)

// run runs one scenario and returns its result line's verdict and details.
func run(t *testing.T, n Network, cmdline string) (bool, string) {
	t.Helper()
	lines, _, _ := runWith(t, scenarios, n, cmdline)
	for _, l := range lines {
		if m := resultRE.FindStringSubmatch(l); m != nil {
			return m[2] == "ok", m[3]
		}
	}
	t.Fatalf("no result line in %q", lines)
	return false, ""
}

func wantOK(t *testing.T, ok bool, details, want string) {
	t.Helper()
	if !ok || !strings.Contains(details, want) {
		t.Errorf("got ok=%v %q, want ok containing %q", ok, details, want)
	}
}

func wantFail(t *testing.T, ok bool, details, want string) {
	t.Helper()
	if ok || !strings.Contains(details, want) {
		t.Errorf("got ok=%v %q, want FAIL containing %q", ok, details, want)
	}
}

func TestPayloadIsDocumentedChaCha8(t *testing.T) {
	got := make([]byte, 100)
	io.ReadFull(newPayload(0x0102), got)
	want := make([]byte, 100)
	rand.NewChaCha8([32]byte{0x02, 0x01}).Read(want)
	if !bytes.Equal(got, want) {
		t.Error("payload is not ChaCha8 keyed by the little-endian seed")
	}
	if payloadSHA256(0x0102, 100) != sum(want) {
		t.Error("payloadSHA256 disagrees with the payload")
	}
}

func TestEcho(t *testing.T) {
	f := newFakeNet(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				c := f.connect(t, 1024)
				if c == nil {
					return
				}
				defer c.Close()
				data := randomBytes(uint64(i), 100000*(i+1))
				go func() { c.Write(data); c.CloseWrite() }()
				got, err := io.ReadAll(c)
				if err != nil || !bytes.Equal(got, data) {
					t.Errorf("connection %d: echo of %d bytes came back as %d bytes (%v)", i, len(data), len(got), err)
				}
			})
		}
		wg.Wait()
	}()
	ok, details := run(t, f, "microvm.scenarios=echo microvm.echo.conns=3")
	<-done
	wantOK(t, ok, details, "conns=3 bytes=600000")
}

func TestEchoTimesOutWithoutClients(t *testing.T) {
	f := newFakeNet(t)
	start := time.Now()
	ok, details := run(t, f, "microvm.scenarios=echo microvm.timeout=100ms")
	wantFail(t, ok, details, "timed out after 100ms")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestConnect(t *testing.T) {
	for name, handler := range map[string]func(*net.UnixConn){"streaming": streamEcho, "after EOF": echoAfterEOF} {
		t.Run(name, func(t *testing.T) {
			f := newFakeNet(t)
			f.host(t, 1030, handler)
			ok, details := run(t, f, "microvm.scenarios=connect microvm.port=1030 microvm.size=300K microvm.seed=5")
			wantOK(t, ok, details, fmt.Sprintf("bytes=%d sha256=%s", 300<<10, payloadSHA256(5, 300<<10)))
		})
	}
}

func TestConnectDetectsCorruption(t *testing.T) {
	f := newFakeNet(t)
	f.host(t, 1024, func(c *net.UnixConn) {
		b, _ := io.ReadAll(c)
		b[len(b)/2] ^= 1
		c.Write(b)
	})
	ok, details := run(t, f, "microvm.scenarios=connect microvm.size=4097")
	wantFail(t, ok, details, "echo mismatch: sent 4097 bytes")
}

func TestConnectDetectsShortEcho(t *testing.T) {
	f := newFakeNet(t)
	f.host(t, 1024, func(c *net.UnixConn) {
		b, _ := io.ReadAll(c)
		c.Write(b[:len(b)-1])
	})
	ok, details := run(t, f, "microvm.scenarios=connect microvm.size=1000")
	wantFail(t, ok, details, "got back 999 bytes")
}

func TestDialRetry(t *testing.T) {
	f := newFakeNet(t)
	ok, details := run(t, f, "microvm.scenarios=connect microvm.size=10")
	wantFail(t, ok, details, "connection reset")

	go func() {
		time.Sleep(300 * time.Millisecond)
		f.host(t, 1024, streamEcho)
	}()
	ok, details = run(t, f, "microvm.scenarios=connect microvm.size=10 microvm.dial-retry=5s")
	wantOK(t, ok, details, "bytes=10")
}

// hashingHost records the SHA-256 of everything each connection sends.
func hashingHost(t *testing.T, f *fakeNet, port uint32, pace func()) chan string {
	sums := make(chan string, 64)
	f.host(t, port, func(c *net.UnixConn) {
		h := sha256.New()
		buf := make([]byte, 16<<10)
		for {
			n, err := c.Read(buf)
			h.Write(buf[:n])
			if err != nil {
				break
			}
			if pace != nil {
				pace()
			}
		}
		sums <- hex.EncodeToString(h.Sum(nil))
	})
	return sums
}

func TestSend(t *testing.T) {
	f := newFakeNet(t)
	sums := hashingHost(t, f, 1024, nil)
	ok, details := run(t, f, "microvm.scenarios=send microvm.send.size=1M microvm.send.seed=3")
	host := <-sums
	wantOK(t, ok, details, "bytes=1048576 sha256="+host)
	if host != payloadSHA256(3, 1<<20) {
		t.Error("host received something other than the payload")
	}
}

func TestSlowReader(t *testing.T) {
	f := newFakeNet(t)
	sums := hashingHost(t, f, 1024, func() { time.Sleep(time.Millisecond) })
	ok, details := run(t, f, "microvm.scenarios=slowreader microvm.size=2M")
	host := <-sums
	wantOK(t, ok, details, "bytes=2097152 sha256="+host)
	if !strings.Contains(details, "rate=") {
		t.Errorf("no rate in %q", details)
	}
}

func TestSendFailsOnReset(t *testing.T) {
	f := newFakeNet(t)
	f.host(t, 1024, func(c *net.UnixConn) {
		c.Read(make([]byte, 100))
		c.Close()
	})
	ok, details := run(t, f, "microvm.scenarios=send microvm.size=64M")
	wantFail(t, ok, details, "write after")
}

func TestRecv(t *testing.T) {
	data := randomBytes(9, 123457)
	for _, tt := range []struct {
		extra string
		ok    bool
		want  string
	}{
		{"", true, fmt.Sprintf("bytes=123457 sha256=%s", sum(data))},
		{"microvm.recv.size=123457 microvm.recv.sha256=" + sum(data), true, "bytes=123457"},
		{"microvm.recv.size=123456", false, "want size=123456"},
		{"microvm.recv.sha256=00", false, "want size=-1 sha256=00"},
	} {
		f := newFakeNet(t)
		f.host(t, 1024, func(c *net.UnixConn) { c.Write(data) })
		ok, details := run(t, f, "microvm.scenarios=recv "+tt.extra)
		if ok != tt.ok || !strings.Contains(details, tt.want) {
			t.Errorf("%q: got ok=%v %q, want ok=%v containing %q", tt.extra, ok, details, tt.ok, tt.want)
		}
	}
}

func TestHalfCloseGuest(t *testing.T) {
	f := newFakeNet(t)
	f.host(t, 1024, echoAfterEOF)
	ok, details := run(t, f, "microvm.scenarios=halfclose-guest microvm.size=70000")
	s := payloadSHA256(1, 70000)
	wantOK(t, ok, details, fmt.Sprintf("bytes=70000 sha256=%s reply_bytes=70000 reply_sha256=%s after_shutdown=70000", s, s))
}

func TestHalfCloseGuestNoReply(t *testing.T) {
	f := newFakeNet(t)
	f.host(t, 1024, func(c *net.UnixConn) { io.Copy(io.Discard, c) })
	ok, details := run(t, f, "microvm.scenarios=halfclose-guest")
	wantFail(t, ok, details, "reply is not the data sent")
	ok, details = run(t, f, "microvm.scenarios=halfclose-guest microvm.halfclose-guest.expect=any")
	wantOK(t, ok, details, "reply_bytes=0")
	ok, details = run(t, f, "microvm.scenarios=halfclose-guest microvm.halfclose-guest.expect=maybe")
	wantFail(t, ok, details, "want echo or any")
}

func TestHalfCloseHost(t *testing.T) {
	f := newFakeNet(t)
	data := randomBytes(4, 200001)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := f.connect(t, 1500)
		if c == nil {
			return
		}
		defer c.Close()
		if _, err := c.Write(data); err != nil {
			t.Error(err)
		}
		c.CloseWrite()
		got, err := io.ReadAll(c)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("reply after SHUT_WR: %d bytes (%v), want the %d sent", len(got), err, len(data))
		}
	}()
	ok, details := run(t, f, "microvm.scenarios=halfclose-host microvm.halfclose-host.port=1500")
	<-done
	wantOK(t, ok, details, fmt.Sprintf("bytes=200001 sha256=%s", sum(data)))
}

func TestConcurrent(t *testing.T) {
	f := newFakeNet(t)
	f.host(t, 1024, streamEcho)
	ok, details := run(t, f, "microvm.scenarios=concurrent microvm.size=64K")
	wantOK(t, ok, details, "conns=32 bytes_each=65536 total=2097152")
}

func TestConcurrentReportsFailures(t *testing.T) {
	f := newFakeNet(t)
	var mu sync.Mutex
	n := 0
	f.host(t, 1024, func(c *net.UnixConn) {
		mu.Lock()
		n++
		bad := n%8 == 0
		mu.Unlock()
		if bad {
			io.Copy(io.Discard, c) // swallow instead of echoing
			return
		}
		streamEcho(c)
	})
	ok, details := run(t, f, "microvm.scenarios=concurrent microvm.size=1K")
	wantFail(t, ok, details, "4 of 32 connections failed")
}

func TestRefused(t *testing.T) {
	f := newFakeNet(t)
	ok, details := run(t, f, "microvm.scenarios=refused microvm.refused.port=77")
	wantOK(t, ok, details, "errno=ECONNRESET elapsed=")

	f.host(t, 77, func(*net.UnixConn) {})
	ok, details = run(t, f, "microvm.scenarios=refused microvm.refused.port=77")
	wantFail(t, ok, details, "connected to 2:77")

	ok, details = run(t, f, "microvm.scenarios=refused microvm.refused.cid=9")
	wantFail(t, ok, details, "got errno=ENODEV")
}

func TestErrorsKeepErrno(t *testing.T) {
	// Scenarios classify dial failures with errors.Is on the errno; make sure
	// our wrapping keeps it reachable.
	err := fmt.Errorf("dial 2:1: %w", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNRESET)})
	if !isRefusal(err) || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("isRefusal(%v) = false", err)
	}
}

func TestLoopback(t *testing.T) {
	f := newFakeNet(t)
	ok, details := run(t, f, "microvm.scenarios=loopback microvm.port=4000 microvm.size=100000")
	wantOK(t, ok, details, fmt.Sprintf("bytes=100000 sha256=%s refused=ECONNRESET", payloadSHA256(1, 100000)))
}

// recordEcho echoes each record as one record, or mangles them (two
// messages' bytes in one record, or one split in two) to show that the
// guest notices.
func recordEcho(mangle string) func(c *net.UnixConn) {
	return func(c *net.UnixConn) {
		buf := make([]byte, 1<<20)
		for i := 0; ; i++ {
			n, err := c.Read(buf)
			if err != nil || n == 0 {
				return
			}
			m := buf[:n]
			switch {
			case mangle == "merge" && i == 5: // two messages in one record
				m = append(append([]byte(nil), m...), m...)
			case mangle == "split" && n > 1:
				c.Write(m[:1])
				m = m[1:]
			}
			if _, err := c.Write(m); err != nil {
				return
			}
		}
	}
}

func TestSeqpacket(t *testing.T) {
	f := newFakeNet(t)
	f.hostNet(t, "unixpacket", 1024, recordEcho(""))
	ok, details := run(t, f, "microvm.scenarios=seqpacket microvm.seqpacket.count=40 microvm.seqpacket.max=65536")
	var total int64
	for i := range 40 {
		total += msgSize(i, 65536)
	}
	wantOK(t, ok, details, fmt.Sprintf("msgs=40 bytes=%d eor=0", total))
}

func TestSeqpacketDetectsBoundaries(t *testing.T) {
	for _, mangle := range []string{"merge", "split"} {
		t.Run(mangle, func(t *testing.T) {
			f := newFakeNet(t)
			f.hostNet(t, "unixpacket", 1024, recordEcho(mangle))
			ok, details := run(t, f, "microvm.scenarios=seqpacket microvm.seqpacket.count=10 microvm.timeout=5s")
			wantFail(t, ok, details, "boundaries or content lost")
		})
	}
}

func TestSeqpacketEcho(t *testing.T) {
	f := newFakeNet(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var c *net.UnixConn
		for deadline := time.Now().Add(5 * time.Second); c == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if nc, err := net.Dial("unixpacket", f.guestPath(1024)); err == nil {
				c = nc.(*net.UnixConn)
			}
		}
		if c == nil {
			t.Error("guest SEQPACKET listener never came up")
			return
		}
		defer c.Close()
		buf := make([]byte, 70000)
		for i, n := range []int{1, 65536, 3} {
			m := randomBytes(uint64(i), n)
			if _, err := c.Write(m); err != nil {
				t.Error(err)
				return
			}
			k, err := c.Read(buf)
			if err != nil || !bytes.Equal(buf[:k], m) {
				t.Errorf("echo %d: %d bytes, %v; want the %d-byte message", i, k, err, n)
			}
		}
		c.CloseWrite()
	}()
	ok, details := run(t, f, "microvm.scenarios=seqpacket-echo")
	<-done
	wantOK(t, ok, details, "conns=1 msgs=3 bytes=65540 eor=0")
}
