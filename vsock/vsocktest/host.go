package vsocktest

import (
	"bytes"
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

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/vsock"
)

// Socketpair returns a connected stream socket pair: a non-blocking
// close-on-exec descriptor for the device and the host end as a net.Conn.
func Socketpair(tb testing.TB) (devFD int, host *net.UnixConn) {
	tb.Helper()
	return socketpair(tb, unix.SOCK_STREAM)
}

// SocketpairSeqpacket is Socketpair with SOCK_SEQPACKET sockets.
func SocketpairSeqpacket(tb testing.TB) (devFD int, host *net.UnixConn) {
	tb.Helper()
	return socketpair(tb, unix.SOCK_SEQPACKET)
}

func socketpair(tb testing.TB, typ int) (devFD int, host *net.UnixConn) {
	tb.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("vsocktest: socketpair: %v", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		tb.Fatal(err)
	}
	return fds[0], fileConn(tb, fds[1])
}

// fileConn turns fd into a net.UnixConn (taking ownership of fd).
func fileConn(tb testing.TB, fd int) *net.UnixConn {
	tb.Helper()
	f := os.NewFile(uintptr(fd), "vsocktest-host")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		tb.Fatalf("vsocktest: %v", err)
	}
	return c.(*net.UnixConn)
}

// DialAction is what a Dialer does with one dial.
type DialAction struct {
	// Refuse fails the dial (after Wait, if set).
	Refuse bool
	// Wait holds the dial until it is closed, or the device's timeout
	// passes (then the dial fails).
	Wait <-chan struct{}
	// Blocking hands the device a blocking descriptor.
	Blocking bool
	// Prep, when set, is called with the device's descriptor before the
	// device gets it (to inject host socket errors).
	Prep func(devFD int)
	// FD, when set, makes the descriptor the device gets instead of a
	// socketpair (no host end is delivered).
	FD func() (int, error)
}

// HostConn is the host end of a connection the Dialer made.
type HostConn struct {
	Port      uint32
	Seqpacket bool // a SOCK_SEQPACKET socket (DialSeqpacket)
	*net.UnixConn
}

// Dialer is a scriptable vsock.Dialer and vsock.SeqpacketDialer: each dial
// gets a socketpair (SOCK_SEQPACKET for DialSeqpacket) whose host end is
// delivered to Accept.
type Dialer struct {
	// Script decides each dial; nil accepts everything.
	Script func(port uint32) DialAction
	Dials  atomic.Int64

	tb    testing.TB
	conns chan *HostConn
	mu    sync.Mutex
	open  []*HostConn
}

// NewDialer returns a Dialer whose host ends are closed at the end of the
// test.
func NewDialer(tb testing.TB) *Dialer {
	d := &Dialer{tb: tb, conns: make(chan *HostConn, 4096)}
	tb.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, c := range d.open {
			c.Close()
		}
	})
	return d
}

// ErrRefused is what a refused dial returns.
var ErrRefused = errors.New("vsocktest: connection refused")

// Dial implements vsock.Dialer. It is called on the device's dial
// goroutines, so it reports trouble as errors, never through the TB.
func (d *Dialer) Dial(_, port uint32, timeout time.Duration) (int, error) {
	return d.dial(port, unix.SOCK_STREAM, timeout)
}

// DialSeqpacket implements vsock.SeqpacketDialer.
func (d *Dialer) DialSeqpacket(_, port uint32, timeout time.Duration) (int, error) {
	return d.dial(port, unix.SOCK_SEQPACKET, timeout)
}

func (d *Dialer) dial(port uint32, typ int, timeout time.Duration) (int, error) {
	d.Dials.Add(1)
	var act DialAction
	if d.Script != nil {
		act = d.Script(port)
	}
	if act.Wait != nil {
		t := time.NewTimer(timeout)
		select {
		case <-act.Wait:
			t.Stop()
		case <-t.C:
			return -1, fmt.Errorf("vsocktest: dial to %d timed out", port)
		}
	}
	if act.Refuse {
		return -1, ErrRefused
	}
	if act.FD != nil {
		return act.FD()
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if !act.Blocking {
		if err := unix.SetNonblock(fds[0], true); err != nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
			return -1, err
		}
	}
	f := os.NewFile(uintptr(fds[1]), "vsocktest-host")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[0])
		return -1, err
	}
	if act.Prep != nil {
		act.Prep(fds[0])
	}
	hc := &HostConn{Port: port, Seqpacket: typ == unix.SOCK_SEQPACKET, UnixConn: nc.(*net.UnixConn)}
	d.mu.Lock()
	d.open = append(d.open, hc)
	d.mu.Unlock()
	d.conns <- hc
	return fds[0], nil
}

// Accept returns the host end of the next connection dialled, waiting up to
// timeout.
func (d *Dialer) Accept(timeout time.Duration) *HostConn {
	d.tb.Helper()
	select {
	case c := <-d.conns:
		return c
	case <-time.After(timeout):
		d.tb.Fatalf("vsocktest: no dial within %v", timeout)
		return nil
	}
}

// HostConnect starts a host-initiated connection to guest port port over a
// fresh socketpair, as the UDS backend does after a CONNECT line with
// prefix bytes after it, and returns the host end. err is
// ConnectFromHost's result.
func HostConnect(tb testing.TB, dev *vsock.Device, port uint32, prefix []byte, deadline time.Time) (*net.UnixConn, error) {
	tb.Helper()
	fd, host := Socketpair(tb)
	tb.Cleanup(func() { host.Close() })
	return host, dev.ConnectFromHost(fd, port, prefix, deadline)
}

// HostConnectSeqpacket is HostConnect for a SEQPACKET connection
// (Device.ConnectSeqpacketFromHost) over a SOCK_SEQPACKET socketpair.
func HostConnectSeqpacket(tb testing.TB, dev *vsock.Device, port uint32, deadline time.Time) (*net.UnixConn, error) {
	tb.Helper()
	fd, host := SocketpairSeqpacket(tb)
	tb.Cleanup(func() { host.Close() })
	return host, dev.ConnectSeqpacketFromHost(fd, port, deadline)
}

// ReadRecord reads one record from a SOCK_SEQPACKET host end with a
// deadline; max bounds its size (a longer record is an error).
func ReadRecord(c *net.UnixConn, max int, timeout time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, max+1)
	n, _, flags, _, err := c.ReadMsgUnix(b, nil)
	if err != nil {
		return nil, err
	}
	if n > max || flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("vsocktest: record longer than %d bytes", max)
	}
	return b[:n], nil
}

// ReadOK reads the "OK <port>\n" line from a host end byte by byte (so that
// nothing after it is consumed) and returns the port.
func ReadOK(c net.Conn, timeout time.Duration) (uint32, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	var line []byte
	var b [1]byte
	for len(line) < 64 {
		if _, err := c.Read(b[:]); err != nil {
			return 0, fmt.Errorf("reading OK line (have %q): %w", line, err)
		}
		if b[0] == '\n' {
			s, ok := bytes.CutPrefix(line, []byte("OK "))
			if !ok {
				return 0, fmt.Errorf("line %q: want OK <port>", line)
			}
			v, err := strconv.ParseUint(string(s), 10, 32)
			if err != nil {
				return 0, fmt.Errorf("line %q: %v", line, err)
			}
			return uint32(v), nil
		}
		line = append(line, b[0])
	}
	return 0, fmt.Errorf("no newline in %q", line)
}

// ReadFull reads n bytes with a deadline.
func ReadFull(c net.Conn, n int, timeout time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return b, err
}

// WaitEOF reads until end of stream (discarding data) and fails unless it
// comes within timeout; reset-by-peer counts as closed.
func WaitEOF(c net.Conn, timeout time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	var b [4096]byte
	for {
		_, err := c.Read(b[:])
		if err == io.EOF || errors.Is(err, unix.ECONNRESET) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
