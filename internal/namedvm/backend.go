package namedvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/vmctl"
	"github.com/microvm/microvm/internal/vms"
)

// The labels a named VM's snapshot carries (microvm.SnapshotOptions.Labels),
// for restore --name: whether its guest runs the agent, and on which port.
const (
	LabelAgent     = "microvm.agent"
	LabelAgentPort = "microvm.agent-port"
)

// errStopRequested is the run's cancel cause for a stop through the API.
var errStopRequested = errors.New("stopped through the control API")

// backend is a named VM behind its control API. Its methods are called
// from the API server's goroutines and from Run's: they only read
// counters, pause and resume, or cancel the run's context, all safe from
// any goroutine.
type backend struct {
	m       *microvm.Machine
	lease   *vms.Lease
	cancel  context.CancelCauseFunc
	started time.Time
	log     logrus.FieldLogger

	mu       sync.Mutex // guards stopping
	stopping bool
}

var _ vmctl.Backend = (*backend)(nil)

func (b *backend) stopRequested() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopping
}

func (b *backend) setStopping(v bool) {
	b.mu.Lock()
	b.stopping = v
	b.mu.Unlock()
}

// Info implements vmctl.Backend.
func (b *backend) Info() vmctl.VMInfo {
	rec := b.lease.Record()
	state := vms.StateRunning
	switch {
	case b.stopRequested():
		state = vms.StateStopping
	case b.m.Paused():
		state = vms.StatePaused
	}
	mt := b.m.Metrics()
	info := vmctl.VMInfo{Name: rec.Name, State: state, PID: os.Getpid(), CPUs: rec.CPUs, MemoryBytes: rec.MemoryBytes,
		Kernel: rec.Kernel, Initrd: rec.Initrd, Agent: rec.Agent, Created: rec.Created,
		UptimeSeconds: time.Since(b.started).Seconds()}
	for _, v := range mt.VCPUs {
		var n uint64
		for _, c := range v.Exits {
			n += c
		}
		info.Counters.VCPUs = append(info.Counters.VCPUs, vmctl.VCPUCounters{ID: v.ID, Exits: n, CPUSeconds: v.CPUTime.Seconds()})
	}
	if v := mt.Vsock; v != nil {
		info.Counters.VsockTxBytes, info.Counters.VsockRxBytes, info.Counters.VsockConnections = v.TxBytes, v.RxBytes, v.ConnsOpen
	}
	return info
}

// WriteMetrics implements vmctl.Backend.
func (b *backend) WriteMetrics(w io.Writer) error { return b.m.Metrics().WritePrometheus(w) }

// SetState implements vmctl.Backend.
func (b *backend) SetState(ctx context.Context, req vmctl.StateRequest) error {
	if b.stopRequested() && req.State != vmctl.Stopped {
		return fmt.Errorf("the VM is stopping: %w", vmctl.ErrConflict)
	}
	switch req.State {
	case vmctl.Paused:
		if err := b.m.Pause(ctx); err != nil {
			return conflictIfNotRunning(err)
		}
		_ = b.lease.Update(func(r *vms.Record) { r.State = vms.StatePaused })
	case vmctl.Running:
		if err := b.m.Resume(); err != nil {
			return conflictIfNotRunning(err)
		}
		_ = b.lease.Update(func(r *vms.Record) { r.State = vms.StateRunning })
	case vmctl.Stopped:
		b.setStopping(true)
		_ = b.lease.Update(func(r *vms.Record) { r.State = vms.StateStopping })
		timeout := time.Duration(req.TimeoutMS) * time.Millisecond
		if req.Force || !b.lease.Record().Agent || timeout == 0 {
			b.cancel(errStopRequested)
			return nil
		}
		// A paused guest cannot power itself off.
		_ = b.m.Resume()
		go b.shutdownThroughAgent(timeout)
	}
	return nil
}

// Snapshot implements vmctl.Backend. The machine pauses for the save and
// goes on after it, unless req.Stop: then the VM ends as it does when
// stopped through the API.
func (b *backend) Snapshot(ctx context.Context, req vmctl.SnapshotRequest) error {
	if b.stopRequested() {
		return fmt.Errorf("the VM is stopping: %w", vmctl.ErrConflict)
	}
	if req.Stop {
		b.setStopping(true)
	}
	rec := b.lease.Record()
	labels := map[string]string{LabelAgent: strconv.FormatBool(rec.Agent)}
	if rec.Agent {
		labels[LabelAgentPort] = strconv.FormatUint(uint64(rec.AgentPort), 10)
	}
	err := b.m.Snapshot(ctx, req.Path, microvm.SnapshotOptions{Stop: req.Stop, Overwrite: req.Overwrite, Diff: req.Diff, Labels: labels})
	switch {
	case err != nil && req.Stop:
		b.setStopping(false)
	case err == nil && req.Stop:
		_ = b.lease.Update(func(r *vms.Record) { r.State = vms.StateStopping })
	}
	if err != nil {
		b.log.WithError(err).Warn("snapshot failed")
		return conflictIfNotRunning(err)
	}
	b.log.WithField("path", req.Path).Info("snapshot written")
	return nil
}

func conflictIfNotRunning(err error) error {
	if errors.Is(err, microvm.ErrNotRunning) {
		return fmt.Errorf("%w: %w", err, vmctl.ErrConflict)
	}
	return err
}

// shutdownThroughAgent asks the guest's agent to power the guest off, and
// stops the VM itself if the guest has not ended within timeout.
func (b *backend) shutdownThroughAgent(timeout time.Duration) {
	t := time.AfterFunc(timeout, func() { b.cancel(errStopRequested) })
	_ = t // fires, or the VM ended first and the cancel is harmless
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cc, err := agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) { return b.m.DialVsock(ctx, agentvm.Port) })
	if err != nil {
		b.log.WithError(err).Warn("stop: the agent did not answer; the VM is stopped after the timeout")
		return
	}
	defer cc.Close()
	if _, err := agentapi.NewAgentClient(cc).Shutdown(ctx, &agentapi.ShutdownRequest{}); err != nil {
		b.log.WithError(err).Warn("stop: the agent refused to power the guest off; the VM is stopped after the timeout")
	}
}

// mainEnd is how an image VM's main process ended: its status (128+N
// for signal N), or why it could not be run.
type mainEnd struct {
	status int
	err    error
	// failed: the main process could not be run (or the agent was lost
	// while the VM was not being stopped), and the VM was stopped for it.
	failed bool
}

// runMain runs an image VM's main process through the agent once it
// answers, its output on the console (and the terminal, in the
// foreground), stdin from in, then, when it ended 0 and the VM is not
// being stopped, after (Launch.AfterMain) through the same agent, and
// then powers the guest off, as a container ends with its main process.
func (b *backend) runMain(ctx context.Context, p Process, after func(context.Context, *agentapi.Client) error,
	timeout time.Duration, vmDone <-chan struct{},
	in io.Reader, console io.Writer) mainEnd {
	fail := func(err error) mainEnd {
		if ctx.Err() != nil || b.stopRequested() {
			return mainEnd{err: err} // the VM is ending anyway: not the cause
		}
		b.cancel(fmt.Errorf("main process %s: %w", p.Argv[0], err))
		return mainEnd{err: err, failed: true}
	}
	cc, err := agentvm.Wait(ctx, b.m, timeout, vmDone)
	if err != nil {
		return fail(err)
	}
	defer cc.Close()
	st, err := agentapi.NewClient(cc).Exec(ctx, &agentapi.Cmd{Argv: p.Argv, Env: p.Env, Dir: p.Workdir, UID: p.UID, GID: p.GID,
		Stdin: in, Stdout: console, Stderr: console})
	if err != nil {
		return fail(errors.New(agentvm.Message(err)))
	}
	status := agentvm.ShellStatus(st)
	if status == 0 && after != nil && ctx.Err() == nil && !b.stopRequested() {
		if err := after(ctx, agentapi.NewClient(cc)); err != nil {
			b.log.Warn(err)
		}
	}
	b.setStopping(true)
	go b.shutdownThroughAgent(10 * time.Second)
	return mainEnd{status: status}
}

// waitAgent waits until the VM's agent answers, the boot timeout passes or
// the VM ends; a restored clone's agent then takes the clone's MACs.
func (b *backend) waitAgent(ctx context.Context, timeout time.Duration, vmDone <-chan struct{}) error {
	cc, err := agentvm.Wait(ctx, b.m, timeout, vmDone)
	if err != nil {
		return err
	}
	err = agentapi.AdoptMACs(ctx, b.m, cc)
	if cerr := cc.Close(); err == nil {
		err = cerr
	}
	return err
}
