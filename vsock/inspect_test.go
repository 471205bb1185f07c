package vsock_test

import (
	"strings"
	"testing"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// TestConnections: an inspection shows each open connection with the
// counters that say why it waits: a guest stalled on a host that does not
// read has sent its whole window, the host took part of it, the rest waits
// in the device's buffer, and the credit the guest was last told is spent.
// Once the host reads, the inspection shows the connection drained.
func TestConnections(t *testing.T) {
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: 64 << 10}})
	if got := e.dev.Connections(); len(got) != 0 {
		t.Fatalf("before any connection: %v", got)
	}
	c, h := e.connectGuest(700, 1700)
	data := vsocktest.Pattern(3, 8<<20)
	sent := e.stallGuest(c, data)

	conns := e.dev.Connections()
	if len(conns) != 1 {
		t.Fatalf("want one connection, got %v", conns)
	}
	i := conns[0]
	if i.HostPort != 700 || i.GuestPort != 1700 || i.Seqpacket || i.State != "established" {
		t.Errorf("identity: %+v", i)
	}
	if i.FromGuest != uint32(sent) || i.ToHost == 0 || uint32(i.ToHost) != i.FromGuest-i.FwdCnt {
		t.Errorf("stalled: sent %d, inspection says from_guest=%d fwd_cnt=%d to_host=%d", sent, i.FromGuest, i.FwdCnt, i.ToHost)
	}
	if i.LastBufAlloc-(i.FromGuest-i.LastFwd) != 0 || i.LastBufAlloc != c.PeerBufAlloc || i.LastFwd != c.PeerFwdCnt {
		t.Errorf("the guest was told buf_alloc=%d fwd_cnt=%d and has no credit; the inspection says %+v", c.PeerBufAlloc, c.PeerFwdCnt, i)
	}
	if i.Events&0x4 == 0 { // EPOLLOUT: bytes wait for the host socket
		t.Errorf("bytes wait for the host, but its registration asks for %#x", i.Events)
	}
	if s := i.String(); !strings.Contains(s, "700<->1700 stream established") || !strings.Contains(s, "guest_free=0 ") {
		t.Errorf("String: %s", s)
	}

	hostRead(t, h, data[:sent])
	e.g.WaitFor("the buffer to drain", func() bool {
		conns := e.dev.Connections()
		return len(conns) == 1 && conns[0].ToHost == 0 && conns[0].FwdCnt == uint32(sent)
	})
}
