package agent

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestSetMAC: in a network namespace of its own, with a veth pair, SetMAC
// moves one end from its address to a new one and announces its IPv4
// address with a gratuitous ARP, which the other end receives; a repeated
// call finds the interface by its new address; unknown and invalid
// addresses are refused with their codes.
func TestSetMAC(t *testing.T) {
	ns := testenv.NewNetNS(t, "agentmac")
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("-n", ns, "link", "add", "guest0", "address", "52:54:00:00:00:01", "type", "veth", "peer", "name", "peer0")
	ip("-n", ns, "addr", "add", "10.79.0.2/24", "dev", "guest0")
	ip("-n", ns, "link", "set", "guest0", "up")
	ip("-n", ns, "link", "set", "peer0", "up")

	s := New(Options{})
	old, _ := net.ParseMAC("52:54:00:00:00:01")
	mac, _ := net.ParseMAC("5a:11:22:33:44:55")
	err := testenv.InNetNS("/var/run/netns/"+ns, func() error {
		peer, err := net.InterfaceByName("peer0")
		if err != nil {
			return err
		}
		proto := htons(unix.ETH_P_ARP)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(proto))
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: peer.Index}); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(int64(5 * time.Second))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}

		resp, err := s.SetMAC(context.Background(), &agentapi.SetMACRequest{Old: old, Mac: mac})
		if err != nil {
			return fmt.Errorf("SetMAC: %w", err)
		}
		if resp.Interface != "guest0" || resp.Announced != 1 {
			t.Errorf("SetMAC: %+v; want guest0, 1 announced", resp)
		}
		g, err := net.InterfaceByName("guest0")
		if err != nil {
			return err
		}
		if !bytes.Equal(g.HardwareAddr, mac) {
			t.Errorf("guest0's address %v; want %v", g.HardwareAddr, mac)
		}
		want := gratuitousARP(mac, net.IPv4(10, 79, 0, 2))
		buf := make([]byte, 128)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return fmt.Errorf("no gratuitous ARP on the peer: %w", err)
			}
			if bytes.Equal(buf[:n], want) || n > len(want) && bytes.Equal(buf[:len(want)], want) {
				break // (an IPv6-less veth sends nothing else; padding aside)
			}
		}

		// Again, as after a lost answer: found by its new address.
		if resp, err := s.SetMAC(context.Background(), &agentapi.SetMACRequest{Old: old, Mac: mac}); err != nil || resp.Interface != "guest0" {
			t.Errorf("repeated SetMAC: %+v, %v; want guest0", resp, err)
		}
		for _, tc := range []struct {
			old, mac []byte
			code     codes.Code
		}{
			{[]byte{2, 0, 0, 0, 0, 9}, []byte{2, 0, 0, 0, 0, 8}, codes.NotFound},
			{old[:5], mac, codes.InvalidArgument},
			{old, []byte{1, 0, 0x5e, 0, 0, 1}, codes.InvalidArgument},
		} {
			_, err := s.SetMAC(context.Background(), &agentapi.SetMACRequest{Old: tc.old, Mac: tc.mac})
			if status.Code(err) != tc.code {
				t.Errorf("SetMAC(%x, %x): %v; want %v", tc.old, tc.mac, err, tc.code)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
