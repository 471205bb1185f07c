package usernet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"github.com/containers/gvisor-tap-vsock/pkg/services/forwarder"
	"github.com/containers/gvisor-tap-vsock/pkg/tap"
	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/devices/virtionet/usernet/netpolicy"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// The network's addresses (doc.go).
const (
	Subnet    = "192.168.127.0/24"
	GatewayIP = "192.168.127.1"
	GuestIP   = "192.168.127.2"
	HostIP    = "192.168.127.254"
	// HostName resolves to HostIP in the guest.
	HostName = "host.microvm.internal"
	// MTU is the link's MTU, as DHCP tells the guest.
	MTU = 1500

	gatewayMAC = "5a:94:ef:e4:0c:dd"
	zone       = "microvm.internal."
)

// Config configures a Network.
type Config struct {
	// GuestMAC is the MAC of the guest's virtio-net device: DHCP leases
	// GuestIP to it.
	GuestMAC net.HardwareAddr
	// Publish lists the host ports forwarded into the guest. They are
	// inbound: Egress does not limit them.
	Publish []virtionet.Publish
	// HostLoopback lets the guest reach the host's loopback (every port
	// of its 127.0.0.1) at HostIP, and the host's own addresses on its
	// other interfaces. Without it the guest reaches neither: a service
	// on the host that trusts local connections must not trust the guest.
	HostLoopback bool
	// Egress limits where else the guest's TCP connections and UDP flows
	// go (netpolicy.ParseEgress; the zero value: everywhere outside the
	// blocked ranges, netpolicy.Policy). DNS to GatewayIP is answered by
	// the network itself for its own zone; other names are looked up
	// only when Egress.LooksUpNames.
	Egress netpolicy.Egress
	// Log receives diagnostics (nil: logrus.StandardLogger()).
	Log logrus.FieldLogger
}

// Network is one VM's user-mode network (doc.go).
type Network struct {
	stack   *stack.Stack
	sw      *tap.Switch
	ports   *forwarder.PortsForwarder
	policy  netpolicy.Policy
	refused atomic.Uint64 // connections and flows the policy refused
	warned  atomic.Bool   // the first refusal was logged as a warning
	log     logrus.FieldLogger
	conn    net.Conn // the switch's end of the socketpair
	cancel  context.CancelFunc
	served  chan struct{} // closed when the switch stops reading conn
	exposed []virtionet.Publish

	mu     sync.Mutex // guards devFD and closed
	devFD  int        // the device's end, -1 once taken
	closed bool
}

// New starts a network for one guest NIC and binds the published ports;
// the device's end of its socketpair is TakeDeviceFD's. Every port is
// checked before anything is bound, and a failure leaves nothing
// listening.
func New(cfg Config) (*Network, error) {
	// SEQPACKET, not DGRAM: Linux queues at most net.unix.max_dgram_qlen
	// (10) datagrams, too few frames in flight for TCP's window.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("usernet: socketpair: %w", err)
	}
	n, err := NewOnSocket(cfg, fds[1])
	if err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	n.devFD = fds[0]
	return n, nil
}

// NewOnSocket is New on a connected AF_UNIX SOCK_SEQPACKET socket whose
// other end the device holds, in this process or another (microvm-net):
// one Ethernet frame per record. The network owns fd from the call on,
// also when it fails; it has no device end to take.
func NewOnSocket(cfg Config, fd int) (n *Network, err error) {
	f := os.NewFile(uintptr(fd), "usernet-switch")
	conn, err := net.FileConn(f) // dups fd
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("usernet: %w", err)
	}
	if len(cfg.GuestMAC) != 6 {
		conn.Close()
		return nil, fmt.Errorf("usernet: guest MAC %v: want 6 bytes", cfg.GuestMAC)
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if err := checkPublish(cfg.Publish); err != nil {
		conn.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n = &Network{log: cfg.Log, conn: conn, cancel: cancel, served: make(chan struct{}), devFD: -1,
		policy: netpolicy.Policy{
			Subnet:       netip.MustParsePrefix(Subnet),
			HostGateway:  netip.MustParseAddr(HostIP),
			HostAddrs:    hostAddrs(),
			HostLoopback: cfg.HostLoopback,
			Egress:       cfg.Egress,
		}}
	if err := n.newStack(cfg.GuestMAC); err != nil {
		cancel()
		conn.Close()
		return nil, fmt.Errorf("usernet: %w", err)
	}
	go func() {
		defer close(n.served)
		// Returns when conn is closed (Close) or the device's end is
		// (end of stream).
		_ = n.sw.Accept(ctx, conn, types.BessProtocol)
	}()
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	for _, p := range cfg.Publish {
		if err := n.expose(p); err != nil {
			return nil, err
		}
		n.exposed = append(n.exposed, p)
	}
	return n, nil
}

// Done is closed when the switch stops reading the device's socket: its
// other end was closed (the device, or the process holding it, went away)
// or Close was called.
func (n *Network) Done() <-chan struct{} { return n.served }

// checkPublish refuses duplicate host ports and ports another process
// holds, with one line that names the flag, before the stack binds any.
func checkPublish(ps []virtionet.Publish) error {
	seen := map[string]bool{}
	for _, p := range ps {
		k := p.Proto + "/" + p.HostAddr()
		if seen[k] {
			return fmt.Errorf("--publish %s: host port published twice", p)
		}
		seen[k] = true
		var c io.Closer
		var err error
		if p.Proto == "udp" {
			c, err = net.ListenPacket("udp", p.HostAddr())
		} else {
			c, err = net.Listen("tcp", p.HostAddr())
		}
		if err != nil {
			if errors.Is(err, unix.EADDRINUSE) {
				return fmt.Errorf("--publish %s: host port %d is already in use", p, p.HostPort)
			}
			return fmt.Errorf("--publish %s: %w", p, err)
		}
		c.Close()
	}
	return nil
}

func (n *Network) expose(p virtionet.Publish) error {
	proto := types.TCP
	if p.Proto == "udp" {
		proto = types.UDP
	}
	if err := n.ports.Expose(proto, p.HostAddr(), fmt.Sprintf("%s:%d", GuestIP, p.GuestPort)); err != nil {
		return fmt.Errorf("--publish %s: %w", p, err)
	}
	return nil
}

func (n *Network) unexpose(p virtionet.Publish) error {
	proto := types.TCP
	if p.Proto == "udp" {
		proto = types.UDP
	}
	return n.ports.Unexpose(proto, p.HostAddr())
}

// hostAddrs are the host's addresses on its interfaces, loopback aside,
// as they are when the network starts: netpolicy.Policy.HostAddrs. An
// address the host gains later is not among them.
func hostAddrs() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range as {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip, ok := netip.AddrFromSlice(ipn.IP); ok && !ip.Unmap().IsLoopback() {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// TakeDeviceFD hands over the device's end of the socketpair, for
// virtionet.NewSocket, which then owns it. It can be taken once.
func (n *Network) TakeDeviceFD() (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.devFD < 0 {
		return -1, errors.New("usernet: the device's end was taken or the network closed")
	}
	fd := n.devFD
	n.devFD = -1
	return fd, nil
}

// Stats are the switch's byte counts.
type Stats struct {
	// ToGuest and FromGuest count frame bytes the switch sent to and
	// received from the device.
	ToGuest, FromGuest uint64
	// Refused counts the guest's TCP connections (answered with an RST)
	// and UDP datagrams opening a flow (dropped) that the policy
	// (Config.HostLoopback, Config.Egress) refused.
	Refused uint64
}

// Stats returns the byte counts.
func (n *Network) Stats() Stats {
	return Stats{ToGuest: atomic.LoadUint64(&n.sw.Sent), FromGuest: atomic.LoadUint64(&n.sw.Received), Refused: n.refused.Load()}
}

// Close unbinds the published ports, disconnects the device (whose own
// end, if taken, its owner closes) and waits for the switch's reader.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	if n.devFD >= 0 {
		unix.Close(n.devFD)
		n.devFD = -1
	}
	n.mu.Unlock()
	var errs []error
	for _, p := range n.exposed {
		if err := n.unexpose(p); err != nil {
			errs = append(errs, fmt.Errorf("usernet: unpublish %s: %w", p, err))
		}
	}
	n.cancel()
	// The switch closes conn itself when the device's end closes first
	// (end of stream on a SEQPACKET socket).
	if err := n.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, err)
	}
	<-n.served
	return errors.Join(errs...)
}
