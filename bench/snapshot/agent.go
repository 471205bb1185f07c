package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/agentguest"
	"github.com/microvm/microvm/guest/agentapi"
)

// agentConn is a gRPC connection to a guest's agent and the client on it.
type agentConn struct {
	cc     *agentapi.Conn
	client *agentapi.Client
}

// connectAgent waits until m's agent accepts a connection over
// Machine.DialVsock (agentapi.Connect dials again while the guest refuses
// the port) and answers a health check with SERVING: the agent answering.
func connectAgent(ctx context.Context, m *microvm.Machine) (*agentConn, error) {
	cc, err := agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) {
		return m.DialVsock(ctx, agentguest.AgentPort)
	})
	if err != nil {
		return nil, err
	}
	a := &agentConn{cc: cc, client: agentapi.NewClient(cc)}
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil && resp.Status != healthpb.HealthCheckResponse_SERVING {
		err = fmt.Errorf("status %v, want SERVING", resp.Status)
	}
	if err != nil {
		a.close()
		return nil, fmt.Errorf("health: %w", err)
	}
	return a, nil
}

func (a *agentConn) close() { a.cc.Close() }

// reconnectTries bounds connectAgentAgain's tries.
const reconnectTries = 3

// connectAgentAgain is connectAgent for a guest whose vsock transport was
// just reset (a live snapshot): a connection made right after it was seen
// reset by the guest once in the nested-KVM box ("error reading server
// preface: connection reset by peer"), so a failed try is noted in
// retries and made again, up to reconnectTries in all, within ctx.
func connectAgentAgain(ctx context.Context, m *microvm.Machine, retries *[]string) (*agentConn, error) {
	for try := 1; ; try++ {
		a, err := connectAgent(ctx, m)
		if err == nil || try == reconnectTries || ctx.Err() != nil {
			return a, err
		}
		*retries = append(*retries, fmt.Sprintf("try %d of %d: %v", try, reconnectTries, err))
		fmt.Fprintf(os.Stderr, "%s: connecting to the agent again after: %v\n", prog, err)
	}
}

// fillLine is what `yes` repeats to fill guest memory: a line of 4 KiB, so
// that yes and head move pages rather than short lines (under TCG a line
// of 20 bytes filled 1.6 MB/s).
var fillLine = strings.Repeat("snapshot-bench-fill ", 204) + "fill"

// fillTmp writes n bytes that are not zero (zero pages would be holes in
// the snapshot, like memory never touched) to the file name on the guest's
// /tmp, a tmpfs: n bytes of guest memory touched and kept.
func (a *agentConn) fillTmp(ctx context.Context, name string, n int64) error {
	script := "yes " + fillLine + " | head -c " + strconv.FormatInt(n, 10) + " > /tmp/" + name
	var stderr bytes.Buffer
	st, err := a.client.Exec(ctx, &agentapi.Cmd{Argv: []string{"sh", "-c", script},
		Env: []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"}, Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("fill /tmp/%s: %w", name, err)
	}
	if st.Code != 0 || st.Signal != 0 || st.TimedOut {
		return fmt.Errorf("fill /tmp/%s: yes | head -c %d: exit %d, signal %d; stderr %q", name, n, st.Code, st.Signal, stderr.Bytes())
	}
	return nil
}

// usedMemory is the guest's MemTotal - MemFree as its agent reports them.
func (a *agentConn) usedMemory(ctx context.Context) (int64, error) {
	info, err := a.client.Agent.Info(ctx, &agentapi.InfoRequest{})
	if err != nil {
		return 0, fmt.Errorf("agent Info: %w", err)
	}
	return int64(info.MemTotalBytes) - int64(info.MemFreeBytes), nil
}
