package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/microvm/microvm/guest/agent"
	"github.com/microvm/microvm/guest/agentapi"
)

// cmdEnv is the environment of every command the benchmark runs, in the
// guest and on the host alike: argv[0] is looked up in this PATH, which
// finds busybox's applet links in the guest image and the host's own
// /bin/true and head.
var cmdEnv = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root"}

// agentConn is a gRPC connection to an agent and the client on it. The
// same code talks to the guest (dial is Machine.DialVsock) and to the
// host reference (dial connects to a Unix socket), so the two differ only
// in the transport under gRPC.
type agentConn struct {
	cc     *agentapi.Conn
	client *agentapi.Client
}

// connectAgent waits for the agent to accept through dial
// (agentapi.Connect) and returns the connection.
func connectAgent(ctx context.Context, dial agentapi.DialFunc) (*agentConn, error) {
	cc, err := agentapi.Connect(ctx, dial)
	if err != nil {
		return nil, err
	}
	return &agentConn{cc: cc, client: agentapi.NewClient(cc)}, nil
}

func (a *agentConn) close() { a.cc.Close() }

// health makes one call to the standard health service and wants SERVING.
func (a *agentConn) health(ctx context.Context) error {
	resp, err := healthpb.NewHealthClient(a.cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health: status %v, want SERVING", resp.Status)
	}
	return nil
}

// checkExit turns a non-zero exit into an error naming the command.
func checkExit(argv0 string, st *agentapi.ExitStatus, stderr []byte) error {
	switch {
	case st.TimedOut:
		return fmt.Errorf("%s: killed by the agent's timeout", argv0)
	case st.Signal != 0:
		return fmt.Errorf("%s: killed by signal %d; stderr %q", argv0, st.Signal, stderr)
	case st.Code != 0:
		return fmt.Errorf("%s: exit status %d; stderr %q", argv0, st.Code, stderr)
	}
	return nil
}

// execTrue runs warmup untimed and then n timed Exec calls of `true`, one
// after the other, and returns the latency of each timed call in ms: from
// just before Client.Exec to its return with the exit status, so one
// gRPC stream, fork and exec, the process's exit and the exit message.
// It stops at the first call that fails (a broken connection would fail
// every later one too) and returns that error with what it has.
func execTrue(ctx context.Context, c *agentapi.Client, warmup, n int, timeout time.Duration) ([]float64, error) {
	var lat []float64
	for i := range warmup + n {
		var stderr bytes.Buffer
		cctx, cancel := context.WithTimeout(ctx, timeout)
		start := time.Now()
		st, err := c.Exec(cctx, &agentapi.Cmd{Argv: []string{"true"}, Env: cmdEnv, Stderr: &stderr})
		d := time.Since(start)
		cancel()
		if err == nil {
			err = checkExit("true", st, stderr.Bytes())
		}
		if err != nil {
			what := fmt.Sprintf("call %d of %d", i-warmup+1, n)
			if i < warmup {
				what = fmt.Sprintf("warm-up call %d", i+1)
			}
			return lat, fmt.Errorf("%s: %w", what, err)
		}
		if i >= warmup {
			lat = append(lat, ms(d))
		}
	}
	return lat, nil
}

// counter is an io.Writer that counts what it is given and keeps none of
// it.
// counter counts what is written to it (atomically: a failed Exec may
// return while its output copier still runs).
type counter struct{ n atomic.Int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}

// streamCmd is the command that writes n bytes to stdout.
func streamCmd(n int64) []string {
	return []string{"head", "-c", strconv.FormatInt(n, 10), "/dev/zero"}
}

// stream runs `head -c n /dev/zero` through the agent reps times and
// returns each run's throughput in MB/s (10^6 bytes a second): n over the
// time from just before Client.Exec to its return, which includes starting
// head (about one execTrue latency). A run counts only if head exited 0 and
// exactly n bytes arrived on stdout; the first failure stops the runs.
func stream(ctx context.Context, c *agentapi.Client, n int64, reps int, timeout time.Duration) ([]float64, error) {
	argv := streamCmd(n)
	var rates []float64
	for i := range reps {
		var out counter
		var stderr bytes.Buffer
		cctx, cancel := context.WithTimeout(ctx, timeout)
		start := time.Now()
		st, err := c.Exec(cctx, &agentapi.Cmd{Argv: argv, Env: cmdEnv, Stdout: &out, Stderr: &stderr})
		d := time.Since(start)
		cancel()
		if err == nil {
			err = checkExit(argv[0], st, stderr.Bytes())
		}
		if err == nil && out.n.Load() != n {
			err = fmt.Errorf("%d bytes on stdout, want %d", out.n.Load(), n)
		}
		if err != nil {
			return rates, fmt.Errorf("run %d of %d (%d of %d bytes came): %w", i+1, reps, out.n.Load(), n, err)
		}
		rates = append(rates, float64(n)/d.Seconds()/1e6)
	}
	return rates, nil
}

// hostAgent is the reference: the agent's own code (package guest/agent)
// serving on a Unix socket on this host, with the same client as the guest.
type hostAgent struct {
	srv    *agent.Server
	served chan error // Serve's result
	conn   *agentConn
}

// startHostAgent serves a fresh agent on a socket in dir and connects to it.
func startHostAgent(ctx context.Context, dir string) (*hostAgent, error) {
	path := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("host agent: %w", err)
	}
	h := &hostAgent{srv: agent.New(agent.Options{}), served: make(chan error, 1)}
	go func() { h.served <- h.srv.Serve(ln) }()
	h.conn, err = connectAgent(ctx, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	})
	if err == nil {
		err = h.conn.health(ctx)
	}
	if err != nil {
		h.close()
		return nil, fmt.Errorf("host agent: %w", err)
	}
	return h, nil
}

// close stops the server (ending any call left) and waits for Serve.
func (h *hostAgent) close() error {
	if h.conn != nil {
		h.conn.close()
	}
	h.srv.Stop()
	err := <-h.served
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
