package dockervm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/microvm/microvm/guest/agent"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
)

// hostAgent serves a guest agent on this host and returns an agentvm.Runner of it
// whose PATH starts with dir.
func hostAgent(t *testing.T, dir string) agentvm.AgentRunner {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "dockervm") // short: sun_path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := agent.New(agent.Options{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentvm.AgentRunner{Client: agentapi.NewClient(conn), Env: []string{"PATH=" + dir + ":/usr/bin:/bin"}}
}

func agentCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAgentRunner(t *testing.T) {
	needHostTools(t)
	r := hostAgent(t, t.TempDir())
	st, out, err := r.Run(agentCtx(t), []string{"sh", "-c", "echo out; echo err >&2; exit 7"})
	if err != nil || st != 7 || !strings.Contains(out, "out\n") || !strings.Contains(out, "err\n") {
		t.Errorf("status %d, output %q, %v: want 7 and both streams", st, out, err)
	}
	st, _, err = r.Run(agentCtx(t), []string{"sh", "-c", "kill -TERM $$"})
	if err != nil || st != 128+int(syscall.SIGTERM) {
		t.Errorf("killed by SIGTERM: status %d, %v; want %d", st, err, 128+int(syscall.SIGTERM))
	}
	if _, _, err := r.Run(agentCtx(t), []string{"no-such-program-5d1a"}); !errors.Is(err, agentvm.ErrNotInImage) {
		t.Errorf("a missing program: %v, want agentvm.ErrNotInImage", err)
	}
	// The whole of Start's probe through the agent: an image without
	// dockerd is Docker's one-line error, not the agent's.
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		if _, err := os.Stat(filepath.Join(d, "dockerd")); err == nil {
			return
		}
	}
	err = Start(agentCtx(t), r, Options{})
	if de := asError(t, err); !strings.Contains(de.Reason, "the image has no dockerd;") {
		t.Errorf("Start without dockerd: %v", err)
	}
}

// TestAgentKeepsDockerd: the agent kills a command's process group when
// the command exits; the dockerd that startScript started survives it.
func TestAgentKeepsDockerd(t *testing.T) {
	needHostTools(t)
	dir := t.TempDir()
	r := hostAgent(t, dir)
	// Stand-ins for all three: the host's own containerd, where one is
	// installed, must not start (as root, on the host's data root and
	// socket) and outlive the test.
	fakeProgram(t, dir, "dockerd", "exec sleep 60\n")
	fakeProgram(t, dir, "containerd", "touch \"$2\"\nexec sleep 60\n")
	pidf := filepath.Join(dir, "dockerd.pid")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidf + ".containerd"); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	st, out, err := sh(agentCtx(t), r, startScript, pidf, filepath.Join(dir, "dockerd.log"), filepath.Join(dir, "containerd.sock"))
	if err != nil || st != 0 {
		t.Fatalf("start: status %d, %v: %s", st, err, out)
	}
	b, err := os.ReadFile(pidf)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	// A later command through the agent (its exit killed its own group
	// too) still finds dockerd running: alive and not a zombie (its state
	// may be R, S or, while it execs or forks, D).
	if st, out, err := r.Run(agentCtx(t), []string{"sh", "-c", `kill -0 "$1" || exit 1; set -- $(grep "^State:" /proc/"$1"/status); case "$2" in Z | X | "") echo "state: $2"; exit 1;; esac`, "sh", strconv.Itoa(pid)}); err != nil || st != 0 {
		t.Errorf("dockerd (pid %d) gone after the start command: status %d, %v: %s", pid, st, err, out)
	}
}
