package namedvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/vms"
)

func u32(n uint32) *uint32 { return &n }

// TestWithDefaults: a command line's own environment, directory and user
// win over an image's; the image's fill in the rest, HOME following its
// user; a VM without an image gives the base environment and /.
func TestWithDefaults(t *testing.T) {
	img := &vms.Process{Env: []string{"PATH=/img/bin", "FOO=img"}, WorkingDir: "/data", HasUser: true, UID: 1000, GID: 100}
	root := &vms.Process{Env: []string{"PATH=/img/bin"}, HasUser: true}
	for _, tc := range []struct {
		name     string
		d        *vms.Process
		in, want agentapi.Cmd
	}{
		{"no image", nil,
			agentapi.Cmd{},
			agentapi.Cmd{Env: []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root"}, Dir: "/"}},
		{"no image, own env and dir", nil,
			agentapi.Cmd{Env: []string{"HOME=/h", "X=1"}, Dir: "/tmp", UID: u32(5), GID: u32(6)},
			agentapi.Cmd{Env: []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root", "HOME=/h", "X=1"}, Dir: "/tmp", UID: u32(5), GID: u32(6)}},
		{"image", img,
			agentapi.Cmd{},
			agentapi.Cmd{Env: []string{"PATH=/img/bin", "FOO=img", "HOME=/"}, Dir: "/data", UID: u32(1000), GID: u32(100)}},
		{"image, own env, dir and user", img,
			agentapi.Cmd{Env: []string{"FOO=mine", "HOME=/h"}, Dir: "/tmp", UID: u32(0), GID: u32(0)},
			agentapi.Cmd{Env: []string{"PATH=/img/bin", "FOO=mine", "HOME=/h"}, Dir: "/tmp", UID: u32(0), GID: u32(0)}},
		{"image of root", root,
			agentapi.Cmd{},
			agentapi.Cmd{Env: []string{"PATH=/img/bin", "HOME=/root"}, UID: u32(0), GID: u32(0)}},
		{"image without a user", &vms.Process{},
			agentapi.Cmd{},
			agentapi.Cmd{Env: []string{"HOME=/root"}}},
	} {
		got := tc.in
		WithDefaults(&got, tc.d)
		if g, w := describe(got), describe(tc.want); g != w {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, g, w)
		}
	}
	if img.Env[1] != "FOO=img" || len(img.Env) != 2 {
		t.Errorf("the image's defaults were written: %q", img.Env)
	}
}

// describe is the fields of cmd that WithDefaults sets, for comparing.
func describe(cmd agentapi.Cmd) string {
	id := func(p *uint32) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("env %q dir %q uid %s gid %s", cmd.Env, cmd.Dir, id(cmd.UID), id(cmd.GID))
}

// recordingAgent is an agent that ends every command with exit status 3
// and keeps the start of the last one.
type recordingAgent struct {
	agentapi.UnimplementedAgentServer
	mu   sync.Mutex
	last *agentapi.ExecStart
}

func (a *recordingAgent) Exec(s grpc.BidiStreamingServer[agentapi.ExecRequest, agentapi.ExecResponse]) error {
	req, err := s.Recv()
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.last = req.GetStart()
	a.mu.Unlock()
	return s.Send(&agentapi.ExecResponse{Msg: &agentapi.ExecResponse_Exit{Exit: &agentapi.ExitStatus{Code: 3}}})
}

// hybridListener answers each connection's "CONNECT PORT" line as a VMM's
// hybrid-vsock socket does, then hands it to the agent's server.
type hybridListener struct{ net.Listener }

func (l hybridListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var line []byte
		var b [1]byte
		for len(line) < 64 && (len(line) == 0 || line[len(line)-1] != '\n') {
			if _, err := c.Read(b[:]); err != nil {
				break
			}
			line = append(line, b[0])
		}
		if strings.HasPrefix(string(line), "CONNECT ") {
			if _, err := c.Write([]byte("OK 1\n")); err == nil {
				return c, nil
			}
		}
		c.Close()
	}
}

// TestExec: Exec refuses a VM that does not run or runs no agent, reaches
// a running one's agent through its vsock socket with the image's
// defaults applied to the command, and returns the command's status; a
// signal that cancelled the dial is the caller's error.
func TestExec(t *testing.T) {
	store := testStore(t)
	create := func(rec vms.Record) {
		l, err := store.Create(rec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Release() })
	}
	cmd := agentvm.Command{Cmd: agentapi.Cmd{Argv: []string{"sh"}, Env: []string{"FOO=mine"}}, Name: "exec"}

	if n, err := Exec(context.Background(), ExecOptions{VM: "nope", Command: cmd}); n != 0 || err == nil || !strings.HasPrefix(err.Error(), "exec: ") {
		t.Errorf("an unknown VM: %d, %v; want an error", n, err)
	}
	create(vms.Record{Name: "plain"})
	if n, err := Exec(context.Background(), ExecOptions{VM: "plain", Command: cmd}); n != 0 || err == nil ||
		err.Error() != "exec: VM plain runs no agent (start it with --with-agent)" {
		t.Errorf("a VM without an agent: %d, %v", n, err)
	}

	create(vms.Record{Name: "img", Agent: true, AgentPort: agentvm.Port,
		Process: &vms.Process{Env: []string{"PATH=/img/bin"}, WorkingDir: "/data", HasUser: true, UID: 1000, GID: 1000}})
	ln, err := net.Listen("unix", filepath.Join(store.Dir("img"), vms.VsockSocket))
	if err != nil {
		t.Fatal(err)
	}
	agent := &recordingAgent{}
	srv := grpc.NewServer()
	agentapi.RegisterAgentServer(srv, agent)
	go srv.Serve(hybridListener{ln})
	t.Cleanup(srv.Stop)
	if n, err := Exec(context.Background(), ExecOptions{VM: "img", Command: cmd}); n != 3 || err != nil {
		t.Errorf("a command in an image VM: %d, %v; want 3, nil", n, err)
	}
	agent.mu.Lock()
	st := agent.last
	agent.mu.Unlock()
	if got := fmt.Sprintf("%q %s %d:%d", st.GetEnv(), st.GetDir(), st.GetUid(), st.GetGid()); got != `["PATH=/img/bin" "FOO=mine" "HOME=/"] /data 1000:1000` {
		t.Errorf("the agent got %s; want the image's defaults under the command line's own", got)
	}
	if len(cmd.Cmd.Env) != 1 || cmd.Cmd.Dir != "" || cmd.Cmd.UID != nil {
		t.Errorf("the caller's command was written: %+v", cmd.Cmd)
	}

	create(vms.Record{Name: "gone", Agent: true, AgentPort: agentvm.Port}) // no socket: the dial fails
	if n, err := Exec(context.Background(), ExecOptions{VM: "gone", Command: cmd}); n != 0 || err == nil || !strings.HasPrefix(err.Error(), "exec: VM gone: ") {
		t.Errorf("an agent that cannot be reached: %d, %v", n, err)
	}
	stopped := errors.New("stopped by a signal")
	cmd.Interrupted = func(context.Context) error { return stopped }
	if n, err := Exec(context.Background(), ExecOptions{VM: "gone", Command: cmd}); n != 0 || err != stopped {
		t.Errorf("a dial a signal cancelled: %d, %v; want the caller's error", n, err)
	}
}
