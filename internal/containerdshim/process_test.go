package containerdshim

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/guest/agent"
	"github.com/microvm/microvm/guest/agentapi"
)

// hostAgent serves the real guest agent on this host over a Unix socket,
// as the VM's agent would over vsock, and returns a client of it.
func hostAgent(t *testing.T) agentapi.AgentClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := agent.New(agent.Options{})
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
	return agentapi.NewAgentClient(cc)
}

// fifos makes containerd's stdio FIFOs and opens their far ends as ctr
// does: readers of stdout and stderr (collected until EOF), a writer of
// stdin when in is not nil.
type fifos struct {
	io       stdio
	out, err chan string
}

func newFifos(t *testing.T, in *string) *fifos {
	t.Helper()
	d := t.TempDir()
	f := &fifos{io: stdio{stdout: filepath.Join(d, "out"), stderr: filepath.Join(d, "err")},
		out: make(chan string, 1), err: make(chan string, 1)}
	if in != nil {
		f.io.stdin = filepath.Join(d, "in")
	}
	for _, p := range []string{f.io.stdin, f.io.stdout, f.io.stderr} {
		if p != "" {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	collect := func(path string, to chan string) {
		r, err := os.OpenFile(path, os.O_RDONLY, 0)
		if err != nil {
			to <- "open: " + err.Error()
			return
		}
		b, _ := io.ReadAll(r)
		r.Close()
		to <- string(b)
	}
	go collect(f.io.stdout, f.out)
	go collect(f.io.stderr, f.err)
	if in != nil {
		go func() {
			w, err := os.OpenFile(f.io.stdin, os.O_WRONLY, 0)
			if err != nil {
				return
			}
			io.WriteString(w, *in)
			w.Close()
		}()
	}
	return f
}

// runProcess starts argv and waits for its end; exits counts onExit calls.
func runProcess(t *testing.T, client agentapi.AgentClient, f *fifos, during func(*process), argv ...string) (p *process, exits int) {
	t.Helper()
	p = newProcess("", f.io, &agentapi.ExecStart{Argv: argv})
	exited := make(chan struct{}, 2)
	if err := p.run(context.Background(), client, func(*process) { exited <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during(p)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("process did not end")
	}
	<-exited
	return p, 1 + len(exited)
}

func TestProcessOutputAndStatus(t *testing.T) {
	client := hostAgent(t)
	f := newFifos(t, nil)
	p, exits := runProcess(t, client, f, nil, "sh", "-c", "echo out; echo err >&2; exit 3")
	if st, code, at := p.status(); st != stopped || code != 3 || at.IsZero() {
		t.Errorf("status %v %d %v, want stopped 3", st, code, at)
	}
	if out, errOut := <-f.out, <-f.err; out != "out\n" || errOut != "err\n" {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
	if exits != 1 {
		t.Errorf("onExit ran %d times", exits)
	}
	if err := p.signal(9); err == nil {
		t.Error("signal to a finished process: no error")
	}
}

func TestProcessStdin(t *testing.T) {
	client := hostAgent(t)
	in := "line one\nline two\n"
	f := newFifos(t, &in)
	p, _ := runProcess(t, client, f, nil, "cat")
	if _, code, _ := p.status(); code != 0 {
		t.Errorf("cat: status %d", code)
	}
	if out := <-f.out; out != in {
		t.Errorf("cat: stdout %q, want %q", out, in)
	}
}

func TestProcessNotFound(t *testing.T) {
	client := hostAgent(t)
	f := newFifos(t, nil)
	p, _ := runProcess(t, client, f, nil, "/no/such/binary")
	if _, code, _ := p.status(); code != 127 {
		t.Errorf("missing binary: status %d, want 127", code)
	}
	if errOut := <-f.err; !strings.Contains(errOut, "/no/such/binary") {
		t.Errorf("stderr %q does not name the binary", errOut)
	}
}

func TestProcessSignal(t *testing.T) {
	client := hostAgent(t)
	f := newFifos(t, nil)
	p, _ := runProcess(t, client, f, func(p *process) {
		if err := p.signal(uint32(syscall.SIGTERM)); err != nil {
			t.Error(err)
		}
	}, "sleep", "60")
	if _, code, _ := p.status(); code != 128+uint32(syscall.SIGTERM) {
		t.Errorf("SIGTERM: status %d, want %d", code, 128+syscall.SIGTERM)
	}
}

// A VM that goes away under a running process: its stream ends and the
// process counts as killed.
func TestProcessEnd(t *testing.T) {
	client := hostAgent(t)
	f := newFifos(t, nil)
	p, _ := runProcess(t, client, f, func(p *process) { p.end() }, "sleep", "60")
	if _, code, _ := p.status(); code != 137 {
		t.Errorf("ended stream: status %d, want 137", code)
	}
}

// A process killed before it started never reaches the guest.
func TestProcessKillCreated(t *testing.T) {
	p := newProcess("e1", stdio{}, &agentapi.ExecStart{Argv: []string{"true"}})
	if err := p.signal(9); err != nil {
		t.Fatal(err)
	}
	if st, code, _ := p.status(); st != stopped || code != 137 {
		t.Errorf("status %v %d, want stopped 137", st, code)
	}
	if err := p.run(context.Background(), nil, func(*process) {}); err == nil {
		t.Error("run after kill: no error")
	}
}
