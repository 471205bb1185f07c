package microvm

// The in-process vsock API: Machine.DialVsock (host-initiated connections
// without the Unix-socket round trip) and Machine.ListenVsock (guest-
// initiated connections accepted by the embedding program), with the
// routing vsock.Dialer behind ListenVsock.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/hybrid"
)

// VsockHostCID is the host's context id (virtio 1.2, 5.10.4): the CID of
// a ListenVsock listener's address.
const VsockHostCID = 2

// vsockAcceptBacklog bounds a ListenVsock listener's queue of connections
// the guest opened and Accept has not taken yet.
const vsockAcceptBacklog = 128

var (
	// ErrNoVsock is returned by DialVsock and ListenVsock on a machine
	// configured without a vsock device (Config.Vsock nil).
	ErrNoVsock = errors.New("the machine has no vsock device")
	// ErrVsockRefused means a DialVsock connection was not accepted: no
	// guest socket listens on the port, the guest refused it, the guest
	// did not answer within the device's connect timeout (when ctx has no
	// deadline), or the device is closed. It is hybrid.ErrRefused, so
	// errors.Is works with either name.
	ErrVsockRefused = hybrid.ErrRefused
	// ErrVsockTimeout means ctx's deadline passed before the guest
	// accepted a DialVsock connection; the error also wraps
	// context.DeadlineExceeded. It is hybrid.ErrTimeout.
	ErrVsockTimeout = hybrid.ErrTimeout
	// ErrStopped means the machine has stopped (or is stopping): its guest
	// will not run again, so DialVsock does not wait for it. A caller that
	// retries refused dials while the guest boots (WaitAgent,
	// agentapi.Connect) stops on this one; WaitAgent's error wraps it.
	ErrStopped = errors.New("the machine has stopped")
)

// There is no "reset" sentinel: when the guest resets an established
// connection the device closes its end of the socket pair, and the host
// side sees end of stream (or ECONNRESET when it had sent bytes the device
// had not read yet), exactly as with the Unix-socket protocol. A reset
// cannot be told apart from an orderly close reliably, so no error claims
// to.

// ResetVsockTransport is a host-side transport reset of the vsock device
// (vsock.Device.ResetTransport, virtio 1.2 5.10.6.7), for an embedder that
// restarts the services behind the device under a running guest: every
// vsock connection is dropped (host clients of the Unix socket, DialVsock
// and ListenVsock connections alike read end of stream) and the guest gets
// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET on the event queue, so its connected
// sockets fail with ECONNRESET at once. Listeners on either side stay, and
// new connections work as soon as it returns. Errors wrap ErrNoVsock, or
// vsock.ErrNotActive while the guest's driver is not using the device.
func (m *Machine) ResetVsockTransport() error {
	if m.vsock == nil {
		return fmt.Errorf("microvm: vsock transport reset: %w", ErrNoVsock)
	}
	if err := m.vsock.ResetTransport(); err != nil {
		return fmt.Errorf("microvm: vsock transport reset: %w", err)
	}
	return nil
}

// VsockAddr is a vsock address: a context id and a port. It implements
// net.Addr with Network "vsock" and String "cid:port".
type VsockAddr struct {
	CID  uint64
	Port uint32
}

// Network implements net.Addr.
func (a *VsockAddr) Network() string { return "vsock" }

// String implements net.Addr: "cid:port".
func (a *VsockAddr) String() string {
	return strconv.FormatUint(a.CID, 10) + ":" + strconv.FormatUint(uint64(a.Port), 10)
}

// DialVsock opens a connection to guest port port without going through
// the vsock device's Unix socket: one end of a socket pair goes straight to
// the device, which asks the guest (a vsock REQUEST), and DialVsock waits on
// the other end for the device's "OK <host port>\n" line
// (hybrid.AwaitOK). The returned net.Conn is a *hybrid.Conn
// (HostPort gives the host-side port the guest sees; CloseWrite passes a
// half-close to the guest); its addresses are the socket pair's.
//
// ctx bounds the whole attempt: waiting for the guest's driver, if the
// machine has not set it up yet, and for the guest's answer. Without a
// deadline the device gives up after its connect timeout
// (VsockConfig.ConnectTimeout) and the error wraps ErrVsockRefused. Errors
// wrap ErrNoVsock, ErrVsockRefused, ErrVsockTimeout (with
// context.DeadlineExceeded) or context.Canceled.
//
// DialVsock hands the socket to the device on a goroutine of its own
// (Device.ConnectFromHost waits for the guest driver), so that a cancelled
// ctx returns at once; that goroutine ends by the attempt's deadline at
// the latest, or when the machine is closed.
func (m *Machine) DialVsock(ctx context.Context, port uint32) (net.Conn, error) {
	if m.vsock == nil {
		return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, ErrNoVsock)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, vsockCtxError(err))
	}
	if m.vm.Stopped() {
		return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, ErrStopped)
	}
	devFD, host, err := vsockSocketpair()
	if err != nil {
		return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, err)
	}
	deadline, hasDeadline := ctx.Deadline()
	if !hasDeadline {
		deadline = time.Now().Add(m.vsockConnectTimeout())
	}
	// ConnectFromHost owns devFD from here on: it closes it on failure,
	// and the device closes it when the guest refuses or does not answer.
	connErr := make(chan error, 1)
	go func() { connErr <- m.vsock.ConnectFromHost(devFD, port, nil, deadline) }()
	c, err := hybrid.AwaitOK(ctx, host)
	if err == nil {
		return c, nil
	}
	if errors.Is(err, ErrVsockRefused) {
		// The device closed its end: on ConnectFromHost's own error
		// path, or later (guest refusal, connect timeout), which needs
		// the connection's lock ConnectFromHost holds until it returns.
		// Either way ConnectFromHost has returned or is about to, and
		// its error, if any, says why (driver not ready, device closed,
		// too many connections).
		if hasDeadline && !time.Now().Before(deadline) {
			// The device's timer and ctx's fire at the same instant;
			// the device's won by a hair.
			return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, vsockCtxError(context.DeadlineExceeded))
		}
		cerr := <-connErr
		if m.vm.Stopped() {
			// Refused because the machine stopped (its device closes
			// every connection), not by the guest.
			return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, ErrStopped)
		}
		if cerr != nil {
			return nil, fmt.Errorf("microvm: dial vsock port %d: %w: %w", port, ErrVsockRefused, cerr)
		}
	}
	return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, err)
}

// vsockCtxError is the error for a done context: ErrVsockTimeout wrapping
// context.DeadlineExceeded, or the context's error as it is.
func vsockCtxError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrVsockTimeout, err)
	}
	return err
}

// vsockConnectTimeout is the device's connect timeout.
func (m *Machine) vsockConnectTimeout() time.Duration {
	if vc := m.cfg.Vsock; vc != nil && vc.ConnectTimeout > 0 {
		return vc.ConnectTimeout
	}
	return vsock.DefaultConnectTimeout
}

// vsockSocketpair makes a connected stream socket pair: devFD, non-blocking
// and close-on-exec, for the vsock device, and the other end as a
// *net.UnixConn for the host side.
func vsockSocketpair() (devFD int, host *net.UnixConn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, nil, fmt.Errorf("vsock socket pair: %w", err)
	}
	f := os.NewFile(uintptr(fds[1]), "vsock-host")
	c, err := net.FileConn(f) // a duplicate of fds[1]
	f.Close()
	if err != nil {
		_ = unix.Close(fds[0])
		return -1, nil, fmt.Errorf("vsock socket pair: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok { // net.FileConn gives a *net.UnixConn for an AF_UNIX socket
		c.Close()
		_ = unix.Close(fds[0])
		return -1, nil, fmt.Errorf("vsock socket pair: got a %T", c)
	}
	return fds[0], uc, nil
}

// ListenVsock accepts, in-process, the connections the guest opens to host
// port port (to CID 2, VsockHostCID). Guest connections to ports without a
// listener still go to "<UDSPath>_<port>". Accept returns a *VsockConn.
// One listener per port: a second ListenVsock for a port with an open
// listener fails with an error wrapping syscall.EADDRINUSE; after the
// listener's Close the port may be listened on again. Machine.Close closes
// the listeners still open.
//
// A connection the guest opens is queued for Accept (up to 128 waiting);
// when the queue stays full for the device's connect timeout, or the
// listener is closed first, the guest's connection is reset. Closing the
// listener closes the connections queued and not accepted yet (the guest
// sees them closed); accepted connections stay open.
func (m *Machine) ListenVsock(port uint32) (net.Listener, error) {
	if m.vsockRouter == nil {
		return nil, fmt.Errorf("microvm: listen on vsock port %d: %w", port, ErrNoVsock)
	}
	return m.vsockRouter.listen(port)
}

// VsockConn is a guest-initiated connection accepted through ListenVsock:
// the host end of a Unix socket pair whose other end the vsock device
// holds, so the embedded UnixConn's methods (CloseWrite for a half-close,
// SetDeadline, ...) all work. Its local address is the host's (CID 2, the
// listened port), its remote address the guest's.
type VsockConn struct {
	*net.UnixConn
	local, remote *VsockAddr
}

// LocalAddr implements net.Conn: the host's CID and the listened port.
func (c *VsockConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr implements net.Conn: the guest's CID and the port it
// connected from.
func (c *VsockConn) RemoteAddr() net.Addr { return c.remote }

// vsockRouter is a Machine's vsock.Dialer: a guest connection to a host
// port with a ListenVsock listener is delivered in-process, any other goes
// to fallback (vsock.UDSDialer: "<uds>_<port>").
//
// Goroutines: Dial runs on the device's dial goroutines (one
// per guest connection attempt, see package vsock); listen, closeAll and
// the listeners' methods on the embedder's goroutines. mu guards ports and
// closed and is held only to read or change them: never while a dial
// waits for room in a queue, nor while a listener is closed. It is a leaf
// lock.
type vsockRouter struct {
	cid      uint64 // the guest's
	fallback vsock.Dialer

	mu     sync.Mutex
	ports  map[uint32]*vsockListener // guarded by mu
	closed bool                      // guarded by mu; set by closeAll
}

// newVsockRouter returns a router for a guest with context id cid.
func newVsockRouter(cid uint64, fallback vsock.Dialer) *vsockRouter {
	return &vsockRouter{cid: cid, fallback: fallback, ports: map[uint32]*vsockListener{}}
}

var _ vsock.Dialer = (*vsockRouter)(nil)

// Dial implements vsock.Dialer: it queues one end of a new socket
// pair on port's listener, waiting at most timeout for room, and returns
// the other end (non-blocking) to the device; without a listener it asks
// the fallback dialer.
func (r *vsockRouter) Dial(guestPort, port uint32, timeout time.Duration) (int, error) {
	r.mu.Lock()
	l := r.ports[port]
	r.mu.Unlock()
	if l == nil {
		if r.fallback == nil {
			return -1, fmt.Errorf("vsock port %d: %w", port, unix.ECONNREFUSED)
		}
		return r.fallback.Dial(guestPort, port, timeout)
	}
	devFD, host, err := vsockSocketpair()
	if err != nil {
		return -1, err
	}
	c := &VsockConn{UnixConn: host,
		local:  &VsockAddr{CID: VsockHostCID, Port: port},
		remote: &VsockAddr{CID: r.cid, Port: guestPort}}
	if err := l.deliver(c, timeout); err != nil {
		c.Close()
		_ = unix.Close(devFD)
		return -1, fmt.Errorf("vsock port %d: %w", port, err)
	}
	return devFD, nil
}

var _ vsock.SeqpacketDialer = (*vsockRouter)(nil)

// DialSeqpacket implements vsock.SeqpacketDialer: ListenVsock listeners take
// stream connections only, so a SEQPACKET connection to their port is
// refused (EPROTOTYPE, as a stream Unix listener answers); any other goes
// to the fallback dialer if it makes SEQPACKET sockets.
func (r *vsockRouter) DialSeqpacket(guestPort, port uint32, timeout time.Duration) (int, error) {
	r.mu.Lock()
	l := r.ports[port]
	r.mu.Unlock()
	sd, ok := r.fallback.(vsock.SeqpacketDialer)
	if l != nil || !ok {
		return -1, fmt.Errorf("vsock port %d: SEQPACKET: %w", port, unix.EPROTOTYPE)
	}
	return sd.DialSeqpacket(guestPort, port, timeout)
}

// listen registers a listener for port.
func (r *vsockRouter) listen(port uint32) (*vsockListener, error) {
	addr := &VsockAddr{CID: VsockHostCID, Port: port}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, &net.OpError{Op: "listen", Net: "vsock", Addr: addr, Err: net.ErrClosed}
	}
	if r.ports[port] != nil {
		return nil, &net.OpError{Op: "listen", Net: "vsock", Addr: addr, Err: unix.EADDRINUSE}
	}
	l := &vsockListener{r: r, addr: addr,
		queue: make(chan *VsockConn, vsockAcceptBacklog), done: make(chan struct{})}
	r.ports[port] = l
	return l, nil
}

// remove unregisters l (if it is still port's listener).
func (r *vsockRouter) remove(l *vsockListener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ports[l.addr.Port] == l {
		delete(r.ports, l.addr.Port)
	}
}

// closeAll closes every listener and refuses new ones (Machine.Close).
func (r *vsockRouter) closeAll() {
	r.mu.Lock()
	r.closed = true
	ls := make([]*vsockListener, 0, len(r.ports))
	for _, l := range r.ports {
		ls = append(ls, l)
	}
	r.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
}

// errAcceptQueueFull is why a guest connection to a listener whose queue
// stayed full was refused (the device logs it and resets the connection).
var errAcceptQueueFull = errors.New("accept queue full")

// vsockListener is ListenVsock's net.Listener.
//
// The queue holds delivered, unaccepted connections: dial goroutines send
// (deliver), Accept receives, Close drains. done is closed once, by Close.
// A delivery racing with Close may land after Close drained the queue;
// deliver then drains it itself, so nothing stays queued on a closed
// listener.
type vsockListener struct {
	r     *vsockRouter
	addr  *VsockAddr
	queue chan *VsockConn
	done  chan struct{}
	once  sync.Once
}

// Accept implements net.Listener: it waits for the guest's next connection
// to the port; after Close it returns an error wrapping net.ErrClosed.
func (l *vsockListener) Accept() (net.Conn, error) {
	select {
	case <-l.done: // closed wins over a queued connection
		return nil, l.closedError()
	default:
	}
	select {
	case c := <-l.queue:
		return c, nil
	case <-l.done:
		return nil, l.closedError()
	}
}

func (l *vsockListener) closedError() error {
	return &net.OpError{Op: "accept", Net: "vsock", Addr: l.addr, Err: net.ErrClosed}
}

// Close implements net.Listener: it unregisters the port, wakes Accept and
// closes the connections still queued. Later calls do nothing.
func (l *vsockListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.r.remove(l)
		l.drain()
	})
	return nil
}

// Addr implements net.Listener: the host's CID and the port.
func (l *vsockListener) Addr() net.Addr { return l.addr }

// drain closes the queued connections.
func (l *vsockListener) drain() {
	for {
		select {
		case c := <-l.queue:
			c.Close()
		default:
			return
		}
	}
}

// deliver queues c for Accept, waiting at most timeout for room.
func (l *vsockListener) deliver(c *VsockConn, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.done:
		return net.ErrClosed
	default:
	}
	select {
	case l.queue <- c:
		select {
		case <-l.done:
			// Close ran meanwhile and may have drained the queue
			// before c arrived.
			l.drain()
		default:
		}
		return nil
	case <-l.done:
		return net.ErrClosed
	case <-t.C:
		return errAcceptQueueFull
	}
}
