package vsock

import (
	"fmt"
	"slices"
)

// What each connection looks like from outside, for an operator asking why
// one stalled (microvm run logs it on SIGUSR1): its state, both directions'
// credit counters as the device holds them and as it last told the guest,
// the bytes it buffers, and what its epoll registration asks for. Taken
// under each connection's lock in turn (never two at once), so it is
// consistent per connection, not across them.

// ConnInfo is one connection's state (Device.Connections).
type ConnInfo struct {
	HostPort, GuestPort uint32
	Seqpacket           bool
	State               string
	// Guest to host: BufAlloc and GrantFwd are what the device may
	// advertise, LastBufAlloc and LastFwd what it last told the guest,
	// FwdCnt what the host socket took, FromGuest what the guest sent,
	// Window the window it grows towards, ToHost the bytes waiting for the
	// host socket.
	BufAlloc, GrantFwd, LastBufAlloc, LastFwd, FwdCnt, FromGuest, Window uint32
	ToHost                                                               int
	// Host to guest: the guest's buf_alloc and fwd_cnt as its last packet
	// told them, and the payload bytes sent to it.
	PeerBufAlloc, PeerFwdCnt, ToGuest uint32
	// Pending is the control packets owed to the guest (connsm.go's pend
	// bits); Ready says the connection waits on the RX worker's list;
	// Starved that it waits for device-wide budget.
	Pending      uint32
	Ready        bool
	Starved      bool
	HostReadable bool
	// Events is what its host socket's epoll registration asks for.
	Events uint32
}

// String is one log line.
func (c ConnInfo) String() string {
	typ := "stream"
	if c.Seqpacket {
		typ = "seqpacket"
	}
	return fmt.Sprintf("%d<->%d %s %s from_guest=%d fwd_cnt=%d grant_fwd=%d last_fwd=%d buf_alloc=%d last_buf_alloc=%d window=%d to_host=%d guest_free=%d peer_buf_alloc=%d peer_fwd_cnt=%d to_guest=%d pending=%#x ready=%v starved=%v host_readable=%v events=%#x",
		c.HostPort, c.GuestPort, typ, c.State, c.FromGuest, c.FwdCnt, c.GrantFwd, c.LastFwd, c.BufAlloc, c.LastBufAlloc, c.Window,
		c.ToHost, int64(c.LastBufAlloc)-int64(c.FromGuest-c.LastFwd), c.PeerBufAlloc, c.PeerFwdCnt, c.ToGuest, c.Pending, c.Ready, c.Starved, c.HostReadable, c.Events)
}

// Connections returns the state of every connection of the running session,
// ordered by host port and guest port (none while the driver has not
// started the device). Safe from any goroutine.
func (d *Device) Connections() []ConnInfo {
	s, ok := d.life.Current()
	if !ok {
		return nil
	}
	s.connMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connMu.Unlock()
	out := make([]ConnInfo, 0, len(conns))
	for _, c := range conns {
		c.mu.Lock()
		i := ConnInfo{
			HostPort: c.key.hostPort, GuestPort: c.key.guestPort, Seqpacket: c.typ == TypeSeqpacket, State: c.sm.state.String(),
			BufAlloc: c.bufAlloc, GrantFwd: c.grantFwd, LastBufAlloc: c.lastBufAlloc, LastFwd: c.lastFwd, FwdCnt: c.fwdCnt,
			FromGuest: c.fromGuest, Window: c.window, ToHost: c.toHost.Len(),
			PeerBufAlloc: c.peerBufAlloc, PeerFwdCnt: c.peerFwdCnt, ToGuest: c.toGuest,
			Pending: uint32(c.sm.pend), HostReadable: c.hostReadable, Events: c.events,
		}
		c.mu.Unlock()
		s.rxMu.Lock()
		i.Ready = c.inReady
		s.rxMu.Unlock()
		s.budget.mu.Lock()
		i.Starved = c.starved
		s.budget.mu.Unlock()
		out = append(out, i)
	}
	slices.SortFunc(out, func(a, b ConnInfo) int {
		if a.HostPort != b.HostPort {
			return int(int64(a.HostPort) - int64(b.HostPort))
		}
		return int(int64(a.GuestPort) - int64(b.GuestPort))
	})
	return out
}
