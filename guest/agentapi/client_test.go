package agentapi

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// liar is an agent that ends every command with the status it is given,
// as a guest that took over its agent could.
type liar struct {
	UnimplementedAgentServer
	st *ExitStatus
}

func (l liar) Exec(s grpc.BidiStreamingServer[ExecRequest, ExecResponse]) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	return s.Send(&ExecResponse{Msg: &ExecResponse_Exit{Exit: l.st}})
}

// TestExecRefusesImpossibleStatus: an exit status no process can have
// (agent.proto: code 0..255 and no signal, or -1 and a signal) is a
// protocol error, not a status the caller would pass on (256 would read as
// success once truncated to a byte).
func TestExecRefusesImpossibleStatus(t *testing.T) {
	for _, tc := range []struct {
		st *ExitStatus
		ok bool
	}{
		{&ExitStatus{Code: 3}, true},
		{&ExitStatus{Code: 255}, true},
		{&ExitStatus{Code: -1, Signal: 9, TimedOut: true}, true},
		{&ExitStatus{Code: 256}, false},
		{&ExitStatus{Code: -1}, false},
		{&ExitStatus{Code: -1, Signal: 65}, false},
		{&ExitStatus{Code: -1, Signal: -9}, false},
		{&ExitStatus{Code: 3, Signal: 9}, false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cc := serveFakeAgent(ctx, t, liar{st: tc.st})
		st, err := NewClient(cc).Exec(ctx, &Cmd{Argv: []string{"true"}})
		switch {
		case tc.ok && err != nil:
			t.Errorf("%+v: %v", tc.st, err)
		case !tc.ok && !errors.Is(err, ErrProtocol):
			t.Errorf("%+v: status %+v, error %v; want ErrProtocol", tc.st, st, err)
		}
	}
}

// serveFakeAgent serves impl as the agent on a Unix socket of its own
// until the test ends, and returns a connection to it.
func serveFakeAgent(ctx context.Context, t *testing.T, impl AgentServer) *Conn {
	t.Helper()
	sock := serveUnix(t, func(srv *grpc.Server) { RegisterAgentServer(srv, impl) })
	cc, err := Connect(ctx, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
