package virtionet

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

const envTAPNetNS = "VIRTIONET_TEST_IN_NETNS"

// TestTAP runs the device on a real TAP in a network namespace of its own
// (root only: it skips elsewhere): a UDP datagram the guest sends reaches a
// host socket, and one the host sends reaches the guest's RX buffer.
func TestTAP(t *testing.T) {
	if os.Getenv(envTAPNetNS) != "1" {
		if os.Geteuid() != 0 {
			t.Skip("needs root for a network namespace and a TAP")
		}
		if _, err := os.Stat("/dev/net/tun"); err != nil {
			t.Skipf("no TUN/TAP: %v", err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestTAP$", "-test.v")
		cmd.Env = append(os.Environ(), envTAPNetNS+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestTAP") {
			t.Fatalf("in a network namespace: %v\n%s", err, out)
		}
		return
	}
	tap, err := OpenTAP("vntest0")
	if err != nil {
		t.Fatal(err)
	}
	ipCmd(t, "addr", "add", "10.98.0.1/24", "dev", "vntest0")
	ipCmd(t, "link", "set", "vntest0", "up")
	guestMAC := net.HardwareAddr{2, 0, 0, 0x98, 0, 2}
	ipCmd(t, "neigh", "add", "10.98.0.2", "lladdr", guestMAC.String(), "dev", "vntest0")
	ifc, err := net.InterfaceByName("vntest0") // netlink: /sys shows the outer namespace
	if err != nil {
		t.Fatal(err)
	}
	tapMAC := ifc.HardwareAddr

	dev, err := newDevice(Config{MAC: guestMAC, Log: quietLog()}, tap)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{tb: t, dev: dev, irq: make(chan struct{}, 1), features: Offered | 1<<32}
	t.Cleanup(func() { dev.Close() })
	e.activate(256)

	// Guest to host.
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 98, 0, 1), Port: 5000})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	payload := []byte("hello from the guest")
	f := udpFrame(tapMAC, guestMAC, net.IPv4(10, 98, 0, 2), net.IPv4(10, 98, 0, 1), 4000, 5000, payload)
	e.sendTX(hdrBytes(Header{}), f)
	e.reap(e.tx, 1)
	_ = l.SetReadDeadline(time.Now().Add(waitTimeout))
	got := make([]byte, 100)
	n, from, err := l.ReadFromUDP(got)
	if err != nil || !bytes.Equal(got[:n], payload) || from.Port != 4000 {
		t.Fatalf("host socket got %q from %v, %v", got[:n], from, err)
	}

	// Host to guest.
	bufs := e.postRX(8, 2048)
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 98, 0, 2), Port: 4001})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello from the host")); err != nil {
		t.Fatal(err)
	}
	// The kernel also sends its own frames on a new link (IPv6 router
	// solicitations, MLD reports): skip to the IPv4 one.
	var h Header
	var fr []byte
	for i := 0; ; i++ {
		u := e.reap(e.rx, 1)[0]
		rx := e.read(bufs[u.ID], u.Len)
		h.Decode(rx)
		fr = rx[HeaderSize:]
		if binary.BigEndian.Uint16(fr[12:]) == 0x0800 {
			break
		}
		if i == 20 {
			t.Fatalf("no IPv4 frame among the first %d", i)
		}
		e.rx.Add(virtiotestBuf(bufs[u.ID].addr[0], bufs[u.ID].size[0], true))
		_ = e.rxKick.Signal()
	}
	if !bytes.Equal(fr[0:6], guestMAC) || !bytes.HasSuffix(fr, []byte("hello from the host")) {
		t.Fatalf("guest received %x", fr)
	}
	if h.NumBuffers != 1 {
		t.Errorf("num_buffers %d", h.NumBuffers)
	}
	t.Logf("RX header from the TAP: %+v; stats %+v", h, dev.Stats())
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	bin, a := "ip", args
	if _, err := exec.LookPath("ip"); err != nil {
		bin, a = "/bin/busybox", append([]string{"ip"}, args...)
	}
	if out, err := exec.Command(bin, a...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
}

// udpFrame builds an Ethernet/IPv4/UDP frame (UDP checksum 0: none).
func udpFrame(dst, src net.HardwareAddr, sip, dip net.IP, sport, dport uint16, payload []byte) []byte {
	f := make([]byte, 14+20+8+len(payload))
	copy(f[0:], dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, 17
	copy(ip[12:], sip.To4())
	copy(ip[16:], dip.To4())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(f[42:], payload)
	return f
}
