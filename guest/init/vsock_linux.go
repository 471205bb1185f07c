package main

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

// vsockNetwork reaches the host over AF_VSOCK sockets (virtio-vsock in a
// guest). Sockets are created non-blocking and wrapped in *os.File, which
// registers them with the Go runtime's poller: reads, writes, accept and
// connect park the goroutine instead of a thread, deadlines work, and Close
// from another goroutine wakes a blocked call.
type vsockNetwork struct{}

// LocalCID asks /dev/vsock for the CID of the guest-to-host transport.
func (vsockNetwork) LocalCID() (uint32, error) {
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

func vsockSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	return fd, nil
}

func sockaddrToAddr(sa unix.Sockaddr) *VsockAddr {
	if vm, ok := sa.(*unix.SockaddrVM); ok {
		return &VsockAddr{CID: vm.CID, Port: vm.Port}
	}
	return &VsockAddr{}
}

func localAddr(fd int) *VsockAddr {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return &VsockAddr{}
	}
	return sockaddrToAddr(sa)
}

// Listen listens on port of any local CID.
func (vsockNetwork) Listen(port uint32) (net.Listener, error) {
	addr := &VsockAddr{CID: unix.VMADDR_CID_ANY, Port: port}
	opErr := func(err error) error { return &net.OpError{Op: "listen", Net: "vsock", Addr: addr, Err: err} }
	fd, err := vsockSocket()
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
	l := &vsockListener{f: os.NewFile(uintptr(fd), "vsock-listener"), addr: localAddr(fd)}
	rc, err := l.f.SyscallConn()
	if err != nil {
		l.f.Close()
		return nil, opErr(err)
	}
	l.rc = rc
	return l, nil
}

// vsockListener is a listening AF_VSOCK socket. Accept may be called from
// several goroutines; Close from any goroutine wakes them with net.ErrClosed.
type vsockListener struct {
	f      *os.File
	rc     syscall.RawConn
	addr   *VsockAddr
	closed atomic.Bool // RawConn reports a closed file with an unexported error
}

// Accept waits for a connection; it returns a Conn.
func (l *vsockListener) Accept() (net.Conn, error) {
	var (
		nfd int
		sa  unix.Sockaddr
		err error
	)
	rerr := l.rc.Read(func(fd uintptr) bool {
		nfd, sa, err = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return err != unix.EAGAIN
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
func (l *vsockListener) Close() error {
	l.closed.Store(true)
	return wrapErr("close", l.addr, nil, l.f.Close())
}

// Addr returns the bound address.
func (l *vsockListener) Addr() net.Addr { return l.addr }

// SetDeadline bounds pending and future Accept calls.
func (l *vsockListener) SetDeadline(t time.Time) error { return l.f.SetReadDeadline(t) }

// Dial connects to (cid, port). A refusal by the peer (an RST in answer to
// the REQUEST) is ECONNRESET; Linux gives up on an unanswered REQUEST after
// its connect timeout (2 s by default) with ETIMEDOUT.
func (vsockNetwork) Dial(ctx context.Context, cid, port uint32) (Conn, error) {
	raddr := &VsockAddr{CID: cid, Port: port}
	fd, err := vsockSocket()
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
	return &vsockConn{f: f, rc: rc, local: localAddr(fd), remote: raddr}, nil
}

// vsockConn is a connected AF_VSOCK stream socket. Read and Write may run
// concurrently in different goroutines; Close wakes both.
type vsockConn struct {
	f             *os.File
	rc            syscall.RawConn
	local, remote *VsockAddr
}

func newVsockConn(fd int, local, remote *VsockAddr) (*vsockConn, error) {
	f := os.NewFile(uintptr(fd), "vsock")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &vsockConn{f: f, rc: rc, local: local, remote: remote}, nil
}

// wrapConn wraps any connected non-blocking stream socket; tests use it on a
// Unix socketpair to exercise the same code paths without a vsock transport.
func wrapConn(fd int) (*vsockConn, error) {
	return newVsockConn(fd, &VsockAddr{}, &VsockAddr{})
}

func (c *vsockConn) Read(b []byte) (int, error) {
	n, err := c.f.Read(b)
	return n, wrapErr("read", c.local, c.remote, err)
}

func (c *vsockConn) Write(b []byte) (int, error) {
	n, err := c.f.Write(b)
	return n, wrapErr("write", c.local, c.remote, err)
}

// Close closes the connection.
func (c *vsockConn) Close() error { return wrapErr("close", c.local, c.remote, c.f.Close()) }

// CloseWrite shuts down the sending side: the peer reads EOF.
func (c *vsockConn) CloseWrite() error { return c.shutdown(unix.SHUT_WR) }

// CloseRead shuts down the receiving side.
func (c *vsockConn) CloseRead() error { return c.shutdown(unix.SHUT_RD) }

func (c *vsockConn) shutdown(how int) error {
	var serr error
	if err := c.rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), how) }); err != nil {
		return wrapErr("shutdown", c.local, c.remote, net.ErrClosed) // Control fails only on a closed file
	}
	if serr != nil {
		return wrapErr("shutdown", c.local, c.remote, os.NewSyscallError("shutdown", serr))
	}
	return nil
}

func (c *vsockConn) LocalAddr() net.Addr                { return c.local }
func (c *vsockConn) RemoteAddr() net.Addr               { return c.remote }
func (c *vsockConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *vsockConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *vsockConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// wrapErr turns an *os.File error into the *net.OpError the net package
// would return, keeping io.EOF bare (callers compare it with ==) and mapping
// a closed file to net.ErrClosed. errors.Is(err, syscall.ECONNRESET) and
// os.IsTimeout keep working through the wrapping.
func wrapErr(op string, local, remote *VsockAddr, err error) error {
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
