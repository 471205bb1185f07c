package usernet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"github.com/containers/gvisor-tap-vsock/pkg/virtualnetwork"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
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
	// Publish lists the host ports forwarded into the guest.
	Publish []virtionet.Publish
	// Log receives diagnostics (nil: logrus.StandardLogger()).
	Log logrus.FieldLogger
}

// Network is one VM's user-mode network (doc.go).
type Network struct {
	vn      *virtualnetwork.VirtualNetwork
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
	vn, err := virtualnetwork.New(&types.Configuration{
		MTU:               MTU,
		Subnet:            Subnet,
		GatewayIP:         GatewayIP,
		GatewayMacAddress: gatewayMAC,
		GatewayVirtualIPs: []string{HostIP},
		NAT:               map[string]string{HostIP: "127.0.0.1"},
		DHCPStaticLeases:  map[string]string{GuestIP: cfg.GuestMAC.String()},
		DNS: []types.Zone{{
			Name: zone,
			Records: []types.Record{
				{Name: strings.TrimSuffix(HostName, "."+strings.TrimSuffix(zone, ".")), IP: net.ParseIP(HostIP)},
				{Name: "gateway", IP: net.ParseIP(GatewayIP)},
			},
		}},
		Protocol: types.BessProtocol,
	})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("usernet: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n = &Network{vn: vn, log: cfg.Log, conn: conn, cancel: cancel, served: make(chan struct{}), devFD: -1}
	go func() {
		defer close(n.served)
		// Returns when conn is closed (Close) or the device's end is
		// (end of stream).
		_ = vn.AcceptBess(ctx, conn)
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

// expose and unexpose go through the stack's own service API, in process.
func (n *Network) expose(p virtionet.Publish) error {
	proto := types.TCP
	if p.Proto == "udp" {
		proto = types.UDP
	}
	req := types.ExposeRequest{Local: p.HostAddr(), Remote: fmt.Sprintf("%s:%d", GuestIP, p.GuestPort), Protocol: proto}
	if err := n.service("/services/forwarder/expose", req); err != nil {
		return fmt.Errorf("--publish %s: %w", p, err)
	}
	return nil
}

func (n *Network) unexpose(p virtionet.Publish) error {
	proto := types.TCP
	if p.Proto == "udp" {
		proto = types.UDP
	}
	return n.service("/services/forwarder/unexpose", types.UnexposeRequest{Local: p.HostAddr(), Protocol: proto})
}

func (n *Network) service(path string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	r, err := http.NewRequest(http.MethodPost, path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	r.RemoteAddr = "127.0.0.1:0"
	var w response
	n.vn.ServicesMux().ServeHTTP(&w, r)
	if w.code != 0 && w.code != http.StatusOK {
		return errors.New(strings.TrimSpace(w.body.String()))
	}
	return nil
}

// response is the http.ResponseWriter of an in-process service call.
type response struct {
	code int
	body bytes.Buffer
	hdr  http.Header
}

func (w *response) Header() http.Header {
	if w.hdr == nil {
		w.hdr = http.Header{}
	}
	return w.hdr
}
func (w *response) Write(b []byte) (int, error) { return w.body.Write(b) }
func (w *response) WriteHeader(code int)        { w.code = code }

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
}

// Stats returns the byte counts.
func (n *Network) Stats() Stats {
	return Stats{ToGuest: n.vn.BytesSent(), FromGuest: n.vn.BytesReceived()}
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
