package vsock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// guestLayouts are the driver layouts the core scenarios run under: ring
// notification styles and buffers split across descriptors.
var guestLayouts = []struct {
	name string
	o    vsocktest.Options
}{
	{"plain", vsocktest.Options{}},
	{"eventidx", vsocktest.Options{EventIdx: true}},
	{"split", vsocktest.Options{RxSplit: 2, TxSplit: 3}},
	{"eventidx-split3", vsocktest.Options{EventIdx: true, RxSplit: 3, TxSplit: 2}},
	{"indirect", vsocktest.Options{Indirect: true, TxSplit: 3, QueueSize: 64}},
	{"no-event-queue", vsocktest.Options{NoEventQueue: true, RxBufLen: vsock.HeaderSize + 1500}},
}

func TestGuestConnect(t *testing.T) {
	for _, l := range guestLayouts {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: l.o})
			c, h := e.connectGuest(5000, 1025)
			if got := c.CountCtl(vsock.OpResponse); got != 1 {
				t.Errorf("%d RESPONSEs; want 1", got)
			}
			// A connection starts with the minimum window; it grows
			// as the guest sends (TestWindowGrowsWithUse).
			resp := c.Ctl[0]
			if resp.BufAlloc != 4096 || resp.FwdCnt != 0 {
				t.Errorf("RESPONSE %v: want buf_alloc 4096, fwd_cnt 0", &resp)
			}
			e.transfer(c, h, vsocktest.Pattern(1, 100<<10), vsocktest.Pattern(2, 100<<10))
			if s := e.dev.Stats(); s.ConnsOpen != 1 || s.ConnsOpened != 1 {
				t.Errorf("stats %+v: want one connection open", s)
			}
		})
	}
}

func TestHostConnect(t *testing.T) {
	for _, l := range guestLayouts {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, envOpts{guest: l.o})
			prefix := []byte("bytes after the CONNECT line")
			c, h := e.connectHost(1234, prefix)
			// The prefix reaches the guest before anything the host
			// writes after the handshake.
			hostWrite(t, h, []byte("then this"))
			vsocktest.CheckEqual(t, "guest read", c.Read(len(prefix)+9), append(prefix, "then this"...))
			e.transfer(c, h, vsocktest.Pattern(3, 64<<10), vsocktest.Pattern(4, 64<<10))
		})
	}
}

// The OK line precedes any data the guest sends right after RESPONSE.
func TestHostConnectOKBeforeData(t *testing.T) {
	e := newEnv(t, envOpts{})
	h, err := vsocktest.HostConnect(t, e.dev, 77, nil, time.Now().Add(waitTimeout))
	if err != nil {
		t.Fatal(err)
	}
	c := e.g.Accept(77)
	c.Write([]byte("hello host"))
	port, err := vsocktest.ReadOK(h, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if port != c.HostPort {
		t.Fatalf("OK %d; guest saw host port %d", port, c.HostPort)
	}
	hostRead(t, h, []byte("hello host"))
}

// Host ports of host-initiated connections are distinct and in [2^30, 2^31).
func TestHostConnectPorts(t *testing.T) {
	e := newEnv(t, envOpts{})
	seen := map[uint32]bool{}
	for i := 0; i < 5; i++ {
		c, _ := e.connectHost(99, nil)
		if seen[c.HostPort] {
			t.Fatalf("host port %d handed out twice", c.HostPort)
		}
		seen[c.HostPort] = true
	}
}

func TestHostConnectGuestRst(t *testing.T) {
	e := newEnv(t, envOpts{})
	h, err := vsocktest.HostConnect(t, e.dev, 80, []byte("lost"), time.Now().Add(waitTimeout))
	if err != nil {
		t.Fatal(err)
	}
	req := e.g.WaitRequest(80)
	e.g.SendOp(vsock.OpRst, 80, req.Hdr.SrcPort, 0)
	hostClosed(t, h)
	e.g.Sync()
	if s := e.dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open after the guest refused", s.ConnsOpen)
	}
	e.g.Quiet(20*time.Millisecond, "the device answered the guest's RST", func() bool { return len(e.g.Pending()) > 0 })
}

func TestHostConnectTimeout(t *testing.T) {
	e := newEnv(t, envOpts{})
	start := time.Now()
	h, err := vsocktest.HostConnect(t, e.dev, 81, nil, start.Add(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	req := e.g.WaitRequest(81)
	rst := e.g.ExpectOp(vsock.OpRst, req.Hdr.SrcPort, 81)
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("RST after %v, before the deadline", d)
	}
	_ = rst
	hostClosed(t, h)
	// A late RESPONSE is for a connection that no longer exists: RST.
	e.g.SendOp(vsock.OpResponse, 81, req.Hdr.SrcPort, 4096)
	e.g.ExpectOp(vsock.OpRst, req.Hdr.SrcPort, 81)
}

func TestHostConnectBeforeActivation(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.g.Reset()
	fd, h := vsocktest.Socketpair(t)
	defer h.Close()
	done := make(chan error, 1)
	go func() { done <- e.dev.ConnectFromHost(fd, 90, []byte("early"), time.Now().Add(waitTimeout)) }()
	select {
	case err := <-done:
		t.Fatalf("ConnectFromHost returned %v before the device was activated", err)
	case <-time.After(20 * time.Millisecond):
	}
	e.g.Activate()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c := e.g.Accept(90)
	if _, err := vsocktest.ReadOK(h, waitTimeout); err != nil {
		t.Fatal(err)
	}
	vsocktest.CheckEqual(t, "prefix", c.Read(5), []byte("early"))
}

func TestHostConnectNeverActivated(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.g.Reset()
	fd, h := vsocktest.Socketpair(t)
	defer h.Close()
	start := time.Now()
	err := e.dev.ConnectFromHost(fd, 90, nil, start.Add(50*time.Millisecond))
	if err == nil {
		t.Fatal("ConnectFromHost to an inactive device succeeded")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("gave up after %v, before the deadline", d)
	}
	hostClosed(t, h)
	// Close releases a waiter at once.
	fd2, h2 := vsocktest.Socketpair(t)
	defer h2.Close()
	done := make(chan error, 1)
	go func() { done <- e.dev.ConnectFromHost(fd2, 91, nil, time.Now().Add(time.Hour)) }()
	time.Sleep(10 * time.Millisecond)
	e.dev.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("ConnectFromHost to a closed device succeeded")
		}
	case <-time.After(waitTimeout):
		t.Fatal("Close did not release ConnectFromHost")
	}
	hostClosed(t, h2)
}

func TestGuestConnectRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.dial.Script = func(port uint32) vsocktest.DialAction { return vsocktest.DialAction{Refuse: port == 9} }
	if _, err := e.g.Connect(9, 1030); err == nil {
		t.Fatal("connection to a refused port established")
	}
	if s := e.dev.Stats(); s.ConnsOpen != 0 {
		t.Errorf("%d connections open", s.ConnsOpen)
	}
	// The device survives and serves the next one.
	e.connectGuest(10, 1030)
}

func TestGuestConnectNoDialer(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    envOpts
	}{
		{"nil", envOpts{noDialer: true}},
		{"failing", envOpts{cfg: vsock.Config{Dialer: noDialer{}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.o)
			if _, err := e.g.Connect(9, 1030); err == nil {
				t.Fatal("connection without a dialer established")
			}
			// Host-initiated connections still work.
			e.connectHost(40, nil)
		})
	}
}

type noDialer struct{}

func (noDialer) Dial(uint32, uint32, time.Duration) (int, error) { return -1, errors.New("no") }

// portsDialer is the scripted dialer recording the ports Dial was called
// with.
type portsDialer struct {
	*vsocktest.Dialer
	calls chan [2]uint32 // guest port, host port
}

func (p portsDialer) Dial(guestPort, port uint32, timeout time.Duration) (int, error) {
	p.calls <- [2]uint32{guestPort, port}
	return p.Dialer.Dial(guestPort, port, timeout)
}

// TestGuestConnectDialPorts: the Dialer is given the guest's source port
// as well as the port the guest asked for.
func TestGuestConnectDialPorts(t *testing.T) {
	pd := portsDialer{Dialer: vsocktest.NewDialer(t), calls: make(chan [2]uint32, 1)}
	e := newEnv(t, envOpts{cfg: vsock.Config{Dialer: pd}})
	if _, err := e.g.Connect(5000, 1031); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-pd.calls:
		if got != [2]uint32{1031, 5000} {
			t.Errorf("Dial(guest port %d, port %d), want (1031, 5000)", got[0], got[1])
		}
	default:
		t.Error("the device did not call the Dialer")
	}
}

// A slow host listener does not hold up other connections: the dial runs
// on its own goroutine.
func TestGuestConnectSlowDial(t *testing.T) {
	e := newEnv(t, envOpts{})
	release := make(chan struct{})
	e.dial.Script = func(port uint32) vsocktest.DialAction {
		if port == 1 {
			return vsocktest.DialAction{Wait: release}
		}
		return vsocktest.DialAction{}
	}
	slow := e.g.Dial(1, 2000)
	c, h := e.connectGuest(2, 2001)
	e.transfer(c, h, []byte("fast"), []byte("lane"))
	if slow.Established || slow.Rst {
		t.Fatal("slow connection answered before its dial finished")
	}
	close(release)
	e.g.WaitFor("RESPONSE after the slow dial", func() bool { return slow.Established })
	hs := e.dial.Accept(waitTimeout)
	e.transfer(slow, hs, []byte("slow"), []byte("lane"))
}

// A dial that outlasts ConnectTimeout fails: RST to the guest.
func TestGuestConnectDialTimeout(t *testing.T) {
	e := newEnv(t, envOpts{cfg: vsock.Config{ConnectTimeout: 50 * time.Millisecond}})
	never := make(chan struct{})
	e.dial.Script = func(uint32) vsocktest.DialAction { return vsocktest.DialAction{Wait: never} }
	if _, err := e.g.Connect(3, 2002); err == nil {
		t.Fatal("established despite the dial timing out")
	}
}
