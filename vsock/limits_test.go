package vsock_test

import (
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// At MaxConns, guest REQUESTs get RST and host CONNECTs are closed; closing
// one connection makes room again.
func TestMaxConns(t *testing.T) {
	e := newEnv(t, envOpts{cfg: vsock.Config{MaxConns: 3}})
	c1, _ := e.connectGuest(1, 2001)
	e.connectGuest(1, 2002)
	e.connectHost(3000, nil)
	if _, err := e.g.Connect(1, 2003); err == nil {
		t.Fatal("guest connection past MaxConns established")
	}
	h, err := vsocktest.HostConnect(t, e.dev, 3001, nil, time.Now().Add(waitTimeout))
	if err == nil {
		t.Error("host connection past MaxConns accepted")
	}
	hostClosed(t, h)
	if d := e.dial.Dials.Load(); d != 2 {
		t.Errorf("%d dials; the refused REQUEST must not dial", d)
	}
	c1.Shutdown(vsock.ShutdownBoth)
	c1.WaitRst()
	e.connectGuest(1, 2003)
	if s := e.dev.Stats(); s.ConnsOpen != 3 {
		t.Errorf("%d connections open; want 3", s.ConnsOpen)
	}
}

// RSTs owed to a guest that posts no RX buffers are queued up to a bound
// (MaxConns+256); the rest are dropped and counted.
func TestRstQueueBound(t *testing.T) {
	const maxConns, flood = 4, 400
	bound := maxConns + 256
	e := newEnv(t, envOpts{cfg: vsock.Config{MaxConns: maxConns}, guest: vsocktest.Options{RxBuffers: -1}})
	for i := 0; i < flood; i++ {
		e.g.Send(e.g.Header(vsock.OpCreditUpdate, uint32(10000+i), 7), nil)
	}
	e.g.Sync()
	if s := e.dev.Stats(); s.DroppedRsts != uint64(flood-bound) || s.RstSent != 0 {
		t.Fatalf("stats %+v: want %d RSTs dropped, none sent", s, flood-bound)
	}
	e.g.PostRX(vsock.DefaultQueueSize)
	e.g.WaitFor("the queued RSTs", func() bool { return len(e.g.Pending()) >= bound })
	e.g.Quiet(quietFor, "more RSTs than the bound", func() bool { return len(e.g.Pending()) > bound })
	for i, p := range e.g.Pending() {
		if p.Hdr.Op != vsock.OpRst || p.Hdr.DstPort != uint32(10000+i) || p.Hdr.SrcPort != 7 {
			t.Fatalf("packet %d: %v; want RST 7->%d, in order", i, &p.Hdr, 10000+i)
		}
	}
}

// Each connection holds at most ConnBuffer bytes of guest data the host has
// not taken, whatever the number of connections.
func TestConnBufferBound(t *testing.T) {
	const buf = 16 << 10
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: buf}})
	var cs []*vsocktest.Conn
	for i := uint32(0); i < 4; i++ {
		c, _ := e.connectGuest(1, 2000+i)
		cs = append(cs, c)
	}
	data := vsocktest.Pattern(1, 2<<20)
	for _, c := range cs {
		e.stallGuest(c, data)
		if in := c.TxCnt - c.PeerFwdCnt; in != buf {
			t.Errorf("connection %d: %d bytes buffered; want ConnBuffer, %d", c.GuestPort, in, buf)
		}
	}
}
