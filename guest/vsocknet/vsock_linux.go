package vsocknet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// LocalCID asks /dev/vsock for the CID of the guest-to-host transport.
func LocalCID() (uint32, error) {
	f, err := os.Open("/dev/vsock")
	if err != nil {
		return 0, fmt.Errorf("vsock: %w", err)
	}
	defer f.Close()
	cid, err := unix.IoctlGetUint32(int(f.Fd()), unix.IOCTL_VM_SOCKETS_GET_LOCAL_CID)
	if err != nil {
		return 0, fmt.Errorf("vsock: get local CID: %w", err)
	}
	switch cid {
	case unix.VMADDR_CID_ANY:
		return 0, errors.New("vsock: no transport to the host (no virtio-vsock device)")
	case unix.VMADDR_CID_LOCAL:
		// Only vsock_loopback answered: there is no virtio-vsock device.
		return 0, errors.New("vsock: only the loopback transport (no virtio-vsock device)")
	}
	return cid, nil
}

func vsockSocket(typ int) (int, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	return fd, nil
}

func sockaddrToAddr(sa unix.Sockaddr) *Addr {
	if vm, ok := sa.(*unix.SockaddrVM); ok {
		return &Addr{CID: vm.CID, Port: vm.Port}
	}
	return &Addr{}
}

func localAddr(fd int) *Addr {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return &Addr{}
	}
	return sockaddrToAddr(sa)
}

// Listen listens on port of any local CID (VMADDR_CID_ANY); port may be
// VMADDR_PORT_ANY, and Addr then reports the port the kernel picked.
// Accepted connections are *Conn.
func Listen(port uint32) (*Listener, error) { return listen(unix.SOCK_STREAM, port) }

// ListenSeqpacket is Listen with a SOCK_SEQPACKET socket (the transport must
// support it: a virtio-vsock device that negotiated SEQPACKET). Accepted
// connections are *Conn, to be used with ReadMsg and WriteMsg.
func ListenSeqpacket(port uint32) (*Listener, error) { return listen(unix.SOCK_SEQPACKET, port) }

func listen(typ int, port uint32) (*Listener, error) {
	addr := &Addr{CID: unix.VMADDR_CID_ANY, Port: port}
	opErr := func(err error) error { return &net.OpError{Op: "listen", Net: "vsock", Addr: addr, Err: err} }
	fd, err := vsockSocket(typ)
	if err != nil {
		return nil, opErr(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, opErr(os.NewSyscallError("bind", err))
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		unix.Close(fd)
		return nil, opErr(os.NewSyscallError("listen", err))
	}
	l := &Listener{f: os.NewFile(uintptr(fd), "vsock-listener"), addr: localAddr(fd)}
	rc, err := l.f.SyscallConn()
	if err != nil {
		l.f.Close()
		return nil, opErr(err)
	}
	l.rc = rc
	return l, nil
}

// Listener is a listening AF_VSOCK socket; it implements net.Listener.
// Accept may be called from several goroutines; Close from any goroutine
// wakes them with net.ErrClosed.
type Listener struct {
	f      *os.File
	rc     syscall.RawConn
	addr   *Addr
	closed atomic.Bool // RawConn reports a closed file with an unexported error
}

// Accept waits for a connection; it returns a *Conn.
func (l *Listener) Accept() (net.Conn, error) {
	var (
		nfd int
		sa  unix.Sockaddr
		err error
	)
	rerr := l.rc.Read(func(fd uintptr) bool {
		for {
			nfd, sa, err = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			// Linux's vsock_accept fails a non-blocking accept with
			// EINTR rather than EAGAIN when no connection is queued
			// and a signal is pending (the Go runtime's preemption
			// signals make that common): not an error, look again.
			if err != unix.EINTR {
				return err != unix.EAGAIN
			}
		}
	})
	if rerr != nil {
		err = rerr
		if l.closed.Load() {
			err = net.ErrClosed
		}
	} else if err != nil {
		err = os.NewSyscallError("accept4", err)
	}
	if err != nil {
		return nil, wrapErr("accept", l.addr, nil, err)
	}
	return newVsockConn(nfd, localAddr(nfd), sockaddrToAddr(sa))
}

// Close stops listening.
func (l *Listener) Close() error {
	l.closed.Store(true)
	return wrapErr("close", l.addr, nil, l.f.Close())
}

// Addr returns the bound address.
func (l *Listener) Addr() net.Addr { return l.addr }

// SetDeadline bounds pending and future Accept calls.
func (l *Listener) SetDeadline(t time.Time) error { return l.f.SetReadDeadline(t) }

// Dial connects to (cid, port). A refusal by the peer (an RST in answer to
// the REQUEST) is ECONNRESET; Linux gives up on an unanswered REQUEST after
// its connect timeout (2 s by default) with ETIMEDOUT.
func Dial(ctx context.Context, cid, port uint32) (*Conn, error) {
	return dial(ctx, unix.SOCK_STREAM, cid, port)
}

// DialSeqpacket is Dial with a SOCK_SEQPACKET socket: each WriteMsg (or
// Write) sends one message, each ReadMsg (or Read) returns one. Linux
// refuses the socket (ESOCKTNOSUPPORT) when the transport cannot carry
// SEQPACKET.
func DialSeqpacket(ctx context.Context, cid, port uint32) (*Conn, error) {
	return dial(ctx, unix.SOCK_SEQPACKET, cid, port)
}

func dial(ctx context.Context, typ int, cid, port uint32) (*Conn, error) {
	raddr := &Addr{CID: cid, Port: port}
	fd, err := vsockSocket(typ)
	if err != nil {
		return nil, wrapErr("dial", nil, raddr, err)
	}
	err = unix.Connect(fd, &unix.SockaddrVM{CID: cid, Port: port})
	switch err {
	case nil:
		return newVsockConn(fd, localAddr(fd), raddr)
	case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
	default:
		unix.Close(fd)
		return nil, wrapErr("dial", nil, raddr, os.NewSyscallError("connect", err))
	}

	// Wait for the connection to complete, as the net package does: the socket
	// turns writable (or reports an error) when the handshake is over.
	f := os.NewFile(uintptr(fd), "vsock-dial")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, wrapErr("dial", nil, raddr, err)
	}
	if d, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	var connErr error
	werr := rc.Write(func(fd uintptr) bool {
		soErr, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			connErr = os.NewSyscallError("getsockopt", err)
			return true
		}
		switch e := syscall.Errno(soErr); e {
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			return false
		case 0:
			if _, err := unix.Getpeername(int(fd)); err == unix.ENOTCONN {
				return false // woken before the handshake ended
			}
			return true
		default:
			connErr = os.NewSyscallError("connect", e)
			return true
		}
	})
	stop()
	if werr != nil {
		if ctx.Err() != nil && errors.Is(werr, os.ErrDeadlineExceeded) {
			werr = ctx.Err()
		}
		connErr = werr
	}
	if connErr != nil {
		f.Close()
		return nil, wrapErr("dial", nil, raddr, connErr)
	}
	// The write deadline bounded the handshake; the caller sets its own.
	f.SetWriteDeadline(time.Time{})
	return &Conn{f: f, rc: rc, local: localAddr(fd), remote: raddr}, nil
}

// Conn is a connected AF_VSOCK socket, stream or SEQPACKET (then ReadMsg
// and WriteMsg keep message boundaries); it implements net.Conn.
// Read and Write may run concurrently in different goroutines; Close wakes
// both.
type Conn struct {
	f             *os.File
	rc            syscall.RawConn
	local, remote *Addr
}

func newVsockConn(fd int, local, remote *Addr) (*Conn, error) {
	f := os.NewFile(uintptr(fd), "vsock")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Conn{f: f, rc: rc, local: local, remote: remote}, nil
}

// wrapConn wraps any connected non-blocking stream socket; tests use it on a
// Unix socketpair to exercise the same code paths without a vsock transport.
func wrapConn(fd int) (*Conn, error) {
	return newVsockConn(fd, &Addr{}, &Addr{})
}

// Read reads from the connection; it returns io.EOF bare at end of stream.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.f.Read(b)
	return n, wrapErr("read", c.local, c.remote, err)
}

// Write writes to the connection.
func (c *Conn) Write(b []byte) (int, error) {
	n, err := c.f.Write(b)
	return n, wrapErr("write", c.local, c.remote, err)
}

// ReadMsg reads one message of a SEQPACKET connection into b. It reports
// whether the message ended a record (MSG_EOR) and whether it was longer
// than b (MSG_TRUNC: the rest is lost). At end of stream it returns 0,
// io.EOF.
func (c *Conn) ReadMsg(b []byte) (n int, eor, trunc bool, err error) {
	var flags int
	var rerr error
	err = c.rc.Read(func(fd uintptr) bool {
		for {
			n, _, flags, _, rerr = unix.Recvmsg(int(fd), b, nil, unix.MSG_DONTWAIT)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	if err == nil && rerr != nil {
		err = os.NewSyscallError("recvmsg", rerr)
	}
	if err != nil {
		return 0, false, false, wrapErr("read", c.local, c.remote, err)
	}
	if n == 0 && len(b) > 0 {
		return 0, false, false, io.EOF
	}
	return n, flags&unix.MSG_EOR != 0, flags&unix.MSG_TRUNC != 0, nil
}

// WriteMsg sends b as one message of a SEQPACKET connection, with MSG_EOR
// when eor. Linux (6.1) sends a message larger than the peer's free credit
// in part and then fails the non-blocking send with EAGAIN: WriteMsg waits
// and sends b again, so the peer gets the part twice. Send messages that
// fit the credit (at most the peer's buffer, after the peer has
// acknowledged the ones before).
func (c *Conn) WriteMsg(b []byte, eor bool) (int, error) {
	flags := unix.MSG_DONTWAIT
	if eor {
		flags |= unix.MSG_EOR
	}
	var n int
	var serr error
	err := c.rc.Write(func(fd uintptr) bool {
		for {
			n, serr = unix.SendmsgN(int(fd), b, nil, nil, flags)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if err == nil && serr != nil {
		err = os.NewSyscallError("sendmsg", serr)
	}
	return n, wrapErr("write", c.local, c.remote, err)
}

// Close closes the connection.
func (c *Conn) Close() error { return wrapErr("close", c.local, c.remote, c.f.Close()) }

// CloseWrite shuts down the sending side: the peer reads EOF.
func (c *Conn) CloseWrite() error { return c.shutdown(unix.SHUT_WR) }

// CloseRead shuts down the receiving side.
func (c *Conn) CloseRead() error { return c.shutdown(unix.SHUT_RD) }

func (c *Conn) shutdown(how int) error {
	var serr error
	if err := c.rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), how) }); err != nil {
		return wrapErr("shutdown", c.local, c.remote, net.ErrClosed) // Control fails only on a closed file
	}
	if serr != nil {
		return wrapErr("shutdown", c.local, c.remote, os.NewSyscallError("shutdown", serr))
	}
	return nil
}

// SetLinger sets SO_LINGER, as net.TCPConn.SetLinger does: sec < 0 (the
// default) lets Close return at once while the kernel sends what is
// queued; sec >= 0 makes Close wait up to sec seconds for the peer to end
// the connection. Over virtio-vsock the device answers the guest's
// SHUTDOWN only once the host socket has taken every byte the guest sent,
// so a lingering Close is how a guest that is about to power off knows its
// data left it (a reboot drops what is still queued).
func (c *Conn) SetLinger(sec int) error {
	l := unix.Linger{}
	if sec >= 0 {
		l.Onoff, l.Linger = 1, int32(sec)
	}
	var serr error
	if err := c.rc.Control(func(fd uintptr) { serr = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &l) }); err != nil {
		return wrapErr("setsockopt", c.local, c.remote, net.ErrClosed)
	}
	if serr != nil {
		return wrapErr("setsockopt", c.local, c.remote, os.NewSyscallError("setsockopt", serr))
	}
	return nil
}

// LocalAddr returns this side's *Addr.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's *Addr.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error { return c.f.SetDeadline(t) }

// SetReadDeadline sets the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.f.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// wrapErr turns an *os.File error into the *net.OpError the net package
// would return, keeping io.EOF bare (callers compare it with ==) and mapping
// a closed file to net.ErrClosed. errors.Is(err, syscall.ECONNRESET) and
// os.IsTimeout keep working through the wrapping.
func wrapErr(op string, local, remote *Addr, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	if errors.Is(err, os.ErrClosed) {
		err = net.ErrClosed
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	oe := &net.OpError{Op: op, Net: "vsock", Err: err}
	if local != nil {
		oe.Source = local
	}
	if remote != nil {
		oe.Addr = remote
	}
	return oe
}
