package agentvm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// scriptedAgent is an agent whose Exec ends each command as its argv[0]
// says (see ends), and keeps the last command's start.
type scriptedAgent struct {
	agentapi.UnimplementedAgentServer
	mu   sync.Mutex
	last *agentapi.ExecStart
}

// ends are scriptedAgent's commands: an exit status, or the error the
// agent answers with.
var ends = map[string]struct {
	st  *agentapi.ExitStatus
	err error
}{
	"true":    {st: &agentapi.ExitStatus{}},
	"exit3":   {st: &agentapi.ExitStatus{Code: 3}},
	"termed":  {st: &agentapi.ExitStatus{Code: -1, Signal: 15}},
	"slow":    {st: &agentapi.ExitStatus{Code: -1, Signal: 9, TimedOut: true}},
	"missing": {err: status.Error(codes.NotFound, "agent: exec: missing: not found")},
	"noexec":  {err: status.Error(codes.PermissionDenied, "agent: exec: noexec: permission denied")},
	"nodir":   {err: status.Error(codes.FailedPrecondition, "agent: exec: working directory: /nope: no such file or directory")},
	"busy":    {err: status.Error(codes.ResourceExhausted, "agent: exec: 64 processes already running")},
	"lost":    {err: status.Error(codes.Unavailable, "the agent went away")},
}

func (a *scriptedAgent) Exec(s grpc.BidiStreamingServer[agentapi.ExecRequest, agentapi.ExecResponse]) error {
	req, err := s.Recv()
	if err != nil {
		return err
	}
	start := req.GetStart()
	a.mu.Lock()
	a.last = start
	a.mu.Unlock()
	end, ok := ends[start.GetArgv()[0]]
	if !ok {
		return status.Error(codes.Internal, "no such script")
	}
	if end.err != nil {
		return end.err
	}
	return s.Send(&agentapi.ExecResponse{Msg: &agentapi.ExecResponse_Exit{Exit: end.st}})
}

// startScripted serves a scriptedAgent on a Unix socket and returns a
// connection to it.
func startScripted(t *testing.T) (*scriptedAgent, *agentapi.Conn) {
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
	a := &scriptedAgent{}
	srv := grpc.NewServer()
	agentapi.RegisterAgentServer(srv, a)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return a, cc
}

// TestRunCommandStatuses: a command's end as a shell tells it, with one
// note on stderr where the guest could not run it or killed it at its
// timeout, and the agent's failures as a *CommandError naming the command.
func TestRunCommandStatuses(t *testing.T) {
	_, cc := startScripted(t)
	for _, tc := range []struct {
		prog   string
		status int
		note   string // the line on stderr, "" for none
		err    string // the error's message, "" for none
		lost   bool   // the error is agentapi.ErrAgentLost
	}{
		{prog: "true"},
		{prog: "exit3", status: 3},
		{prog: "termed", status: 128 + 15},
		{prog: "slow", status: 128 + 9, note: "microvm: exec: slow: killed after --timeout 1s\n"},
		{prog: "missing", status: 127, note: "microvm: exec: missing: not found in the guest\n"},
		{prog: "noexec", status: 126, note: "microvm: exec: noexec: cannot run it: the agent: exec: noexec: permission denied\n"},
		{prog: "nodir", status: 126, note: "microvm: exec: nodir: cannot run it: the agent: exec: working directory: /nope: no such file or directory\n"},
		{prog: "busy", err: "exec: busy: the agent: exec: 64 processes already running"},
		{prog: "lost", err: "exec: lost: lost the connection to the agent (did the agent or its VM stop?): the agent went away", lost: true},
	} {
		var stderr strings.Builder
		n, err := RunCommand(context.Background(), cc, Command{
			Cmd:  agentapi.Cmd{Argv: []string{tc.prog}, Timeout: time.Second, Stderr: &stderr},
			Name: "exec",
		})
		if n != tc.status || stderr.String() != tc.note {
			t.Errorf("%s: status %d, stderr %q; want %d, %q", tc.prog, n, stderr.String(), tc.status, tc.note)
		}
		if tc.err == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.prog, err)
			}
			continue
		}
		var ce *CommandError
		if !errors.As(err, &ce) || err.Error() != tc.err || errors.Is(err, agentapi.ErrAgentLost) != tc.lost {
			t.Errorf("%s: error %#v (%v); want a CommandError %q, lost %v", tc.prog, err, err, tc.err, tc.lost)
		}
	}
}

// TestRunCommandInterrupted: the caller's signal status wins over
// whatever the call returned, and its note is not written.
func TestRunCommandInterrupted(t *testing.T) {
	_, cc := startScripted(t)
	stopped := errors.New("stopped by a signal")
	for _, prog := range []string{"exit3", "missing", "busy"} {
		var stderr strings.Builder
		n, err := RunCommand(context.Background(), cc, Command{
			Cmd:         agentapi.Cmd{Argv: []string{prog}, Stderr: &stderr},
			Name:        "exec",
			Interrupted: func(context.Context) error { return stopped },
		})
		if n != 0 || err != stopped || stderr.Len() != 0 {
			t.Errorf("%s: %d, %v, stderr %q; want 0, the caller's error, nothing", prog, n, err, stderr.String())
		}
	}
}

// TestRunCommandTTY: with OpenTTY the command gets a pty of the terminal's
// size and a TERM (the host's, else xterm) unless its environment has
// one; the terminal is restored once the command ended; OpenTTY's error
// is returned before anything runs.
func TestRunCommandTTY(t *testing.T) {
	a, cc := startScripted(t)
	for _, tc := range []struct {
		env  []string
		term string
		want []string
	}{
		{env: []string{"A=1"}, term: "screen", want: []string{"A=1", "TERM=screen"}},
		{env: []string{"A=1"}, want: []string{"A=1", "TERM=xterm"}},
		{env: []string{"TERM=vt100"}, term: "screen", want: []string{"TERM=vt100"}},
	} {
		restored := 0
		env := append(make([]string, 0, 8), tc.env...)
		n, err := RunCommand(context.Background(), cc, Command{
			Cmd:  agentapi.Cmd{Argv: []string{"true"}, Env: env},
			Name: "exec",
			OpenTTY: func() (TTY, error) {
				return TTY{Size: &agentapi.PtySize{Rows: 30, Cols: 100}, Term: tc.term, Restore: func() { restored++ }}, nil
			},
		})
		if n != 0 || err != nil || restored != 1 {
			t.Errorf("%v: %d, %v, restored %d times; want 0, nil, once", tc.env, n, err, restored)
		}
		a.mu.Lock()
		got, pty := a.last.GetEnv(), a.last.GetPty()
		a.mu.Unlock()
		if strings.Join(got, " ") != strings.Join(tc.want, " ") || pty.GetRows() != 30 || pty.GetCols() != 100 {
			t.Errorf("%v, TERM %q: the agent got env %q, pty %v; want %q, 30x100", tc.env, tc.term, got, pty, tc.want)
		}
		if strings.Join(env[:len(tc.env)], " ") != strings.Join(tc.env, " ") || strings.Join(env[:cap(env)][len(tc.env):], "") != "" {
			t.Errorf("%v: the caller's environment array was written: %q", tc.env, env[:cap(env)])
		}
	}
	noTerminal := errors.New("-t: stdin is not a terminal")
	n, err := RunCommand(context.Background(), cc, Command{
		Cmd:     agentapi.Cmd{Argv: []string{"exit3"}},
		Name:    "exec",
		OpenTTY: func() (TTY, error) { return TTY{}, noTerminal },
	})
	if n != 0 || err != noTerminal {
		t.Errorf("OpenTTY failed: %d, %v; want 0, its error", n, err)
	}
}

// TestExecDialFails: Exec's failed dial is the dial's error after the
// command's name, or the caller's signal status when it has one; nothing
// runs.
func TestExecDialFails(t *testing.T) {
	a := Addr{UDS: filepath.Join(t.TempDir(), "nosuch.sock"), Port: Port, Timeout: time.Second}
	n, err := Exec(context.Background(), a, Command{Cmd: agentapi.Cmd{Argv: []string{"true"}}, Name: "agent exec",
		Interrupted: func(context.Context) error { return nil }})
	if n != 0 || err == nil || !strings.HasPrefix(err.Error(), "agent exec: --uds ") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no socket: %d, %v; want the dial's error after the name", n, err)
	}
	stopped := errors.New("stopped by a signal")
	n, err = Exec(context.Background(), a, Command{Cmd: agentapi.Cmd{Argv: []string{"true"}}, Name: "agent exec",
		Interrupted: func(context.Context) error { return stopped }})
	if n != 0 || err != stopped {
		t.Errorf("interrupted: %d, %v; want the caller's error", n, err)
	}
}
