package vsock_test

import (
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// quietFor is how long a test watches for something that must not happen.
const quietFor = 30 * time.Millisecond

// A few MiB each way, at the same time, on connections opened from both
// sides.
func TestDataBothWays(t *testing.T) {
	for _, l := range guestLayouts[:4] {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: l.o})
			c, h := e.connectGuest(5000, 1025)
			e.transfer(c, h, vsocktest.Pattern(10, 2<<20), vsocktest.Pattern(11, 2<<20))
			c2, h2 := e.connectHost(6000, nil)
			e.transfer(c2, h2, vsocktest.Pattern(12, 1<<20+17), vsocktest.Pattern(13, 1<<20+5))
			s := e.dev.Stats()
			if s.TxBytes != 3<<20+17 || s.RxBytes != 3<<20+5 {
				t.Errorf("stats: %d bytes from the guest, %d to it; want %d and %d", s.TxBytes, s.RxBytes, 3<<20+17, 3<<20+5)
			}
		})
	}
}

// Several connections at once keep their data apart.
func TestDataManyConns(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{RxSplit: 2}})
	type pair struct {
		c   *vsocktest.Conn
		h   *vsocktest.HostConn
		out []byte
	}
	var ps []pair
	for i := uint32(0); i < 8; i++ {
		c, h := e.connectGuest(100+i%2, 3000+i)
		ps = append(ps, pair{c, h, vsocktest.Pattern(uint64(i), 48<<10)})
	}
	for _, p := range ps {
		go func() { _, _ = p.h.Write(p.out) }()
	}
	for _, p := range ps {
		vsocktest.CheckEqual(t, "guest read", p.c.Read(len(p.out)), p.out)
		p.c.Write(p.out[:1000])
		hostRead(t, p.h, p.out[:1000])
	}
}

// The device never sends the guest more than its credit; it stops at zero
// and resumes when the guest's CREDIT_UPDATE brings more.
func TestCreditHostToGuest(t *testing.T) {
	const window = 8 << 10
	e := newEnv(t, envOpts{guest: vsocktest.Options{GuestBuf: window}})
	c, h := e.connectGuest(5000, 1025)
	c.AutoCredit = false
	data := vsocktest.Pattern(5, 5*window+100)
	go func() { _, _ = h.Write(data) }()
	var got []byte
	for len(got) < len(data) {
		e.g.WaitFor("data up to the credit", func() bool {
			return c.Buffered() == min(window, len(data)-len(got))
		})
		// Nothing beyond the window (the guest also checks every packet).
		e.g.Quiet(quietFor, "data past the guest's credit", func() bool { return c.Buffered() > window })
		got = append(got, c.Consume(c.Buffered())...)
		c.CreditUpdate()
	}
	vsocktest.CheckEqual(t, "guest read", got, data)
}

// A guest that shrinks buf_alloc below what is in flight gets nothing until
// it has consumed enough.
func TestCreditGuestShrinksWindow(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{GuestBuf: 16 << 10}})
	c, h := e.connectGuest(5000, 1025)
	c.AutoCredit = false
	go func() { _, _ = h.Write(vsocktest.Pattern(6, 64<<10)) }()
	e.g.WaitFor("16 KiB", func() bool { return c.Buffered() == 16<<10 })
	c.BufAlloc = 4 << 10
	c.CreditUpdate() // fwd_cnt 0, buf_alloc 4 KiB, 16 KiB in flight
	e.g.Quiet(quietFor, "data after the window shrank", func() bool { return c.Buffered() > 16<<10 })
	c.Consume(16 << 10)
	c.CreditUpdate()
	e.g.WaitFor("4 KiB more", func() bool { return c.Buffered() == 4<<10 })
}

func TestCreditRequest(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, h := e.connectGuest(5000, 1025)
	c.Write(vsocktest.Pattern(1, 1000))
	hostRead(t, h, vsocktest.Pattern(1, 1000))
	c.CreditRequest()
	e.g.WaitFor("CREDIT_UPDATE", func() bool { return c.CountCtl(vsock.OpCreditUpdate) == 1 })
	// 1000 bytes are less than half of the 4 KiB a connection starts
	// with: the window has not grown.
	u := c.Ctl[len(c.Ctl)-1]
	if u.BufAlloc != 4096 || u.FwdCnt != 1000 {
		t.Errorf("CREDIT_UPDATE %v; want buf_alloc 4096 fwd_cnt 1000", &u)
	}
	// Asked again with nothing new: still answered.
	c.CreditRequest()
	e.g.WaitFor("second CREDIT_UPDATE", func() bool { return c.CountCtl(vsock.OpCreditUpdate) == 2 })
}

// Once the guest has used more than half of the window the device
// advertised, the device sends CREDIT_UPDATE unasked; below half it does
// not. (ConnBuffer 4 KiB: the window a connection starts with is already
// the full buffer, so it does not grow.)
func TestCreditProactiveUpdate(t *testing.T) {
	const buf = 4 << 10
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: buf}})
	c, h := e.connectGuest(5000, 1025)
	c.Write(vsocktest.Pattern(1, buf/2-1))
	hostRead(t, h, vsocktest.Pattern(1, buf/2-1))
	e.g.Sync()
	e.g.Quiet(quietFor, "CREDIT_UPDATE while the guest had more than half", func() bool { return c.CountCtl(vsock.OpCreditUpdate) > 0 })
	c.Write(vsocktest.Pattern(2, 2))
	e.g.WaitFor("a proactive CREDIT_UPDATE", func() bool { return c.CountCtl(vsock.OpCreditUpdate) > 0 })
	if c.Credit() != buf {
		t.Errorf("guest credit %d after the update; want %d (all forwarded)", c.Credit(), buf)
	}
	// A long write never stalls for want of an update.
	data := vsocktest.Pattern(3, 40*buf)
	go func() { _, _ = vsocktest.ReadFull(h, len(data), waitTimeout) }()
	c.Write(data)
}

// The device counts and resets a guest that sends more than the buffer it
// advertised.
func TestCreditGuestOverrun(t *testing.T) {
	const buf = 4096
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: buf}})
	e.allowGuestErrs = true
	c, h := e.connectGuest(5000, 1025)
	c.Send(vsock.OpRW, 0, vsocktest.Pattern(1, buf+1))
	c.WaitRst()
	hostClosed(t, h)
	if s := e.dev.Stats(); s.GuestErrors != 1 || s.ConnsOpen != 0 {
		t.Errorf("stats %+v: want 1 guest error, no connection", s)
	}
}

// A host that stops reading stalls the guest: the device buffers at most
// ConnBuffer, the guest's credit runs out, nothing is lost, and the flow
// resumes when the host reads again. Past the credit the guest is reset.
func TestHostStopsReading(t *testing.T) {
	const buf = 32 << 10
	for _, overrun := range []bool{false, true} {
		name := "recover"
		if overrun {
			name = "overrun"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOpts{cfg: vsock.Config{ConnBuffer: buf}})
			e.allowGuestErrs = overrun
			c, h := e.connectGuest(5000, 1025)
			data := vsocktest.Pattern(7, 4<<20)
			sent := e.stallGuest(c, data)
			if inFlight := c.TxCnt - c.PeerFwdCnt; inFlight != buf {
				t.Fatalf("stalled with %d bytes unacknowledged; want the whole buffer, %d", inFlight, buf)
			}
			if overrun {
				c.Send(vsock.OpRW, 0, []byte{1})
				c.WaitRst()
				return
			}
			rd := make(chan error, 1)
			var got []byte
			go func() {
				var err error
				got, err = vsocktest.ReadFull(h, len(data), waitTimeout)
				rd <- err
			}()
			c.Write(data[sent:])
			if err := <-rd; err != nil {
				t.Fatal(err)
			}
			vsocktest.CheckEqual(t, "host read", got, data)
		})
	}
}

// Host data waits for RX buffers: a guest that posts none receives nothing
// and the data arrives complete once it does.
func TestNoRxBuffers(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{GuestBuf: 8 << 20}})
	c, h := e.connectGuest(5000, 1025)
	e.g.AutoRepost = false
	starved := 0
	data := vsocktest.Pattern(8, 3<<20)
	go func() { _, _ = h.Write(data) }()
	var got []byte
	for len(got) < len(data) {
		e.g.WaitFor("the RX ring or the credit to be used up", func() bool {
			return e.g.RxPosted() == 0 || c.GuestCredit() == 0 || len(got)+c.Buffered() == len(data)
		})
		if e.g.RxPosted() == 0 {
			starved++
			n := c.Buffered()
			e.g.Quiet(time.Millisecond, "data without RX buffers", func() bool { return c.Buffered() != n })
		}
		got = append(got, c.Consume(c.Buffered())...)
		e.g.PostRX(1 + len(got)%200)
	}
	vsocktest.CheckEqual(t, "guest read", got, data)
	if starved == 0 {
		t.Error("the guest never ran out of RX buffers")
	}
}
