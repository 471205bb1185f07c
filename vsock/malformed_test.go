package vsock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// Chains too short for a header are returned and counted; nothing is sent
// back and the device keeps working.
func TestShortTxChain(t *testing.T) {
	for _, tc := range []struct {
		n  int
		at []uint32
	}{
		{0, nil}, {1, nil}, {20, nil}, {43, nil}, {43, []uint32{1, 30}},
	} {
		t.Run(fmt.Sprintf("%d-bytes-%d-cuts", tc.n, len(tc.at)), func(t *testing.T) {
			e := newEnv(t, envOpts{})
			e.allowGuestErrs = true
			var hb [vsock.HeaderSize]byte
			h := e.g.Header(vsock.OpRW, 1900, 900)
			h.Encode(hb[:])
			e.g.SendBytes(hb[:tc.n], tc.at)
			e.g.Sync()
			if s := e.dev.Stats(); s.GuestErrors != 1 {
				t.Errorf("%d guest errors; want 1", s.GuestErrors)
			}
			e.g.Quiet(quietFor, "a reply to a headerless chain", func() bool { return len(e.g.Pending()) > 0 })
			e.connectGuest(5000, 1025)
		})
	}
	// A header split 20+24 with the payload in a third descriptor is a
	// packet like any other.
	t.Run("header-split", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		c, h := e.connectGuest(5000, 1025)
		p := e.g.Header(vsock.OpRW, 1025, 5000)
		p.Len, p.BufAlloc = 5, vsocktest.DefaultGuestBuf
		var b [vsock.HeaderSize + 5]byte
		p.Encode(b[:])
		copy(b[vsock.HeaderSize:], "split")
		e.g.SendBytes(b[:], []uint32{20, 44})
		hostRead(t, h, []byte("split"))
		_ = c
	})
}

// A chain with a writable part is fine for TX: only its readable part is
// the packet.
func TestTxChainWithWritablePart(t *testing.T) {
	e := newEnv(t, envOpts{})
	_, h := e.connectGuest(5000, 1025)
	p := e.g.Header(vsock.OpRW, 1025, 5000)
	p.Len, p.BufAlloc = 3, vsocktest.DefaultGuestBuf
	var b [vsock.HeaderSize + 3]byte
	p.Encode(b[:])
	copy(b[vsock.HeaderSize:], "abc")
	a := e.g.Mem.Alloc(uint64(len(b))+64, 8)
	if err := e.g.Mem.Write(a, b[:]); err != nil {
		t.Fatal(err)
	}
	e.g.AddTX(-1, virtiotest.Buf{Addr: a, Len: uint32(len(b))}, virtiotest.Buf{Addr: a + uint64(len(b)), Len: 64, Writable: true})
	hostRead(t, h, []byte("abc"))
}

// Lengths the chain does not back, or past the protocol's maximum, reset
// the connection (or are answered with RST) and are counted.
func TestBadLength(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hdrLen   uint32
		payload  int
		existing bool
	}{
		{"len-past-chain", 100, 50, false},
		{"len-past-chain-existing", 100, 99, true},
		{"len-max-uint32", ^uint32(0), 10, true},
		{"len-over-64k", vsock.MaxPacketPayload + 1, vsock.MaxPacketPayload + 1, false},
		{"len-over-64k-existing", vsock.MaxPacketPayload + 1, vsock.MaxPacketPayload + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			e.allowGuestErrs = true
			var h *vsocktest.HostConn
			var c *vsocktest.Conn
			if tc.existing {
				c, h = e.connectGuest(5000, 1025)
			}
			p := e.g.Header(vsock.OpRW, 1025, 5000)
			p.Len, p.BufAlloc = tc.hdrLen, vsocktest.DefaultGuestBuf
			if tc.existing {
				e.g.Send(p, make([]byte, tc.payload))
				c.WaitRst()
				hostClosed(t, h)
			} else {
				e.g.Send(p, make([]byte, tc.payload))
				e.g.ExpectOp(vsock.OpRst, 5000, 1025)
			}
			if s := e.dev.Stats(); s.GuestErrors != 1 || s.TxBytes != 0 {
				t.Errorf("stats %+v: want 1 guest error and no bytes forwarded", s)
			}
		})
	}
	// Exactly 64 KiB is allowed.
	t.Run("len-64k", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		c, h := e.connectGuest(5000, 1025)
		// Enough data first for the window to grow past 64 KiB.
		e.transfer(c, h, vsocktest.Pattern(2, 512<<10), nil)
		n := c.CountCtl(vsock.OpCreditUpdate)
		c.CreditRequest()
		e.g.WaitFor("a CREDIT_UPDATE", func() bool { return c.CountCtl(vsock.OpCreditUpdate) > n })
		if c.Credit() < vsock.MaxPacketPayload {
			t.Fatalf("credit %d after 512 KiB; want at least %d", c.Credit(), vsock.MaxPacketPayload)
		}
		data := vsocktest.Pattern(1, vsock.MaxPacketPayload)
		c.MaxPacket = vsock.MaxPacketPayload
		c.Send(vsock.OpRW, 0, data)
		hostRead(t, h, data)
	})
}

// Packets with the wrong CIDs are dropped and counted: the guest cannot
// speak for another CID, and only the host is reachable.
func TestWrongCID(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst uint64
	}{
		{"src-other-guest", vsocktest.DefaultCID + 1, vsock.CIDHost},
		{"src-host", vsock.CIDHost, vsock.CIDHost},
		{"src-high-bits", vsocktest.DefaultCID | 1<<32, vsock.CIDHost},
		{"dst-self", vsocktest.DefaultCID, vsocktest.DefaultCID},
		{"dst-hypervisor", vsocktest.DefaultCID, vsock.CIDHypervisor},
		{"dst-local", vsocktest.DefaultCID, vsock.CIDLocal},
		{"dst-any", vsocktest.DefaultCID, 0xffffffff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			e.allowGuestErrs = true
			c, h := e.connectGuest(5000, 1025)
			for _, op := range []vsock.Op{vsock.OpRequest, vsock.OpRW, vsock.OpRst, vsock.OpShutdown} {
				p := e.g.Header(op, 1025, 5000)
				p.SrcCID, p.DstCID = tc.src, tc.dst
				p.Len = 4
				if op != vsock.OpRW {
					p.Len = 0
				}
				e.g.Send(p, []byte("evil")[:p.Len])
			}
			e.g.Sync()
			if s := e.dev.Stats(); s.GuestErrors != 4 || s.TxBytes != 0 || s.ConnsOpened != 1 {
				t.Errorf("stats %+v: want 4 guest errors, nothing forwarded, no new connection", s)
			}
			e.g.Quiet(quietFor, "a reply to a packet with wrong CIDs", func() bool { return len(e.g.Pending()) > 0 || c.Rst })
			// The real connection is untouched.
			e.transfer(c, h, []byte("still"), []byte("here"))
		})
	}
}

// Stream sockets, and SEQPACKET ones only when the driver negotiated
// VIRTIO_VSOCK_F_SEQPACKET: other types are refused with RST (of type
// STREAM: the driver knows no other) and counted, but an RST is never
// answered.
func TestSocketType(t *testing.T) {
	for _, tc := range []struct {
		typ       uint16
		seqpacket bool // the driver negotiates SEQPACKET
	}{
		{0, false}, {vsock.TypeSeqpacket, false}, {3, false}, {0xffff, false},
		{0, true}, {3, true}, {0xffff, true},
	} {
		t.Run(fmt.Sprintf("%d-seqpacket-%v", tc.typ, tc.seqpacket), func(t *testing.T) {
			e := newEnv(t, envOpts{guest: vsocktest.Options{Seqpacket: tc.seqpacket}})
			e.allowGuestErrs = true
			p := e.g.Header(vsock.OpRequest, 1025, 5000)
			p.Type = tc.typ
			e.g.Send(p, nil)
			if rst := e.g.ExpectOp(vsock.OpRst, 5000, 1025); rst.Hdr.Type != vsock.TypeStream {
				t.Errorf("RST %v; want type STREAM", &rst.Hdr)
			}
			p.Op = vsock.OpRst
			e.g.Send(p, nil)
			e.g.Sync()
			e.g.Quiet(quietFor, "an RST answered", func() bool { return len(e.g.Pending()) > 0 })
			if s := e.dev.Stats(); s.GuestErrors != 1 || e.dial.Dials.Load() != 0 {
				t.Errorf("stats %+v, %d dials: want 1 guest error, no dial", s, e.dial.Dials.Load())
			}
		})
	}
}

// RX buffers the device cannot use stop the device (Activation.Fail, which
// the transport turns into DEVICE_NEEDS_RESET) rather than being skipped or
// overflowed.
func TestBadRxBuffer(t *testing.T) {
	for _, tc := range []struct {
		name string
		size uint32
		k    int
	}{
		{"0-bytes", 0, 1},
		{"1-byte", 1, 1},
		{"43-bytes", 43, 1},
		{"43-bytes-split", 43, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: vsocktest.Options{RxBuffers: -1}})
			e.allowFail = true
			e.g.PostRXSized(1, tc.size, tc.k)
			// A packet for an unknown connection: the device owes an RST.
			e.g.SendOp(vsock.OpRW, 1025, 5000, 0)
			err := e.g.WaitFail()
			if !errors.Is(err, virtio.ErrGuest) {
				t.Errorf("Fail(%v); want an error wrapping virtio.ErrGuest", err)
			}
			checkQuiet(t, e)
		})
	}
	// An RX chain that is all readable.
	t.Run("readable-only", func(t *testing.T) {
		e := newEnv(t, envOpts{guest: vsocktest.Options{RxBuffers: -1}})
		e.allowFail = true
		a := e.g.Mem.Alloc(4096, 8)
		e.g.RX.Add(virtiotest.Buf{Addr: a, Len: 4096})
		_ = e.g.RXKick.Signal()
		e.g.SendOp(vsock.OpRW, 1025, 5000, 0)
		if err := e.g.WaitFail(); !errors.Is(err, virtio.ErrGuest) {
			t.Errorf("Fail(%v); want an error wrapping virtio.ErrGuest", err)
		}
	})
}

// checkQuiet checks that a failed device does nothing more: no used
// entries, no interrupts, whatever the guest kicks and the host writes.
func checkQuiet(t *testing.T, e *env) {
	t.Helper()
	rxUsed, _ := e.g.Mem.Load16Acquire(e.g.RX.Cfg.Used + 2)
	txUsed, _ := e.g.Mem.Load16Acquire(e.g.TX.Cfg.Used + 2)
	rxIrq, txIrq := e.g.Interrupts()
	e.g.PostRX(4)
	e.g.SendOp(vsock.OpRequest, 1026, 5001, 4096)
	e.g.Kick()
	time.Sleep(quietFor)
	rxUsed2, _ := e.g.Mem.Load16Acquire(e.g.RX.Cfg.Used + 2)
	txUsed2, _ := e.g.Mem.Load16Acquire(e.g.TX.Cfg.Used + 2)
	rxIrq2, txIrq2 := e.g.Interrupts()
	if rxUsed2 != rxUsed || txUsed2 != txUsed || rxIrq2 != rxIrq || txIrq2 != txIrq {
		t.Errorf("failed device kept working: used %d/%d -> %d/%d, interrupts %d/%d -> %d/%d",
			rxUsed, txUsed, rxUsed2, txUsed2, rxIrq, txIrq, rxIrq2, txIrq2)
	}
	if n := len(e.g.Fails()); n != 1 {
		t.Errorf("Fail called %d times; want once", n)
	}
	// A reset and a new activation bring it back.
	e.g.Reset()
	e.g.Activate()
	e.g.PostRX(16)
	e.connectGuest(5002, 1027)
}

// Broken rings stop the device through Fail: no panic, the workers stay
// quiet, and a reset recovers.
func TestBrokenRing(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts vsocktest.Options
		brk  func(g *vsocktest.Guest)
	}{
		{"tx-avail-idx-far-ahead", vsocktest.Options{}, func(g *vsocktest.Guest) {
			g.TX.SetAvailIdx(g.TX.AvailIdx() + 1000)
			_ = g.TXKick.Signal()
		}},
		{"tx-avail-idx-far-ahead-eventidx", vsocktest.Options{EventIdx: true}, func(g *vsocktest.Guest) {
			g.TX.SetAvailIdx(g.TX.AvailIdx() + 257)
			_ = g.TXKick.Signal()
		}},
		{"tx-head-out-of-range", vsocktest.Options{}, func(g *vsocktest.Guest) {
			g.TX.PublishHead(vsock.DefaultQueueSize)
			_ = g.TXKick.Signal()
		}},
		{"tx-buffer-outside-memory", vsocktest.Options{}, func(g *vsocktest.Guest) {
			g.AddTX(-1, virtiotest.Buf{Addr: 1 << 40, Len: 64})
		}},
		{"tx-buffer-wraps", vsocktest.Options{}, func(g *vsocktest.Guest) {
			g.AddTX(-1, virtiotest.Buf{Addr: ^uint64(0) - 10, Len: 64})
		}},
		{"tx-descriptor-loop", vsocktest.Options{}, func(g *vsocktest.Guest) {
			a := g.Mem.Alloc(64, 8)
			g.TX.WriteDesc(g.TX.Cfg.Desc, 7, a, 64, virtiotest.FlagNext, 7)
			g.TX.PublishHead(7)
			_ = g.TXKick.Signal()
		}},
		{"tx-indirect-not-negotiated", vsocktest.Options{}, func(g *vsocktest.Guest) {
			a := g.Mem.Alloc(64, 16)
			g.TX.WriteDesc(g.TX.Cfg.Desc, 9, a, 16, virtiotest.FlagIndirect, 0)
			g.TX.PublishHead(9)
			_ = g.TXKick.Signal()
		}},
		{"tx-unknown-flag", vsocktest.Options{}, func(g *vsocktest.Guest) {
			a := g.Mem.Alloc(64, 8)
			g.TX.WriteDesc(g.TX.Cfg.Desc, 3, a, 64, 0x80, 0)
			g.TX.PublishHead(3)
			_ = g.TXKick.Signal()
		}},
		{"rx-avail-idx-far-ahead", vsocktest.Options{RxBuffers: -1}, func(g *vsocktest.Guest) {
			g.RX.SetAvailIdx(g.RX.AvailIdx() + 1000)
			g.SendOp(vsock.OpRW, 1025, 5000, 0) // the device owes an RST
		}},
		{"rx-buffer-outside-memory", vsocktest.Options{RxBuffers: -1}, func(g *vsocktest.Guest) {
			g.RX.Add(virtiotest.Buf{Addr: 1 << 40, Len: 4096, Writable: true})
			g.SendOp(vsock.OpRW, 1025, 5000, 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: tc.opts})
			e.allowFail = true
			tc.brk(e.g)
			if err := e.g.WaitFail(); !errors.Is(err, virtio.ErrGuest) {
				t.Errorf("Fail(%v); want an error wrapping virtio.ErrGuest", err)
			}
			checkQuiet(t, e)
		})
	}
}

// A failed device keeps its host connections until the reset, and the
// reset closes them.
func TestFailThenReset(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.allowFail = true
	_, h := e.connectGuest(5000, 1025)
	e.g.TX.SetAvailIdx(e.g.TX.AvailIdx() + 1000)
	_ = e.g.TXKick.Signal()
	e.g.WaitFail()
	hostWrite(t, h, []byte("into the void"))
	e.g.Reset()
	hostClosed(t, h)
}
