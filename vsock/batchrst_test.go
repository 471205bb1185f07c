package vsock_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// readToEOF reads the host end until end of stream (or reset by peer) and
// returns every byte read.
func readToEOF(tb testing.TB, c net.Conn) []byte {
	tb.Helper()
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	defer c.SetReadDeadline(time.Time{})
	var got []byte
	var b [4096]byte
	for {
		n, err := c.Read(b[:])
		got = append(got, b[:n]...)
		if err == io.EOF || errors.Is(err, unix.ECONNRESET) {
			return got
		}
		if err != nil {
			tb.Fatalf("host read: %v (after %d bytes)", err, len(got))
		}
	}
}

// Regression: with BatchLock, stream payloads waited in the TX run until it
// ended, and an RST for the same connection later in the same batch closed
// the host socket first: the waiting bytes were dropped without a word,
// where without BatchLock they reached the host. Every byte the guest sent
// before its RST (or before any packet that ends the connection) now goes
// to the host socket before that packet takes effect.
//
// The packets are staged with the guest's kicks held (HoldTX), so the
// device finds them in one pass; BatchedPackets says whether the RST
// joined the data's run (the worker may, rarely, still be finishing the
// previous pass and take the first packet alone), and attempts repeat
// until one did.
func TestRegressionBatchedRstDropsData(t *testing.T) {
	// Each ends the connection right after the data, in the same batch.
	cases := []struct {
		name string
		end  func(c *vsocktest.Conn)
	}{
		{"rst", func(c *vsocktest.Conn) { c.Send(vsock.OpRst, 0, nil) }},
		{"rst-of-another-type", func(c *vsocktest.Conn) {
			c.Type = vsock.TypeSeqpacket
			c.Send(vsock.OpRst, 0, nil)
		}},
		{"rw-of-another-type", func(c *vsocktest.Conn) {
			c.Type = vsock.TypeSeqpacket
			c.Send(vsock.OpRW, vsock.SeqEOM, []byte("x"))
		}},
		{"response", func(c *vsocktest.Conn) { c.Send(vsock.OpResponse, 0, nil) }},
		{"unknown-op", func(c *vsocktest.Conn) { c.Send(vsock.Op(99), 0, nil) }},
		{"credit-overrun", func(c *vsocktest.Conn) {
			c.Send(vsock.OpRW, 0, make([]byte, c.Credit()+1))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{
				cfg:   vsock.Config{ConnBuffer: 4096, Options: &vsock.Options{BatchLock: true}},
				guest: vsocktest.Options{Seqpacket: true},
			})
			e.allowGuestErrs = true
			conclusive := 0
			for attempt := 0; attempt < 20 && conclusive < 3; attempt++ {
				c, h := e.connectGuest(5000, uint32(1100+attempt))
				data := vsocktest.Pattern(uint64(attempt), 3000)
				before := e.dev.Stats().BatchedPackets
				e.g.HoldTX(func() {
					c.Send(vsock.OpRW, 0, data[:1000])
					c.Send(vsock.OpRW, 0, data[1000:])
					tc.end(c)
					c.Forget()
				})
				got := readToEOF(t, h)
				h.Close()
				e.g.Sync()
				if e.dev.Stats().BatchedPackets-before < 2 {
					continue // the end packet ran in a run of its own
				}
				conclusive++
				vsocktest.CheckEqual(t, "host bytes before the "+tc.name, got, data)
			}
			if conclusive == 0 {
				t.Fatal("the device never took the data and the end packet in one run")
			}
		})
	}
}
