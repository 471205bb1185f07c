package vsock_test

import (
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// waitTimeout bounds every wait in these tests.
const waitTimeout = 10 * time.Second

// env is one vsock device driven by a vsocktest guest, with a scriptable
// dialer for guest-initiated connections. Tests and fuzz targets share it.
type env struct {
	tb   testing.TB
	dev  *vsock.Device
	g    *vsocktest.Guest
	dial *vsocktest.Dialer

	allowFail      bool // the test expects Activation.Fail
	allowGuestErrs bool // the test expects GuestErrors
}

type envOpts struct {
	cfg   vsock.Config // CID, Options and Dialer are filled in when zero
	guest vsocktest.Options
	// noLeakCheck skips the goroutine check at the end (fuzzing checks
	// it once per input itself).
	noLeakCheck bool
	// noDialer leaves Config.Dialer nil (guest connections refused).
	noDialer bool
}

// quietLog discards the device's logs; VSOCK_TEST_LOG=1 shows them.
func quietLog() logrus.FieldLogger {
	l := logrus.New()
	if os.Getenv("VSOCK_TEST_LOG") == "" {
		l.Out = io.Discard
	} else {
		l.Level = logrus.DebugLevel
	}
	return l
}

func newEnv(tb testing.TB, o envOpts) *env {
	tb.Helper()
	if !o.noLeakCheck {
		base := runtime.NumGoroutine()
		tb.Cleanup(func() { checkGoroutines(tb, base) })
	}
	e := &env{tb: tb, dial: vsocktest.NewDialer(tb)}
	if o.cfg.CID == 0 {
		o.cfg.CID = vsocktest.DefaultCID
	}
	if o.cfg.Dialer == nil && !o.noDialer {
		o.cfg.Dialer = e.dial
	}
	if o.cfg.Log == nil {
		o.cfg.Log = quietLog()
	}
	if o.cfg.ConnectTimeout == 0 {
		o.cfg.ConnectTimeout = 2 * time.Second
	}
	dev, err := vsock.New(o.cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e.dev = dev
	tb.Cleanup(dev.Close)
	o.guest.CID = o.cfg.CID
	if o.guest.Timeout == 0 {
		o.guest.Timeout = waitTimeout
	}
	if o.guest.QueueSize == 0 {
		o.guest.QueueSize = o.cfg.QueueSize
	}
	e.g = vsocktest.New(tb, dev, o.guest)
	// Runs before the guest's own cleanup (LIFO), while the device is
	// still active.
	tb.Cleanup(func() {
		if tb.Failed() {
			return
		}
		if f := e.g.Fails(); len(f) > 0 && !e.allowFail {
			tb.Errorf("device failed unexpectedly: %v", f)
		}
		if s := dev.Stats(); s.GuestErrors > 0 && !e.allowGuestErrs && !e.allowFail {
			tb.Errorf("device counted %d guest errors in a test of a well-behaved guest", s.GuestErrors)
		}
	})
	return e
}

// checkGoroutines waits until no more goroutines run than base, and fails
// with their stacks if that does not happen within the wait bound.
func checkGoroutines(tb testing.TB, base int) {
	tb.Helper()
	deadline := time.Now().Add(waitTimeout)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			tb.Errorf("goroutines leaked: %d running, %d before the test\n%s", runtime.NumGoroutine(), base, buf)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// connectGuest opens a guest-initiated connection and returns both ends.
func (e *env) connectGuest(hostPort, guestPort uint32) (*vsocktest.Conn, *vsocktest.HostConn) {
	e.tb.Helper()
	c, err := e.g.Connect(hostPort, guestPort)
	if err != nil {
		e.tb.Fatal(err)
	}
	h := e.dial.Accept(waitTimeout)
	if h.Port != hostPort {
		e.tb.Fatalf("dialled port %d; want %d", h.Port, hostPort)
	}
	return c, h
}

// connectHost opens a host-initiated connection (with prefix bytes after
// the CONNECT line), has the guest accept it and checks the OK line.
func (e *env) connectHost(guestPort uint32, prefix []byte) (*vsocktest.Conn, *net.UnixConn) {
	e.tb.Helper()
	h, err := vsocktest.HostConnect(e.tb, e.dev, guestPort, prefix, time.Now().Add(waitTimeout))
	if err != nil {
		e.tb.Fatalf("ConnectFromHost: %v", err)
	}
	c := e.g.Accept(guestPort)
	port, err := vsocktest.ReadOK(h, waitTimeout)
	if err != nil {
		e.tb.Fatal(err)
	}
	if port != c.HostPort || port < 1<<30 || port >= 1<<31 {
		e.tb.Fatalf("OK %d; the guest saw host port %d; want one port in [2^30, 2^31)", port, c.HostPort)
	}
	return c, h
}

// transfer moves g2h from the guest to the host and h2g from the host to
// the guest at the same time and checks both arrive intact.
func (e *env) transfer(c *vsocktest.Conn, h net.Conn, g2h, h2g []byte) {
	e.tb.Helper()
	werr := make(chan error, 1)
	rres := make(chan []byte, 1)
	rerr := make(chan error, 1)
	go func() {
		_ = h.SetWriteDeadline(time.Now().Add(waitTimeout))
		_, err := h.Write(h2g)
		_ = h.SetWriteDeadline(time.Time{})
		werr <- err
	}()
	go func() {
		b, err := vsocktest.ReadFull(h, len(g2h), waitTimeout)
		rres <- b
		rerr <- err
	}()
	sent := 0
	var got []byte
	e.g.WaitFor("a transfer both ways", func() bool {
		sent += c.TryWrite(g2h[sent:])
		if c.Buffered() > 0 {
			got = append(got, c.Consume(c.Buffered())...)
		}
		if c.Rst {
			e.tb.Fatalf("connection reset during the transfer (%d of %d sent, %d of %d received)", sent, len(g2h), len(got), len(h2g))
		}
		return sent == len(g2h) && len(got) >= len(h2g)
	})
	if err := <-werr; err != nil {
		e.tb.Fatalf("host write: %v", err)
	}
	hostGot := <-rres
	if err := <-rerr; err != nil {
		e.tb.Fatalf("host read: %v (got %d of %d bytes)", err, len(hostGot), len(g2h))
	}
	vsocktest.CheckEqual(e.tb, "host->guest", got, h2g)
	vsocktest.CheckEqual(e.tb, "guest->host", hostGot, g2h)
}

// stallGuest writes data on c with the host end not reading until the
// guest is stalled: the device has processed everything and gives no
// credit back for a while. It returns how much was sent.
func (e *env) stallGuest(c *vsocktest.Conn, data []byte) int {
	e.tb.Helper()
	sent := 0
	credit := func() bool { return c.Credit() > 0 }
	for deadline := time.Now().Add(waitTimeout); time.Now().Before(deadline); {
		sent += c.TryWrite(data[sent:])
		if sent == len(data) {
			e.tb.Fatalf("the guest never stalled: the host socket took %d bytes", sent)
		}
		e.g.Sync()
		if !e.g.Within(quietFor, credit) && !e.g.Within(3*quietFor, credit) {
			return sent
		}
	}
	e.tb.Fatalf("the guest did not stall within %v (%d bytes sent)", waitTimeout, sent)
	return 0
}

// hostRead reads n bytes on the host end and checks them against want.
func hostRead(tb testing.TB, h net.Conn, want []byte) {
	tb.Helper()
	got, err := vsocktest.ReadFull(h, len(want), waitTimeout)
	if err != nil {
		tb.Fatalf("host read: %v (got %q)", err, trunc(got))
	}
	vsocktest.CheckEqual(tb, "host read", got, want)
}

// hostWrite writes b on the host end.
func hostWrite(tb testing.TB, h net.Conn, b []byte) {
	tb.Helper()
	_ = h.SetWriteDeadline(time.Now().Add(waitTimeout))
	defer h.SetWriteDeadline(time.Time{})
	if _, err := h.Write(b); err != nil {
		tb.Fatalf("host write: %v", err)
	}
}

// hostEOF checks that the host end reaches end of stream (the device shut
// down writing or closed its socket).
func hostEOF(tb testing.TB, h net.Conn) {
	tb.Helper()
	if err := vsocktest.WaitEOF(h, waitTimeout); err != nil {
		tb.Fatalf("host end: want EOF: %v", err)
	}
}

// hostClosed checks that the device closed its end: the host reads EOF and
// writing fails.
func hostClosed(tb testing.TB, h net.Conn) {
	tb.Helper()
	hostEOF(tb, h)
	deadline := time.Now().Add(waitTimeout)
	for {
		_ = h.SetWriteDeadline(time.Now().Add(waitTimeout))
		_, err := h.Write([]byte("x"))
		if err != nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("host end: writes still succeed; the device did not close its socket")
		}
		time.Sleep(time.Millisecond)
	}
}

func trunc(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}
