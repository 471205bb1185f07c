package agentapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/microvm/microvm/vsock/hybrid"
)

// healthServer serves gRPC's health service on a Unix socket and returns
// its path.
func healthServer(t *testing.T) string {
	t.Helper()
	return serveUnix(t, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health.NewServer()) })
}

// serveUnix serves a gRPC server, with what register adds, on a Unix
// socket of its own until the test ends, and returns the socket's path.
func serveUnix(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent") // short: sun_path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return sock
}

// TestConnectWaits: refusals (the guest still booting) are retried until
// the agent answers, and the connection Connect made is the one gRPC uses
// first.
func TestConnectWaits(t *testing.T) {
	sock := healthServer(t)
	var dials atomic.Int32
	dial := func(ctx context.Context) (net.Conn, error) {
		if dials.Add(1) <= 3 {
			return nil, fmt.Errorf("dial: %w", hybrid.ErrRefused)
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Connect(ctx, dial)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
	if n := dials.Load(); n != 4 {
		t.Errorf("%d dials, want 3 refused and 1 used", n)
	}
}

// TestConnectGivesUp: an error retrying cannot fix is returned at once; a
// refusal that lasts is returned when ctx ends, with both causes.
func TestConnectGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Connect(ctx, func(context.Context) (net.Conn, error) { return nil, hybrid.ErrNotVsock })
	if !errors.Is(err, hybrid.ErrNotVsock) || time.Since(start) > time.Second {
		t.Errorf("not a vsock socket: %v after %v; want ErrNotVsock at once", err, time.Since(start))
	}

	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err = Connect(short, func(context.Context) (net.Conn, error) { return nil, hybrid.ErrRefused })
	if !errors.Is(err, hybrid.ErrRefused) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("lasting refusal: %v; want ErrRefused and DeadlineExceeded", err)
	}
}

// TestConnCloseUnused: closing a Conn that never made a call closes the
// connection Connect made.
func TestConnCloseUnused(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c, err := Connect(context.Background(), func(context.Context) (net.Conn, error) { return a, nil })
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := b.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the unused first connection is still open: %v", err)
	}
}

// fakeVM is a VM whose guest is a health server on a Unix socket: port
// must be want, WaitAgent fails with err when set, and each dial's
// connection is kept (to break it).
type fakeVM struct {
	want         uint32
	path         string
	err          error
	waits, dials atomic.Int32
	conns        chan net.Conn
}

func (v *fakeVM) connect(ctx context.Context, port uint32) (net.Conn, error) {
	if port != v.want {
		return nil, fmt.Errorf("port %d, want %d", port, v.want)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", v.path)
	if err == nil {
		v.conns <- c
	}
	return c, err
}

func (v *fakeVM) WaitAgent(ctx context.Context, port uint32, timeout time.Duration) (net.Conn, error) {
	v.waits.Add(1)
	if timeout != time.Minute {
		return nil, fmt.Errorf("timeout %v, want the caller's 1m0s", timeout)
	}
	if v.err != nil {
		return nil, v.err
	}
	return v.connect(ctx, port)
}

func (v *fakeVM) DialVsock(ctx context.Context, port uint32) (net.Conn, error) {
	v.dials.Add(1)
	return v.connect(ctx, port)
}

// TestConnectVM: ConnectVM's first transport is the one WaitAgent
// returned, on the port and with the timeout given; after a break gRPC
// dials again through DialVsock; a failed wait is WaitAgent's error.
func TestConnectVM(t *testing.T) {
	v := &fakeVM{want: 1234, path: healthServer(t), conns: make(chan net.Conn, 8)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ConnectVM(ctx, v, 1234, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	check := func() error {
		resp, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("status %v", resp.GetStatus())
		}
		return err
	}
	if err := check(); err != nil {
		t.Fatalf("health: %v", err)
	}
	if w, d := v.waits.Load(), v.dials.Load(); w != 1 || d != 0 {
		t.Errorf("%d waits and %d dials before a break, want 1 and 0", w, d)
	}
	(<-v.conns).Close() // the transport breaks
	// A call made before gRPC saw the break fails with it; later ones
	// go through the new transport.
	for check() != nil {
		if ctx.Err() != nil {
			t.Fatalf("health after the break: %v", check())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := v.dials.Load(); d < 1 {
		t.Errorf("no DialVsock after the break")
	}

	stopped := errors.New("the machine has stopped")
	_, err = ConnectVM(ctx, &fakeVM{want: 1234, err: stopped}, 1234, time.Minute)
	if !errors.Is(err, stopped) {
		t.Errorf("failed wait: %v, want WaitAgent's error", err)
	}
}
