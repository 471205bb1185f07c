package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeGuest is a scriptable dialer for agentWait: it refuses the first
// refusals dials, then answers with one end of a pipe (or fails with err).
type fakeGuest struct {
	refusals int32
	err      error // after the refusals; nil: accept
	dials    atomic.Int32
}

func (g *fakeGuest) dial(ctx context.Context, port uint32) (net.Conn, error) {
	if g.dials.Add(1) <= g.refusals {
		return nil, fmt.Errorf("microvm: dial vsock port %d: %w", port, ErrVsockRefused)
	}
	if g.err != nil {
		return nil, g.err
	}
	c, _ := net.Pipe()
	return c, nil
}

func (g *fakeGuest) wait(ended <-chan struct{}) agentWait {
	return agentWait{dial: g.dial, ended: ended, report: func() string { return "guest state" }}
}

// TestWaitAgentRetries: refusals (a guest still booting) are dialled
// again until the guest accepts.
func TestWaitAgentRetries(t *testing.T) {
	g := &fakeGuest{refusals: 3}
	c, err := g.wait(nil).wait(context.Background(), 1024, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := g.dials.Load(); n != 4 {
		t.Errorf("%d dials, want 3 refused and 1 accepted", n)
	}
}

// TestWaitAgentTimeout: a guest that refuses until the time is up gives
// the timeout's message, the last dial's error and the guest's state, in
// the shape docs/debugging.md and internal/testing/boxtest read.
func TestWaitAgentTimeout(t *testing.T) {
	g := &fakeGuest{refusals: 1 << 30}
	start := time.Now()
	_, err := g.wait(nil).wait(context.Background(), 1024, 100*time.Millisecond)
	if err == nil {
		t.Fatal("no error")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %v, want about 100ms", took)
	}
	want := "microvm: the guest agent did not answer on vsock port 1024 within 100ms (last try: microvm: dial vsock port 1024: " +
		ErrVsockRefused.Error() + ") [guest state]"
	if err.Error() != want {
		t.Errorf("error\n%q, want\n%q", err, want)
	}
	if !errors.Is(err, ErrVsockRefused) {
		t.Errorf("error %v does not wrap the last dial's ErrVsockRefused", err)
	}
}

// TestWaitAgentCanceled: the caller's ctx ends the wait with its cause.
func TestWaitAgentCanceled(t *testing.T) {
	g := &fakeGuest{refusals: 1 << 30}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := g.wait(nil).wait(ctx, 1024, time.Minute)
	if !errors.Is(err, context.Canceled) || !strings.HasSuffix(err.Error(), "[guest state]") {
		t.Errorf("error %v, want context.Canceled and the guest's state", err)
	}
}

// TestWaitAgentRunEnded: a machine whose run ended (before the wait, or
// during it), or that DialVsock says stopped, ends the wait at once with
// ErrStopped, without the guest's state.
func TestWaitAgentRunEnded(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	later := make(chan struct{})
	time.AfterFunc(50*time.Millisecond, func() { close(later) })
	for _, tc := range []struct {
		name  string
		g     *fakeGuest
		ended <-chan struct{}
	}{
		{"ended before", &fakeGuest{}, closed},
		{"ends while refused", &fakeGuest{refusals: 1 << 30}, later},
		{"dial says stopped", &fakeGuest{err: fmt.Errorf("microvm: dial vsock port 1024: %w", ErrStopped)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c, err := tc.g.wait(tc.ended).wait(context.Background(), 1024, time.Minute)
			if c != nil {
				c.Close()
			}
			if !errors.Is(err, ErrStopped) || strings.Contains(err.Error(), "guest state") {
				t.Errorf("error %v, want ErrStopped without the guest's state", err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("gave up after %v, want at once", took)
			}
		})
	}
}

// TestWaitAgentFatal: a dial error retrying cannot fix is returned at
// once, with the guest's state.
func TestWaitAgentFatal(t *testing.T) {
	bad := errors.New("too many connections")
	g := &fakeGuest{refusals: 2, err: bad}
	_, err := g.wait(nil).wait(context.Background(), 1024, time.Minute)
	if !errors.Is(err, bad) || !strings.HasSuffix(err.Error(), "[guest state]") || g.dials.Load() != 3 {
		t.Errorf("error %v after %d dials, want the dial's error after 3", err, g.dials.Load())
	}
}

// TestWaitAgentMachine: WaitAgent on a machine without a vsock device
// fails at once with ErrNoVsock; on one whose run ended, with ErrStopped.
func TestWaitAgentMachine(t *testing.T) {
	if _, err := (&Machine{}).WaitAgent(context.Background(), 1024, time.Minute); !errors.Is(err, ErrNoVsock) {
		t.Errorf("no vsock device: %v, want ErrNoVsock", err)
	}
	m := &Machine{runEnded: make(chan struct{})}
	m.endRun.Do(func() { close(m.runEnded) })
	if _, err := m.WaitAgent(context.Background(), 1024, time.Minute); !errors.Is(err, ErrStopped) {
		t.Errorf("run ended: %v, want ErrStopped", err)
	}
}
