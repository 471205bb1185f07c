package podnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// netnsEnv is three network namespaces the test makes (root only), as a
// node running a pod looks: "node" with the bridge side of a veth at
// 10.77.0.1, "pod" with the other side, eth0, at 10.77.0.2/24 and a
// default route by 10.77.0.1, as CNI's bridge plugin leaves it; and
// "guest", which stands in for the VM: a TAP with eth0's MAC and address.
type netnsEnv struct {
	t                *testing.T
	node, pod, guest string // names under /var/run/netns
}

func newNetnsEnv(t *testing.T) *netnsEnv {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no TUN/TAP: %v", err)
	}
	id := os.Getpid()
	e := &netnsEnv{t: t, node: fmt.Sprintf("pnnode%d", id), pod: fmt.Sprintf("pnpod%d", id), guest: fmt.Sprintf("pnguest%d", id)}
	for _, n := range []string{e.node, e.pod, e.guest} {
		e.ip("netns", "add", n)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n).Run() })
	}
	e.ip("-n", e.pod, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0", "netns", e.node)
	e.ip("-n", e.node, "addr", "add", "10.77.0.1/24", "dev", "peer0")
	e.ip("-n", e.node, "link", "set", "peer0", "up")
	e.ip("-n", e.pod, "link", "set", "eth0", "mtu", "1400")
	e.ip("-n", e.pod, "addr", "add", "10.77.0.2/24", "dev", "eth0")
	e.ip("-n", e.pod, "link", "set", "eth0", "up")
	e.ip("-n", e.pod, "route", "add", "default", "via", "10.77.0.1")
	return e
}

func (e *netnsEnv) ip(args ...string) {
	e.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		e.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (e *netnsEnv) path(name string) string { return "/var/run/netns/" + name }

// in runs fn in the namespace name (testenv.InNetNS).
func (e *netnsEnv) in(name string, fn func() error) error {
	return testenv.InNetNS(e.path(name), fn)
}

func TestInspect(t *testing.T) {
	e := newNetnsEnv(t)
	ifc, err := Inspect(e.path(e.pod))
	if err != nil {
		t.Fatal(err)
	}
	var mac string
	if err := e.in(e.pod, func() error {
		i, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = i.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if ifc.Name != "eth0" || ifc.MAC.String() != mac || ifc.Addr.String() != "10.77.0.2/24" ||
		!ifc.Gateway.Equal(net.IPv4(10, 77, 0, 1)) || ifc.MTU != 1400 {
		t.Errorf("Inspect = %v, want eth0 10.77.0.2/24 %s mtu 1400 via 10.77.0.1", ifc, mac)
	}
	if got, want := ifc.KernelArg("eth0"), "ip=10.77.0.2::10.77.0.1:255.255.255.0::eth0:off"; got != want {
		t.Errorf("KernelArg = %q, want %q", got, want)
	}

	// The guest namespace has only loopback: nothing to put a VM on.
	if _, err := Inspect(e.path(e.guest)); !errors.Is(err, ErrNoInterface) {
		t.Errorf("Inspect of a namespace without an address: %v, want ErrNoInterface", err)
	}
	if _, err := Inspect(e.path(e.guest) + "-none"); err == nil || !strings.Contains(err.Error(), e.guest+"-none") {
		t.Errorf("Inspect of a namespace that does not exist: %v, want an error naming it", err)
	}
}

// TestRedirect joins a TAP in the pod's namespace to its eth0 and carries
// the TAP's frames to and from a second TAP in the guest namespace, as the
// VM's virtio-net device would: the node and the guest then talk UDP
// (ARP included) as if the guest were the pod on the veth.
func TestRedirect(t *testing.T) {
	e := newNetnsEnv(t)
	ifc, err := Inspect(e.path(e.pod))
	if err != nil {
		t.Fatal(err)
	}
	podTAP, err := virtionet.OpenTAPIn("tap0", e.path(e.pod))
	if err != nil {
		t.Fatal(err)
	}
	defer podTAP.Close()
	guestTAP, err := virtionet.OpenTAPIn("eth0", e.path(e.guest))
	if err != nil {
		t.Fatal(err)
	}
	defer guestTAP.Close()
	e.ip("-n", e.guest, "link", "set", "eth0", "address", ifc.MAC.String(), "mtu", "1400")
	e.ip("-n", e.guest, "addr", "add", ifc.Addr.String(), "dev", "eth0")
	e.ip("-n", e.guest, "link", "set", "eth0", "up")

	if err := Redirect(e.path(e.pod), ifc, "tap0"); err != nil {
		t.Fatal(err)
	}
	// Twice is fine: a retried sandbox set-up must not fail on its own filters.
	if err := Redirect(e.path(e.pod), ifc, "tap0"); err != nil {
		t.Fatalf("Redirect again: %v", err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go pump(t, podTAP.FD(), guestTAP.FD(), stop)
	go pump(t, guestTAP.FD(), podTAP.FD(), stop)

	var guestConn, nodeConn net.PacketConn
	if err := e.in(e.guest, func() (err error) {
		guestConn, err = net.ListenPacket("udp4", "10.77.0.2:7000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer guestConn.Close()
	if err := e.in(e.node, func() (err error) {
		nodeConn, err = net.ListenPacket("udp4", "10.77.0.1:7001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer nodeConn.Close()

	// Node to guest, then the guest answers to where it came from.
	if _, err := nodeConn.WriteTo([]byte("to the pod"), &net.UDPAddr{IP: net.IPv4(10, 77, 0, 2), Port: 7000}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	guestConn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, from, err := guestConn.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "to the pod" {
		t.Fatalf("the guest read %q, %v; want the node's datagram", buf[:n], err)
	}
	if _, err := guestConn.WriteTo([]byte("from the pod"), from); err != nil {
		t.Fatal(err)
	}
	nodeConn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, _, err = nodeConn.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "from the pod" {
		t.Fatalf("the node read %q, %v; want the guest's answer", buf[:n], err)
	}
}

// pump copies frames (with their virtio-net headers: both TAPs have them)
// from one non-blocking TAP to the other until stop closes.
func pump(t *testing.T, from, to int, stop chan struct{}) {
	buf := make([]byte, 65536)
	fds := []unix.PollFd{{Fd: int32(from), Events: unix.POLLIN}}
	for {
		select {
		case <-stop:
			return
		default:
		}
		if _, err := unix.Poll(fds, 100); err != nil && err != unix.EINTR {
			t.Errorf("poll: %v", err)
			return
		}
		n, err := unix.Read(from, buf)
		if err == unix.EAGAIN || err == unix.EBADF && isClosed(stop) {
			continue
		}
		if err != nil {
			if !isClosed(stop) {
				t.Errorf("read a frame: %v", err)
			}
			return
		}
		if _, err := unix.Write(to, buf[:n]); err != nil && err != unix.EAGAIN && !errors.Is(err, io.ErrShortWrite) {
			if !isClosed(stop) {
				t.Errorf("write a frame: %v", err)
			}
			return
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
