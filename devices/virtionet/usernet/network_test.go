package usernet_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/devices/virtionet/usernet"
	"github.com/microvm/microvm/devices/virtionet/usernet/netpolicy"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/miekg/dns"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.Out = io.Discard
	return l
}

func newNetwork(t *testing.T, publish ...virtionet.Publish) *usernet.Network {
	t.Helper()
	return newNetworkWith(t, usernet.Config{Publish: publish})
}

// newNetworkWith starts a network on cfg, with the test guest's MAC and a
// quiet log.
func newNetworkWith(t *testing.T, cfg usernet.Config) *usernet.Network {
	t.Helper()
	cfg.GuestMAC, cfg.Log = testMAC, quietLog()
	n, err := usernet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n
}

// TestGuestFetchesFromHost: with HostLoopback the guest reaches a server
// on the host's loopback through usernet.HostIP, and the bytes arrive
// intact (SHA-256).
func TestGuestFetchesFromHost(t *testing.T) {
	body := make([]byte, 4<<20)
	rand.Read(body)
	want := sha256.Sum256(body)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) })}
	go srv.Serve(l)
	defer srv.Close()
	port := uint16(l.Addr().(*net.TCPAddr).Port)

	g := newTestGuest(t, newNetworkWith(t, usernet.Config{HostLoopback: true}))
	c := g.dial(t, usernet.HostIP, port)
	fmt.Fprintf(c, "GET /file HTTP/1.0\r\nHost: %s\r\n\r\n", usernet.HostName)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	resp, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	_, got, ok := bytes.Cut(resp, []byte("\r\n\r\n"))
	if !ok || sha256.Sum256(got) != want {
		t.Fatalf("guest got %d bytes of body (ok %v); want the %d-byte file, same SHA-256", len(got), ok, len(body))
	}
}

// TestPublishTCP: a host connection to a published port reaches the
// guest's listener, both directions intact, also with egress none (a
// published port is inbound).
func TestPublishTCP(t *testing.T) {
	hp := testenv.FreePort(t, "tcp")
	n := newNetworkWith(t, usernet.Config{Egress: netpolicy.Egress{Restrict: true},
		Publish: []virtionet.Publish{{Proto: "tcp", HostIP: "127.0.0.1", HostPort: hp, GuestPort: 8080}}})
	g := newTestGuest(t, n)
	l := g.listen(t, 8080)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", hp), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := make([]byte, 1<<20)
	rand.Read(msg)
	go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo through the published port: %d bytes back, want the %d sent", len(got), len(msg))
	}
}

// TestUDPBothWays: with HostLoopback, a datagram from the guest to a host
// echo server and back, and one from the host through a published UDP
// port to a guest echo server and back.
func TestUDPBothWays(t *testing.T) {
	hostEcho, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostEcho.Close()
	go func() {
		b := make([]byte, 2048)
		for {
			k, a, err := hostEcho.ReadFrom(b)
			if err != nil {
				return
			}
			hostEcho.WriteTo(b[:k], a)
		}
	}()
	hp := testenv.FreePort(t, "udp")
	n := newNetworkWith(t, usernet.Config{HostLoopback: true,
		Publish: []virtionet.Publish{{Proto: "udp", HostIP: "127.0.0.1", HostPort: hp, GuestPort: 7000}}})
	g := newTestGuest(t, n)

	out := g.udp(t, 0, usernet.HostIP, uint16(hostEcho.LocalAddr().(*net.UDPAddr).Port))
	out.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := out.Write([]byte("guest to host")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2048)
	k, err := out.Read(b)
	if err != nil || string(b[:k]) != "guest to host" {
		t.Fatalf("guest's datagram back from the host: %q, %v", b[:k], err)
	}

	in := g.udp(t, 7000, "", 0)
	go func() {
		b := make([]byte, 2048)
		for {
			k, a, err := in.ReadFrom(b)
			if err != nil {
				return
			}
			in.WriteTo(b[:k], a)
		}
	}()
	c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", hp))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("host to guest"))
	k, err = c.Read(b)
	if err != nil || string(b[:k]) != "host to guest" {
		t.Fatalf("host's datagram back from the guest: %q, %v", b[:k], err)
	}
}

// TestDNS: the gateway answers the names of its own zone from its records,
// with no query leaving the machine, also with egress none, which refuses
// every other name, of every type, instead of asking the host's resolver
// (a lookup carries data out in its name). (With lookups allowed, other
// names go to the host's resolver; they are not asked here.)
func TestDNS(t *testing.T) {
	g := newTestGuest(t, newNetworkWith(t, usernet.Config{Egress: netpolicy.Egress{Restrict: true}}))
	c := g.udp(t, 0, usernet.GatewayIP, 53)
	askType := func(name string, qtype uint16) *dns.Msg {
		t.Helper()
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), qtype)
		b, err := q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		k, err := c.Read(buf)
		if err != nil {
			t.Fatalf("DNS %s: %v", name, err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:k]); err != nil {
			t.Fatal(err)
		}
		return r
	}
	ask := func(name string) *dns.Msg { t.Helper(); return askType(name, dns.TypeA) }
	aOf := func(r *dns.Msg) []string {
		var ips []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ips = append(ips, a.A.String())
			}
		}
		return ips
	}
	if got := aOf(ask(usernet.HostName)); len(got) != 1 || got[0] != usernet.HostIP {
		t.Errorf("%s: A %v, want [%s]", usernet.HostName, got, usernet.HostIP)
	}
	if got := aOf(ask("gateway.microvm.internal")); len(got) != 1 || got[0] != usernet.GatewayIP {
		t.Errorf("gateway.microvm.internal: A %v, want [%s]", got, usernet.GatewayIP)
	}
	// A name in the zone that has no record: NXDOMAIN from the zone, not
	// a query to the host's servers.
	if r := ask("nothing.microvm.internal"); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Errorf("nothing.microvm.internal: rcode %d, %d answers; want NXDOMAIN", r.Rcode, len(r.Answer))
	}
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT, dns.TypeMX} {
		if r := askType("secret-data.example.com", qt); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("a name outside the zone (type %s) under egress none: rcode %s, %d answers; want REFUSED",
				dns.TypeToString[qt], dns.RcodeToString[r.Rcode], len(r.Answer))
		}
	}
}

// TestDHCP: a DHCP DISCOVER from the guest's MAC is offered usernet.GuestIP with
// usernet.GatewayIP as router and DNS server and the link's usernet.MTU.
func TestDHCP(t *testing.T) {
	n := newNetwork(t)
	fd, err := n.TakeDeviceFD()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	disc, err := dhcpv4.NewDiscovery(testMAC)
	if err != nil {
		t.Fatal(err)
	}
	eth := &layers.Ethernet{SrcMAC: testMAC, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IPv4zero, DstIP: net.IPv4bcast}
	u := &layers.UDP{SrcPort: 68, DstPort: 67}
	u.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, u, gopacket.Payload(disc.ToBytes())); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	frame := make([]byte, 2048)
	for time.Now().Before(deadline) {
		tv := unix.NsecToTimeval(int64(time.Until(deadline)))
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		k, err := unix.Read(fd, frame)
		if err != nil {
			t.Fatalf("waiting for the DHCP offer: %v", err)
		}
		p := gopacket.NewPacket(frame[:k], layers.LayerTypeEthernet, gopacket.Default)
		ul, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if !ok || ul.SrcPort != 67 {
			continue // ARP and the like
		}
		offer, err := dhcpv4.FromBytes(ul.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if offer.MessageType() != dhcpv4.MessageTypeOffer || offer.TransactionID != disc.TransactionID {
			t.Fatalf("reply %v xid %v, want an OFFER for xid %v", offer.MessageType(), offer.TransactionID, disc.TransactionID)
		}
		if !offer.YourIPAddr.Equal(net.ParseIP(usernet.GuestIP)) {
			t.Errorf("offered %v, want %s", offer.YourIPAddr, usernet.GuestIP)
		}
		if r := offer.Router(); len(r) != 1 || !r[0].Equal(net.ParseIP(usernet.GatewayIP)) {
			t.Errorf("router %v, want %s", r, usernet.GatewayIP)
		}
		if d := offer.DNS(); len(d) != 1 || !d[0].Equal(net.ParseIP(usernet.GatewayIP)) {
			t.Errorf("DNS %v, want %s", d, usernet.GatewayIP)
		}
		if m, err := dhcpv4.GetUint16(dhcpv4.OptionInterfaceMTU, offer.Options); err != nil || m != usernet.MTU {
			t.Errorf("usernet.MTU option %d (%v), want %d", m, err, usernet.MTU)
		}
		return
	}
	t.Fatal("no DHCP offer within 10 s")
}

// TestPublishErrors: a port another process holds and a port given twice
// are refused with one line naming the flag, and nothing stays bound.
func TestPublishErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bp := uint16(busy.Addr().(*net.TCPAddr).Port)
	free := testenv.FreePort(t, "tcp")
	for _, tc := range []struct {
		name string
		ps   []virtionet.Publish
		want string
	}{
		{"in use", []virtionet.Publish{{Proto: "tcp", HostIP: "127.0.0.1", HostPort: free, GuestPort: 80}, {Proto: "tcp", HostIP: "127.0.0.1", HostPort: bp, GuestPort: 81}}, "already in use"},
		{"twice", []virtionet.Publish{{Proto: "tcp", HostIP: "127.0.0.1", HostPort: free, GuestPort: 80}, {Proto: "tcp", HostIP: "127.0.0.1", HostPort: free, GuestPort: 81}}, "published twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := usernet.New(usernet.Config{GuestMAC: testMAC, Publish: tc.ps, Log: quietLog()})
			if err == nil {
				n.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "--publish ") || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line starting --publish and saying %q", err, tc.want)
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", free))
			if err != nil {
				t.Fatalf("port %d still bound after the failed New: %v", free, err)
			}
			l.Close()
		})
	}
}

// TestCloseUnpublishes: after Close the host port is free again and the
// device's end can no longer be taken.
func TestCloseUnpublishes(t *testing.T) {
	hp := testenv.FreePort(t, "tcp")
	up := testenv.FreePort(t, "udp")
	n, err := usernet.New(usernet.Config{GuestMAC: testMAC, Log: quietLog(), Publish: []virtionet.Publish{
		{Proto: "tcp", HostIP: "127.0.0.1", HostPort: hp, GuestPort: 80}, {Proto: "udp", HostIP: "127.0.0.1", HostPort: up, GuestPort: 53}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", hp)); err == nil {
		t.Fatal("the published port was not bound")
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", hp))
	if err != nil {
		t.Fatalf("TCP port still bound after Close: %v", err)
	}
	l.Close()
	c, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", up))
	if err != nil {
		t.Fatalf("UDP port still bound after Close: %v", err)
	}
	c.Close()
	if _, err := n.TakeDeviceFD(); err == nil {
		t.Error("TakeDeviceFD after Close succeeded")
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
