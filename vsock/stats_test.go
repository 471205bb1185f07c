package vsock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// outcomes are the connection outcome counters a test checks.
type outcomes struct{ Established, Refused, Reset uint64 }

func outcomesOf(s vsock.Stats) outcomes {
	return outcomes{s.ConnsEstablished, s.ConnsRefused, s.ConnsReset}
}

// TestConnOutcomes: each way a connection can end lands in one counter:
// established ones that close in order count only as established, the
// refused attempts of either side as refused, and resets of established
// connections, by either side, as resets.
func TestConnOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts envOpts
		run  func(t *testing.T, e *env)
		want outcomes
	}{
		{"orderly close by the host", envOpts{}, func(t *testing.T, e *env) {
			c, h := e.connectGuest(700, 1700)
			h.Close()
			c.WaitShutdown(vsock.ShutdownBoth)
			c.Reset() // the guest's answer to SHUTDOWN(BOTH)
			e.g.Sync()
		}, outcomes{1, 0, 0}},
		{"orderly close by the guest", envOpts{}, func(t *testing.T, e *env) {
			c, h := e.connectGuest(700, 1700)
			c.Shutdown(vsock.ShutdownBoth)
			c.WaitRst()
			hostClosed(t, h)
		}, outcomes{1, 0, 0}},
		{"host-initiated, orderly close", envOpts{}, func(t *testing.T, e *env) {
			c, h := e.connectHost(1024, nil)
			c.Shutdown(vsock.ShutdownBoth)
			c.WaitRst()
			hostClosed(t, h)
		}, outcomes{1, 0, 0}},
		{"guest resets an established connection", envOpts{}, func(t *testing.T, e *env) {
			c, h := e.connectGuest(700, 1700)
			c.Reset()
			hostClosed(t, h)
		}, outcomes{1, 0, 1}},
		{"device resets on a guest error", envOpts{cfg: vsock.Config{ConnBuffer: 4096}}, func(t *testing.T, e *env) {
			e.allowGuestErrs = true
			c, h := e.connectGuest(700, 1700)
			c.Send(vsock.OpRW, 0, vsocktest.Pattern(1, 4097)) // past the credit
			c.WaitRst()
			hostClosed(t, h)
		}, outcomes{1, 0, 1}},
		{"guest does not finish closing", envOpts{cfg: vsock.Config{ConnectTimeout: 100 * time.Millisecond}}, func(t *testing.T, e *env) {
			c, h := e.connectGuest(700, 1700)
			h.Close()
			c.WaitShutdown(vsock.ShutdownBoth)
			c.WaitRst() // the close timeout
		}, outcomes{1, 0, 1}},
		{"host refuses the guest's dial", envOpts{}, func(t *testing.T, e *env) {
			e.dial.Script = func(uint32) vsocktest.DialAction { return vsocktest.DialAction{Refuse: true} }
			if _, err := e.g.Connect(700, 1700); err == nil {
				t.Fatal("connected through a refusing dialer")
			}
		}, outcomes{0, 1, 0}},
		{"no dialer", envOpts{noDialer: true}, func(t *testing.T, e *env) {
			if _, err := e.g.Connect(700, 1700); err == nil {
				t.Fatal("connected without a dialer")
			}
		}, outcomes{0, 1, 0}},
		{"guest refuses a host connection", envOpts{}, func(t *testing.T, e *env) {
			h, err := vsocktest.HostConnect(t, e.dev, 1024, nil, time.Now().Add(waitTimeout))
			if err != nil {
				t.Fatal(err)
			}
			p := e.g.WaitRequest(1024)
			e.g.SendOp(vsock.OpRst, 1024, p.Hdr.SrcPort, 0)
			hostClosed(t, h)
		}, outcomes{0, 1, 0}},
		{"host client gone before the guest accepts", envOpts{}, func(t *testing.T, e *env) {
			h, err := vsocktest.HostConnect(t, e.dev, 1024, nil, time.Now().Add(waitTimeout))
			if err != nil {
				t.Fatal(err)
			}
			p := e.g.WaitRequest(1024)
			h.Close()
			// The "OK" line cannot be written: the attempt was refused,
			// never established.
			e.g.SendOp(vsock.OpResponse, 1024, p.Hdr.SrcPort, 65536)
			e.g.ExpectOp(vsock.OpRst, p.Hdr.SrcPort, 1024)
		}, outcomes{0, 1, 0}},
		{"guest leaves a host connection unanswered", envOpts{cfg: vsock.Config{ConnectTimeout: 100 * time.Millisecond}}, func(t *testing.T, e *env) {
			h, err := vsocktest.HostConnect(t, e.dev, 1024, nil, time.Now().Add(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			e.g.WaitRequest(1024)
			hostClosed(t, h)
		}, outcomes{0, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts)
			tc.run(t, e)
			e.g.WaitFor("every connection closed", func() bool { return e.dev.Stats().ConnsOpen == 0 })
			if diff := cmp.Diff(tc.want, outcomesOf(e.dev.Stats())); diff != "" {
				t.Errorf("established, refused, reset (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGuestErrorKinds: each kind of malformed guest input is counted under
// its own kind, and GuestErrors is their sum.
func TestGuestErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		kind virtio.GuestErrorKind
		opts envOpts
		run  func(t *testing.T, e *env)
	}{
		{virtio.GuestErrHeader, envOpts{}, func(t *testing.T, e *env) {
			e.g.SendBytes(make([]byte, vsock.HeaderSize-1), nil)
		}},
		{virtio.GuestErrAddress, envOpts{}, func(t *testing.T, e *env) {
			h := e.g.Header(vsock.OpRequest, 1700, 700)
			h.SrcCID = 99
			e.g.Send(h, nil)
		}},
		{virtio.GuestErrType, envOpts{}, func(t *testing.T, e *env) {
			h := e.g.Header(vsock.OpRequest, 1700, 700)
			h.Type = 7
			e.g.Send(h, nil)
			e.g.ExpectOp(vsock.OpRst, 700, 1700)
		}},
		{virtio.GuestErrLength, envOpts{}, func(t *testing.T, e *env) {
			c, _ := e.connectGuest(700, 1700)
			h := e.g.Header(vsock.OpRW, 1700, 700)
			h.Len = 100 // the chain holds 4
			e.g.Send(h, []byte("four"))
			c.WaitRst()
		}},
		{virtio.GuestErrOp, envOpts{}, func(t *testing.T, e *env) {
			c, _ := e.connectGuest(700, 1700)
			c.Send(vsock.OpResponse, 0, nil)
			c.WaitRst()
		}},
		{virtio.GuestErrCredit, envOpts{cfg: vsock.Config{ConnBuffer: 4096}}, func(t *testing.T, e *env) {
			c, _ := e.connectGuest(700, 1700)
			c.Send(vsock.OpRW, 0, vsocktest.Pattern(1, 4097))
			c.WaitRst()
		}},
		{virtio.GuestErrQueue, envOpts{guest: vsocktest.Options{RxBuffers: -1}}, func(t *testing.T, e *env) {
			e.allowFail = true
			e.g.PostRXSized(1, 1, 1) // too small for a header
			e.g.SendOp(vsock.OpRW, 1025, 5000, 0)
			if err := e.g.WaitFail(); !errors.Is(err, virtio.ErrGuest) {
				t.Errorf("Fail(%v); want an error wrapping virtio.ErrGuest", err)
			}
		}},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			e := newEnv(t, tc.opts)
			e.allowGuestErrs = true
			tc.run(t, e)
			if !e.allowFail {
				e.g.Sync() // a failed device consumes nothing more
			}
			var want virtio.GuestErrorCounts
			want[tc.kind] = 1
			s := e.dev.Stats()
			if diff := cmp.Diff(want, s.GuestErrorsByKind); diff != "" {
				t.Errorf("guest errors by kind (-want +got):\n%s", diff)
			}
			if s.GuestErrors != 1 {
				t.Errorf("GuestErrors = %d, want 1", s.GuestErrors)
			}
		})
	}
	var names []string
	for _, k := range vsock.GuestErrorKinds {
		names = append(names, k.String())
	}
	if diff := cmp.Diff([]string{"header", "address", "type", "length", "op", "credit", "queue"}, names); diff != "" {
		t.Errorf("kind names (-want +got):\n%s", diff)
	}
}

// TestRxQueueFull: host data with no guest RX buffer posted counts an RX
// queue-full event; a guest that keeps buffers posted counts none.
func TestRxQueueFull(t *testing.T) {
	e := newEnv(t, envOpts{guest: vsocktest.Options{GuestBuf: 8 << 20}})
	c, h := e.connectGuest(700, 1700)
	if _, err := h.Write([]byte("with buffers")); err != nil {
		t.Fatal(err)
	}
	vsocktest.CheckEqual(t, "guest read", c.Read(len("with buffers")), []byte("with buffers"))
	if n := e.dev.Stats().RxQueueFull; n != 0 {
		t.Fatalf("RxQueueFull = %d with RX buffers posted, want 0", n)
	}

	e.g.AutoRepost = false
	data := vsocktest.Pattern(3, 3<<20) // more than the posted buffers hold
	go func() { _, _ = h.Write(data) }()
	e.g.WaitFor("the guest's RX buffers used up", func() bool { return e.g.RxPosted() == 0 })
	e.g.WaitFor("an RX queue-full event", func() bool { return e.dev.Stats().RxQueueFull > 0 })
	var got []byte
	e.g.WaitFor("the rest delivered once buffers are posted", func() bool {
		got = append(got, c.Consume(c.Buffered())...)
		if e.g.RxPosted() == 0 {
			e.g.PostRX(64)
		}
		return len(got) == len(data)
	})
	vsocktest.CheckEqual(t, "guest read", got, data)
}
