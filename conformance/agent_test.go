package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/vsock/hybrid"
)

// The agent's acceptance checks, run against the real Linux
// virtio-vsock driver twice: QEMU TCG with microvm vhost-user-vsock as the
// back-end (TestAgentQEMU, natively everywhere) and microvm run itself
// (TestAgentMicrovm, natively on hardware KVM, otherwise in the nested-KVM
// box). The guest image is what microvm exec boots: the agent as /init,
// busybox, and one 10 MiB file added with --add.

const (
	agentPort     = 1024
	agent2Port    = 1025 // a second agent, started through the first, killed mid-stream
	bigFileSize   = 10 << 20
	bigFileGuest  = "/data/big"
	concurrentRun = 20
)

// agentImage writes the test payload and builds the guest image with
// microvm initramfs, as a user would. It returns the image and the
// payload's path.
func agentImage(t *testing.T, a artefacts, dir string) (img, big string) {
	t.Helper()
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	big = filepath.Join(dir, "big")
	data := make([]byte, bigFileSize)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, data, 0o640); err != nil {
		t.Fatal(err)
	}
	img = filepath.Join(dir, "agent.cpio")
	out, err := exec.Command(a.microvm, "initramfs", "-o", img, "--agent", testenv.Agent(t),
		"--add", big+":"+bigFileGuest).CombinedOutput()
	if err != nil {
		t.Fatalf("microvm initramfs: %v\n%s", err, out)
	}
	return img, big
}

// agentConn is a gRPC connection to the agent on port through uds, once
// the agent answers (the guest is still booting at first).
func agentConn(t *testing.T, v *vm, uds string, port uint32) (*agentapi.Client, *agentapi.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	go func() {
		select {
		case <-v.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	cc, err := agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) { return hybrid.Dial(ctx, uds, port) })
	if err != nil {
		t.Fatalf("agent on port %d: %v", port, err)
	}
	t.Cleanup(func() { cc.Close() })
	return agentapi.NewClient(cc), cc
}

// execOut runs argv through cl and returns its status and output.
func execOut(ctx context.Context, cl *agentapi.Client, cmd *agentapi.Cmd) (*agentapi.ExitStatus, string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	st, err := cl.Exec(ctx, cmd)
	return st, stdout.String(), stderr.String(), err
}

// runCLI runs bin/microvm with args and stdin, bounded by ioTimeout.
func runCLI(t *testing.T, a artefacts, stdin io.Reader, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.microvm, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("microvm %s: no exit within %v", strings.Join(args, " "), ioTimeout)
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("microvm %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// agentChecks runs every agent check against the VM v, whose vsock device's
// host socket is uds, then shuts the guest down through the agent.
func agentChecks(t *testing.T, a artefacts, v *vm, uds, big string) {
	cl, cc := agentConn(t, v, uds, agentPort)
	ctx, cancel := context.WithTimeout(context.Background(), 4*ioTimeout)
	defer cancel()
	udsArgs := []string{"--uds", uds, "--port", strconv.Itoa(agentPort)}

	t.Run("streams and status", func(t *testing.T) {
		status, stdout, stderr := runCLI(t, a, nil, append(append([]string{"agent", "exec"}, udsArgs...),
			"--", "sh", "-c", "echo out; echo err >&2; exit 7")...)
		if status != 7 || stdout != "out\n" || stderr != "err\n" {
			t.Errorf("status %d stdout %q stderr %q; want 7, \"out\\n\", \"err\\n\"", status, stdout, stderr)
		}
	})

	t.Run("10MiB through cat", func(t *testing.T) {
		in, err := os.ReadFile(big)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		status, stdout, stderr := runCLI(t, a, bytes.NewReader(in), append(append([]string{"agent", "exec"}, udsArgs...), "--", "cat")...)
		if status != 0 || sha256.Sum256([]byte(stdout)) != sha256.Sum256(in) {
			t.Errorf("status %d, %d bytes back (want %d, same SHA-256); stderr %q", status, len(stdout), len(in), stderr)
		}
		t.Logf("10 MiB through cat in %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("added file out with agent cp", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "big.out")
		status, _, stderr := runCLI(t, a, nil, append(append([]string{"agent", "cp"}, udsArgs...), "guest:"+bigFileGuest, out)...)
		if status != 0 {
			t.Fatalf("agent cp: status %d: %s", status, stderr)
		}
		sameFile(t, big, out)
	})

	t.Run("put and get 10MiB", func(t *testing.T) {
		in, err := os.ReadFile(big)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := cl.PutFile(ctx, "/tmp/put/big", 0o751, true, bytes.NewReader(in)); err != nil || n != int64(len(in)) {
			t.Fatalf("PutFile: %d bytes, %v", n, err)
		}
		var back bytes.Buffer
		mode, err := cl.GetFile(ctx, "/tmp/put/big", &back)
		if err != nil {
			t.Fatal(err)
		}
		if mode.Perm() != 0o751 || !bytes.Equal(back.Bytes(), in) {
			t.Errorf("got mode %v and %d bytes (same: %v); want 0751 and the file", mode, back.Len(), bytes.Equal(back.Bytes(), in))
		}
	})

	t.Run("20 concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, concurrentRun)
		for i := 0; i < concurrentRun; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				want := fmt.Sprintf("exec %d of %d\n", i, concurrentRun)
				st, stdout, _, err := execOut(ctx, cl, &agentapi.Cmd{Argv: []string{"sh", "-c",
					fmt.Sprintf("sleep 0.2; echo 'exec %d of %d'; exit %d", i, concurrentRun, i)}})
				switch {
				case err != nil:
					errs <- fmt.Errorf("exec %d: %w", i, err)
				case st.GetCode() != int32(i) || stdout != want:
					errs <- fmt.Errorf("exec %d: status %v stdout %q, want %d and %q", i, st, stdout, i, want)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("timeout kills the group", func(t *testing.T) {
		start := time.Now()
		st, _, _, err := execOut(ctx, cl, &agentapi.Cmd{Argv: []string{"sh", "-c", "sleep 4242 & sleep 4242"}, Timeout: time.Second})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetSignal() != 9 || !st.GetTimedOut() {
			t.Errorf("exit %v, want killed by signal 9 for the timeout", st)
		}
		// A second is the guest's clock; the bound leaves room for TCG.
		if took > scaled(10*time.Second) {
			t.Errorf("took %v for a 1 s timeout", took)
		}
		t.Logf("ended after %v", took.Round(time.Millisecond))
		left := sleepers(t, ctx, cl, "sleep 4242")
		if left != 0 {
			t.Errorf("%d sleep 4242 processes left after the timeout", left)
		}
	})

	t.Run("agent killed mid-stream", func(t *testing.T) {
		// A second agent, as a service under the first: the first Exec
		// holds it; its pid goes to a file for the kill.
		go func() {
			_, _, _, _ = execOut(ctx, cl, &agentapi.Cmd{Argv: []string{"sh", "-c",
				fmt.Sprintf("echo $$ > /tmp/agent2.pid; exec /init -listen vsock://:%d", agent2Port)}})
		}()
		agentConn(t, v, uds, agent2Port) // waits until it listens
		cmd := exec.Command(a.microvm, "agent", "exec", "--uds", uds, "--port", strconv.Itoa(agent2Port),
			"--", "sh", "-c", "while :; do echo streaming; done")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan int64, 1)
		first := make(chan struct{})
		go func() {
			buf := make([]byte, 64<<10)
			var n int64
			for {
				k, err := stdout.Read(buf)
				if n == 0 && k > 0 {
					close(first)
				}
				n += int64(k)
				if err != nil {
					done <- n
					return
				}
			}
		}()
		select {
		case <-first:
		case <-time.After(ioTimeout):
			cmd.Process.Kill()
			t.Fatalf("no output from the second agent within %v; stderr %q", ioTimeout, stderr.String())
		}
		st, _, kstderr, err := execOut(ctx, cl, &agentapi.Cmd{Argv: []string{"sh", "-c", "kill -9 $(cat /tmp/agent2.pid)"}})
		if err != nil || st.GetCode() != 0 {
			cmd.Process.Kill()
			t.Fatalf("kill: %v %v %s", st, err, kstderr)
		}
		var n int64
		select {
		case n = <-done:
		case <-time.After(ioTimeout):
			cmd.Process.Kill()
			t.Fatalf("the host side still streams %v after the agent was killed", ioTimeout)
		}
		err = cmd.Wait()
		msg := strings.TrimSpace(stderr.String())
		if cmd.ProcessState.ExitCode() == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, "lost the connection to the agent") {
			t.Errorf("microvm agent exec: %v, stderr %q; want a failure and one line saying the agent was lost", err, msg)
		}
		t.Logf("%d bytes streamed before the kill; the host said: %s", n, msg)
	})

	t.Run("info and health", func(t *testing.T) {
		h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: agentapi.Agent_ServiceDesc.ServiceName})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health: %v %v, want SERVING", h, err)
		}
		info, err := cl.Agent.Info(ctx, &agentapi.InfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if info.GetKernelRelease() == "" || info.GetMemTotalBytes() == 0 || info.GetUptimeMs() == 0 || info.GetNumCpu() == 0 {
			t.Errorf("info %v: want a kernel release, memory, uptime and CPUs", info)
		}
	})

	// Last: the agent powers the guest off, and the VM process ends.
	if _, err := cl.Agent.Shutdown(ctx, &agentapi.ShutdownRequest{}); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	select {
	case <-v.done:
	case <-time.After(exitTimeout):
		t.Fatalf("%s still running %v after the agent's Shutdown", v.name, exitTimeout)
	}
}

// sleepers counts the guest's processes whose command line starts with
// cmdline (the counting shell's own command line starts with "sh").
func sleepers(t *testing.T, ctx context.Context, cl *agentapi.Client, cmdline string) int {
	t.Helper()
	st, out, stderr, err := execOut(ctx, cl, &agentapi.Cmd{Argv: []string{"sh", "-c",
		`for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null; echo; done | grep -c "^` + cmdline + `"; true`}})
	if err != nil || st.GetCode() != 0 {
		t.Fatalf("counting processes: %v %v %s", st, err, stderr)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("counting processes: %q", out)
	}
	return n
}

func sameFile(t *testing.T, want, got string) {
	t.Helper()
	a, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(a) != sha256.Sum256(b) {
		t.Errorf("%s: %d bytes, not the %d bytes of %s", got, len(b), len(a), want)
	}
}

// TestAgentQEMU runs the agent checks in a Linux guest under QEMU TCG, its
// vsock device served by microvm vhost-user-vsock.
func TestAgentQEMU(t *testing.T) {
	a := need(t)
	be := startBackend(t, a)
	img, big := agentImage(t, a, be.dir)
	v := boot(t, be, bootOpts{initrd: img})
	agentChecks(t, a, v, be.uds, big)
	be.waitLog(t, "front-end disconnected", 1)
	be.alive(t)
	be.checkClean(t)
}

// TestAgentMicrovm runs the agent checks in a Linux guest under microvm
// run, on two vCPUs.
func TestAgentMicrovm(t *testing.T) {
	a, _ := needMicrovm(t)
	m := &microvmTarget{art: a, kernel: a.kernel, cfg: microvmConfig{name: "split-2cpus", irqchip: "split", cpus: 2}, dir: shortTempDir(t)}
	var big string
	m.art.initrd, big = agentImage(t, a, m.dir)
	v := m.boot(t, nil)
	agentChecks(t, a, v, m.uds(), big)
	v.waitLog(t, `msg="guest stopped" reason=power-off status=0`, 1)
	v.checkClean(t)
}
