package microvm_test

// KVM integration test of the experimental vsock datagrams with the test
// guest's dgram mode (docs/testguest.md): guest->host datagrams reach
// "<uds>_<port>.dgram" with their address prefix, host datagrams sent to
// "<uds>.dgram" reach the guest, which echoes them back.

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/vsock"
)

func TestVsockDgram(t *testing.T) {
	const (
		port  = 7000
		count = 200
		size  = 256
	)
	g := newVsockGuestConfig(t, fmt.Sprintf("testguest.mode=dgram testguest.port=%d testguest.count=%d testguest.bytes=%d testguest.timeout=30", port, count, size),
		func(c *microvm.Config) { c.Vsock.Dgram = true })
	host, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: vsock.DgramHostPath(g.uds, port), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	got := make(chan []byte, 2*count)
	go func() {
		for {
			buf := make([]byte, 1<<16)
			n, err := host.Read(buf)
			if err != nil {
				close(got)
				return
			}
			got <- buf[:n]
		}
	}()
	g.start()

	// Phase 1: the guest sends count datagrams of the pattern. The host
	// socket's queue is short (net.unix.max_dgram_qlen), so some may be
	// dropped: each is either received intact or counted as dropped.
	pattern := func(i int) []byte {
		b := make([]byte, size)
		for k := range b {
			off := uint64(i*size + k)
			b[k] = byte(off*7 + off>>8)
		}
		return b
	}
	var received int
	deadline := time.After(30 * time.Second)
	for {
		s := g.m.VsockStats()
		if s.DgramTx+s.DgramTxDropped >= count && received == int(s.DgramTx) {
			break
		}
		select {
		case d := <-got:
			gp, hp := vsock.DecodeDgramPrefix(d)
			if gp != port || hp != port || len(d) != vsock.DgramPrefixSize+size {
				t.Fatalf("datagram %d: prefix %d/%d, %d bytes", received, gp, hp, len(d))
			}
			// Dropped ones leave gaps: find the index by content.
			ok := false
			for i := received; i < count && !ok; i++ {
				ok = bytes.Equal(d[vsock.DgramPrefixSize:], pattern(i))
			}
			if !ok {
				t.Fatalf("datagram %d does not carry the pattern of any index", received)
			}
			received++
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("guest datagrams: %d received, stats %+v; console:\n%s", received, g.m.VsockStats(), g.console)
		}
	}
	t.Logf("guest->host: %d of %d received, %d dropped on a full host queue", received, count, g.m.VsockStats().DgramTxDropped)
	if received == 0 {
		t.Fatal("no guest datagram arrived")
	}

	// Phase 2: ping-pong through the device's socket; the guest echoes
	// each datagram to the port it came from.
	dev, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: g.uds + ".dgram", Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	start := time.Now()
	for i := 0; i < count; i++ {
		msg := make([]byte, vsock.DgramPrefixSize, vsock.DgramPrefixSize+64)
		vsock.EncodeDgramPrefix(msg, port, port)
		msg = append(msg, fmt.Sprintf("ping %d", i)...)
		if _, err := dev.Write(msg); err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-got:
			if !bytes.Equal(d, msg) {
				t.Fatalf("echo %d: got %q, want %q", i, d, msg)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("echo %d did not come back; stats %+v; console:\n%s", i, g.m.VsockStats(), g.console)
		}
	}
	rtt := time.Since(start) / count
	g.wait(0, 30*time.Second)
	s := g.m.VsockStats()
	t.Logf("host->guest->host ping-pong: %v per round trip; stats %+v", rtt, s)
	if s.DgramRx != count || s.DgramRxDropped != 0 || s.GuestErrors != 0 {
		t.Errorf("stats %+v: want %d datagrams to the guest, none dropped, no guest error", s, count)
	}
}
