package vsock_test

import (
	"fmt"
	"testing"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// FuzzBatchOracle is a session fuzz target with an oracle: the same guest
// packet sequence runs on two devices, one with Options.BatchLock and one
// without, and the host must receive the same bytes on every connection
// from both. BatchLock changes how the device locks and writes (one writev
// per run), never what the host gets. Unlike the other session targets it
// does not settle after each step: packets are staged in bursts with the
// guest's kicks held (vsocktest.Guest.HoldTX), so that the device takes a
// burst in one TX pass and its packets share runs, data and what ends the
// connection (RST, SHUTDOWN, a reset) alike.
//
// An input is one configuration byte, one byte for the number of
// connections (1-3, guest-initiated, stream), then steps of two bytes:
//
//	config    bit 0 KickSuppress, 1 DirectEnqueue, 2 IRQCoalesce,
//	          3 ShortReadDrains, 4 ReadinessGate (the same on both devices)
//	op & 15   0-5 RW of a (arg)-sized payload, 6 RST, 7 SHUTDOWN(arg%3+1),
//	          8 CREDIT_UPDATE, 9 CREDIT_REQUEST, 10 RST of another type,
//	          11 RW of another type, 12 RESPONSE on an open connection,
//	          13 an unknown op, 14-15 end the burst (kick and wait)
//	op >> 4   picks the connection
//
// Every connection gets an RST at the end; each host end is then read to
// end of stream. The guest's payloads are honest and small: a
// connection's RW bytes stay within the window it was first given and
// within 16 KiB, so the host socket never fills and no credit update
// decides anything (both could differ with the timing of the two runs,
// not with BatchLock).
func FuzzBatchOracle(f *testing.F) {
	f.Add([]byte{0, 0, 0x00, 200, 0x06, 0})
	f.Add([]byte{7, 2, 0x00, 10, 0x10, 20, 0x01, 30, 0x16, 0, 0x0e, 0, 0x00, 5, 0x07, 1, 0x06, 0})
	f.Add([]byte{31, 1, 0x00, 255, 0x0a, 0, 0x10, 9, 0x1b, 0, 0x00, 1, 0x0c, 0, 0x0f, 0, 0x10, 3, 0x1d, 0})
	f.Add([]byte{2, 1, 0x00, 100, 0x07, 0, 0x10, 100, 0x17, 2, 0x08, 0, 0x19, 0, 0x00, 7})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 || len(in) > 2+2*96 {
			return
		}
		off := batchOracleRun(t, in, false)
		on := batchOracleRun(t, in, true)
		for i := range off {
			if string(on[i]) != string(off[i]) {
				t.Fatalf("connection %d: the host got %d bytes with BatchLock, %d without; first difference at %d",
					i, len(on[i]), len(off[i]), firstDiffAt(on[i], off[i]))
			}
		}
	})
}

func firstDiffAt(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// oracleConn is one connection of a batchOracleRun.
type oracleConn struct {
	c    *vsocktest.Conn
	h    *vsocktest.HostConn
	data []byte // the guest's stream
	sent int    // bytes of data sent
	win  int    // bytes the guest may send in all
}

const (
	oracleMaxBytes = 16 << 10 // per connection
	oracleMaxBurst = 16       // packets per burst: vsocktest's TX slots
)

// batchOracleRun plays in on a fresh device with or without BatchLock and
// returns what each connection's host end received.
func batchOracleRun(t *testing.T, in []byte, batch bool) [][]byte {
	cfgb := in[0]
	opts := &vsock.Options{KickSuppress: cfgb&1 != 0, DirectEnqueue: cfgb&2 != 0, IRQCoalesce: cfgb&4 != 0,
		ShortReadDrains: cfgb&8 != 0, ReadinessGate: cfgb&16 != 0, BatchLock: batch}
	e := newEnv(t, envOpts{cfg: vsock.Config{Options: opts}, guest: vsocktest.Options{Seqpacket: true}, noLeakCheck: true})
	e.allowGuestErrs = true
	n := 1 + int(in[1])%3
	conns := make([]*oracleConn, n)
	for i := range conns {
		c, h := e.connectGuest(5000, uint32(1024+i))
		win := min(int(c.Credit()), oracleMaxBytes)
		conns[i] = &oracleConn{c: c, h: h, data: vsocktest.Pattern(uint64(i+1), win), win: win}
	}
	steps := in[2:]
	for len(steps) >= 2 {
		e.g.HoldTX(func() {
			for k := 0; len(steps) >= 2 && k < oracleMaxBurst; k++ {
				op, arg := steps[0], steps[1]
				steps = steps[2:]
				if op&15 >= 14 {
					return
				}
				oracleStep(conns[int(op>>4)%n], op&15, arg)
			}
		})
		e.g.Sync()
		e.g.Poll()
	}
	e.g.HoldTX(func() {
		for _, oc := range conns {
			oc.c.Send(vsock.OpRst, 0, nil)
		}
	})
	got := make([][]byte, n)
	for i, oc := range conns {
		got[i] = readToEOF(t, oc.h)
		oc.h.Close()
		oc.c.Forget()
		if len(got[i]) > oc.sent || string(got[i]) != string(oc.data[:len(got[i])]) {
			t.Fatalf("BatchLock %v, connection %d: the host got %d bytes that are not the first of the %d the guest sent (first difference at %d)",
				batch, i, len(got[i]), oc.sent, firstDiffAt(got[i], oc.data[:min(len(got[i]), oc.sent)]))
		}
	}
	e.g.Sync()
	if f := e.g.Fails(); len(f) > 0 {
		t.Fatalf("BatchLock %v: the device failed: %v", batch, f)
	}
	return got
}

// oracleStep sends one packet of a burst on oc.
func oracleStep(oc *oracleConn, op, arg byte) {
	c := oc.c
	defer func() { c.Type = vsock.TypeStream }() // the guest checks the device's packets against it
	switch op {
	case 0, 1, 2, 3, 4, 5:
		k := min(1+int(arg)*int(op+1)*5, oc.win-oc.sent, c.MaxPacket)
		if k <= 0 {
			return
		}
		c.Send(vsock.OpRW, 0, oc.data[oc.sent:oc.sent+k])
		oc.sent += k
	case 6:
		c.Send(vsock.OpRst, 0, nil)
	case 7:
		c.Send(vsock.OpShutdown, uint32(arg%3+1), nil)
	case 8:
		c.Send(vsock.OpCreditUpdate, 0, nil)
	case 9:
		c.Send(vsock.OpCreditRequest, 0, nil)
	case 10:
		c.Type = vsock.TypeSeqpacket
		c.Send(vsock.OpRst, 0, nil)
		c.Forget() // the device may answer later packets with RSTs of either type
	case 11:
		c.Type = vsock.TypeSeqpacket
		c.Send(vsock.OpRW, vsock.SeqEOM, []byte("x"))
		c.Forget()
	case 12:
		c.Send(vsock.OpResponse, 0, nil)
	case 13:
		c.Send(vsock.Op(50+arg%50), 0, nil)
	default:
		panic(fmt.Sprintf("oracle op %d", op))
	}
}
