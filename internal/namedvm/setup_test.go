package namedvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestSetupFailure: a setup that has not ended, or that ended well or
// only because the VM was ending anyway, is no failure; one whose Setup
// failed is a SetupError with the setup's status that still unwraps to
// the cause; one whose wait for the agent failed is a FailedError with
// the failure status.
func TestSetupFailure(t *testing.T) {
	cause := errors.New("dockerd exited")
	pending := &setupRun{done: make(chan struct{})}
	if st, err := pending.failure("v", 122, 125); st != 0 || err != nil {
		t.Errorf("pending: %d, %v; want 0, nil", st, err)
	}
	ended := func(e setupEnd) *setupRun {
		s := &setupRun{done: make(chan struct{})}
		s.run(func() setupEnd { return e }, func(error) {})
		return s
	}
	for _, e := range []setupEnd{{}, {err: cause}} {
		if st, err := ended(e).failure("v", 122, 125); st != 0 || err != nil {
			t.Errorf("%+v: %d, %v; want 0, nil", e, st, err)
		}
	}
	st, err := ended(setupEnd{err: cause, failed: true, inSetup: true}).failure("v", 122, 125)
	var se SetupError
	if st != 122 || !errors.As(err, &se) || se.Status != 122 || !errors.Is(err, cause) || err.Error() != "VM v: dockerd exited" {
		t.Errorf("setup failed: %d, %#v", st, err)
	}
	st, err = ended(setupEnd{err: cause, failed: true}).failure("v", 122, 125)
	var fe FailedError
	if st != 125 || !errors.As(err, &fe) || errors.As(err, &se) || !strings.Contains(err.Error(), "microvm logs v") {
		t.Errorf("agent wait failed: %d, %#v", st, err)
	}
}

// TestSetupRunCancels: a failed setup stops the VM with its error, once
// its end can be read; one that did not fail stops nothing.
func TestSetupRunCancels(t *testing.T) {
	cause := errors.New("no dockerd")
	for _, e := range []setupEnd{{}, {err: cause}, {err: cause, failed: true, inSetup: true}} {
		s := &setupRun{done: make(chan struct{})}
		var got error
		s.run(func() setupEnd { return e }, func(err error) {
			select {
			case <-s.done:
			default:
				t.Error("cancelled before done was closed")
			}
			got = err
		})
		want := error(nil)
		if e.failed {
			want = cause
		}
		if got != want {
			t.Errorf("%+v: cancelled with %v, want %v", e, got, want)
		}
	}
}

// TestSetupStepStatus: a launch whose setup runs the caches' mounts and
// then Docker's start ends with the status of the step that failed: a
// cache that does not mount is the caches' status (the generic failure),
// not Docker's, whatever the launch's SetupStatus; Docker failing alone
// keeps its status; the ready line of a detached start carries each.
func TestSetupStepStatus(t *testing.T) {
	dockerErr := &dockervm.Error{Reason: "dockerd exited before it answered", Log: "  level=fatal"}
	docker := func(context.Context, *agentapi.Client) error { return dockerErr }
	mountErr := errors.New("run: cache go: mounting it at /root/go failed (status 32): mount: bad superblock")
	for _, tc := range []struct {
		name  string
		mount error
		want  int
		cause error
	}{
		{"cache fails", mountErr, 125, mountErr},
		{"docker fails", nil, dockervm.ExitStatus, dockerErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setup := withStep(func(context.Context, *agentapi.Client) error { return tc.mount }, 125, docker)
			err := setup(context.Background(), nil)
			checkSetupStatus(t, err, dockervm.ExitStatus, tc.want, tc.cause)
		})
	}
	// A plain error of a launch's own setup is its SetupStatus.
	plain := errors.New("no dockerd")
	if got := stepStatus(plain, 122); got != 122 {
		t.Errorf("stepStatus(plain) = %d, want 122", got)
	}
	if got := stepStatus(fmt.Errorf("wrapped: %w", SetupError{Status: 125, Err: plain}), 122); got != 125 {
		t.Errorf("stepStatus(a wrapped SetupError 125) = %d, want 125", got)
	}
	if err := withStep(func(context.Context, *agentapi.Client) error { return nil }, 125, nil)(context.Background(), nil); err != nil {
		t.Errorf("a step that passes and no next: %v", err)
	}
}

// checkSetupStatus checks that err, a launch's Setup's error, ends the VM
// "v" (whose SetupStatus is setupStatus) with status want, as Run's
// SetupError and as the ready line a detached start reads back.
func checkSetupStatus(t *testing.T, err error, setupStatus, want int, cause error) {
	t.Helper()
	s := &setupRun{done: make(chan struct{})}
	s.run(func() setupEnd { return setupEnd{err: err, failed: true, inSetup: true} }, func(error) {})
	st, rerr := s.failure("v", setupStatus, 125)
	var se SetupError
	if st != want || !errors.As(rerr, &se) || se.Status != want || (cause != nil && !errors.Is(rerr, cause)) {
		t.Fatalf("failure = %d, %#v; want %d and a SetupError with it", st, rerr, want)
	}
	var de *dockervm.Error
	if isDocker := errors.As(rerr, &de); isDocker != (want == dockervm.ExitStatus) {
		t.Errorf("failure %v: a Docker error %v with status %d", rerr, isDocker, want)
	}
	line := ReadyError(rerr)
	if prefix := fmt.Sprintf("error %d: VM v: ", want); !strings.HasPrefix(line, prefix) {
		t.Errorf("ready line %q, want it to start %q", line, prefix)
	}
	said, perr := parseReadyLine(strings.TrimSpace(line))
	if !said || !errors.As(perr, &se) || se.Status != want {
		t.Errorf("ready line read back: %v, %#v; want a SetupError with %d", said, perr, want)
	}
}

// TestBootSetupStatus: run --name --docker --cache's own launch, against
// an agent that fails every command: the cache's mount fails first and
// the VM ends with the caller's failure status and the mount's message,
// not with Docker's 122 (which launch-runner reads as "Docker did not come
// up"); with Docker and no cache, Docker's start fails with 122.
func TestBootSetupStatus(t *testing.T) {
	testenv.NeedMkfs(t)
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	client := failingAgent(t)
	req := dockerCacheRequest(t)
	l, caches, err := prepareBoot(req, 125)
	if err != nil {
		t.Fatal(err)
	}
	defer caches.Finish(false)
	err = l.Setup(context.Background(), client)
	checkSetupStatus(t, err, l.SetupStatus, 125, nil)
	if !strings.Contains(err.Error(), "cache go: mounting it at /root/go failed (status 3)") {
		t.Errorf("the cache's failure says %q", err)
	}

	req.Caches = nil
	l, _, err = prepareBoot(req, 125)
	if err != nil {
		t.Fatal(err)
	}
	err = l.Setup(context.Background(), client)
	checkSetupStatus(t, err, l.SetupStatus, dockervm.ExitStatus, nil)
}

// failingAgent is a client of an agent (recordingAgent) that ends every
// command with status 3.
func failingAgent(t *testing.T) *agentapi.Client {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentapi.RegisterAgentServer(srv, &recordingAgent{})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("unix://"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return agentapi.NewClient(cc)
}
