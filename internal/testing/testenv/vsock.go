package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/microvm/microvm/vsock/hybrid"
)

// The helpers in this file take no testing.TB: the vsock benchmark program
// (bench/vsock) uses them too.

// VsockConnect opens a host-initiated vsock connection to guest port port
// through the VMM's Unix socket uds with hybrid.Dial: it sends
// "CONNECT <port>\n" and reads the "OK <host port>\n" answer without
// consuming any stream data. timeout bounds the connect and the answer; the
// connection is returned without a deadline, with the host port from the
// answer. A connection closed instead of answered (the guest refused, or
// did not answer in the VMM's connect timeout) gives an error wrapping
// hybrid.ErrRefused and io.EOF.
func VsockConnect(uds string, port uint32, timeout time.Duration) (*net.UnixConn, uint32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := hybrid.Dial(ctx, uds, port)
	if err != nil {
		return nil, 0, err
	}
	return c.UnixConn, c.HostPort(), nil
}

// SyncBuffer is a bytes.Buffer that several goroutines may use: a process's
// output copied by exec while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// GuestStats is the test guest's "testguest: stats:" line
// (docs/testguest.md): packets and payload bytes each way, the kicks it
// sent per queue, and its paravirtual waits.
type GuestStats struct {
	RxPkts, RxBytes, TxPkts, TxBytes, KicksRX, KicksTX, Waits uint64
}

var guestStatsRE = regexp.MustCompile(`testguest: stats: rx (\d+) pkts (\d+) bytes, tx (\d+) pkts (\d+) bytes, kicks rx (\d+) tx (\d+), waits (\d+),`)

// ParseGuestStats finds the stats line in the test guest's console output.
func ParseGuestStats(console string) (GuestStats, error) {
	m := guestStatsRE.FindStringSubmatch(console)
	if m == nil {
		return GuestStats{}, fmt.Errorf("no stats line from the test guest")
	}
	var v [7]uint64
	for i := range v {
		v[i], _ = strconv.ParseUint(m[i+1], 10, 64)
	}
	return GuestStats{v[0], v[1], v[2], v[3], v[4], v[5], v[6]}, nil
}
