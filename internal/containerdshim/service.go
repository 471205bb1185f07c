package containerdshim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/containerd/runtime"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/microvm/microvm/guest/agentapi"
)

// Service is the shim's task service: containerd's calls for the
// containers of one VM. mu guards vm and containers; it is not held while
// the VM boots or stops, nor across a call into the guest.
type Service struct {
	ctx    context.Context // the shim's: carries containerd's namespace
	cfg    Config
	cfgErr error // a bad configuration fails Create, with its reason
	sd     shutdown.Service
	events chan event // to the publisher goroutine, in order

	mu         sync.Mutex
	vm         *sandbox
	sandboxID  string       // the container whose Create booted vm: the pod's sandbox
	method     RootfsMethod // how the pod's roots reach vm
	booting    bool         // a Create is booting the VM
	containers map[string]*container
}

// event is one containerd event on its way out.
type event struct {
	topic string
	ev    any
}

// NewService returns the task service; it publishes events through pub
// until the shim shuts down.
func NewService(ctx context.Context, cfg Config, cfgErr error, pub shim.Publisher, sd shutdown.Service) *Service {
	s := &Service{ctx: ctx, cfg: cfg, cfgErr: cfgErr, sd: sd,
		events: make(chan event, 128), containers: map[string]*container{}}
	go s.publish(pub)
	sd.RegisterCallback(func(context.Context) error {
		s.stopVM()
		return nil
	})
	return s
}

// RegisterTTRPC serves the task API on server.
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTaskService(server, s)
	return nil
}

// publish is the events goroutine: it owns pub.
func (s *Service) publish(pub shim.Publisher) {
	for e := range s.events {
		if err := pub.Publish(s.ctx, e.topic, e.ev); err != nil {
			log.G(s.ctx).WithError(err).WithField("topic", e.topic).Warn("publish event")
		}
	}
}

func (s *Service) send(topic string, ev any) { s.events <- event{topic, ev} }

// shimPid is the pid containerd sees for every process: the processes
// run in the guest, where host pids mean nothing, and the shim is the
// host process that carries them (as Kata reports).
var shimPid = uint32(os.Getpid())

// Create adds a container to the shim's VM. The first one boots the VM
// with its root file system as the guest's root (the CRI pod sandbox, or
// ctr's one container); later ones (the pod's containers, grouped into
// this shim by Manager.Start) have their root file system copied into the
// running guest. Each runs in its own namespaces in the guest (agent
// containers: docs/agent.md).
func (s *Service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, err error) {
	if s.cfgErr != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("%w: microvm shim configuration: %w", errdefs.ErrFailedPrecondition, s.cfgErr))
	}
	if r.Checkpoint != "" || r.ParentCheckpoint != "" {
		return nil, errdefs.ToGRPCf(errdefs.ErrNotImplemented, "restore from a checkpoint")
	}
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := checkSpec(spec); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	st, err := execStart(spec.Process)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if st.Seccomp, err = seccompFilter(spec, log.G(s.ctx).WithField("id", r.ID)); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.mu.Lock()
	vm, sandboxID, method := s.vm, s.sandboxID, s.method
	switch {
	case s.booting:
		s.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrUnavailable, "container %s: the VM is still booting for the pod's first container", r.ID)
	case s.containers[r.ID] != nil:
		s.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "container %s", r.ID)
	case vm == nil:
		s.booting = true
	}
	s.mu.Unlock()
	first := vm == nil
	pod := sandboxID
	if first {
		pod = r.ID
		defer func() {
			s.mu.Lock()
			s.booting = false
			s.mu.Unlock()
		}()
		if method, err = podRootfsMethod(s.cfg.Rootfs, spec); err != nil {
			return nil, errdefs.ToGRPC(err)
		}
	}

	var phases createPhases
	t0 := time.Now()
	rfs, err := mountRootfs(r.Bundle, r.Rootfs)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	defer func() {
		if err != nil {
			rfs.cleanup()
		}
	}()
	phases.mark(&phases.mount, &t0)
	guestRoot := "/"
	if first {
		rootImage := ""
		if method == RootfsExt4 {
			if err := rfs.writeExt4(ctx); err != nil {
				return nil, errdefs.ToGRPC(err)
			}
			rootImage = rfs.ext4
			phases.mark(&phases.ext4, &t0)
		}
		var share string // not :=, which would hide err from the deferred vm.stop
		if share, err = makeShareDir(r.ID); err != nil {
			return nil, errdefs.ToGRPC(err)
		}
		vm, err = bootSandbox(ctx, s.cfg, r.Bundle, rootImage, share, podNetNS(spec), log.G(s.ctx).WithField("id", r.ID))
		if err != nil {
			_ = removeShareDir(r.ID)
			return nil, errdefs.ToGRPC(err)
		}
		defer func() {
			if err != nil {
				vm.stop()
			}
		}()
		phases.mark(&phases.boot, &t0)
	}
	// From here an error unbinds what this container bound in the pod's
	// shared directory: its root (Rootfs9p) and its volumes.
	defer func() {
		if err != nil {
			_ = unbindVolumes(r.ID)
		}
	}()
	switch {
	case method == Rootfs9p:
		if guestRoot, err = rfs.share(pod, r.ID); err != nil {
			return nil, errdefs.ToGRPC(err)
		}
		phases.mark(&phases.copy, &t0)
	case !first:
		guestRoot = guestDir(r.ID) + "/rootfs"
		if err := putTree(ctx, vm.files, rfs.src, guestRoot); err != nil {
			return nil, errdefs.ToGRPC(fmt.Errorf("rootfs: %w", err))
		}
		phases.mark(&phases.copy, &t0)
	}
	binds, err := bindVolumes(pod, r.ID, spec)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := copyBinds(ctx, vm.files, r.ID, spec, binds); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	phases.mark(&phases.volumes, &t0)
	phases.log(log.G(s.ctx).WithField("id", r.ID))
	root := containerRoot(spec, guestRoot, binds)
	if root.Namespaces, err = containerNamespaces(spec, sandboxID); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	st.Container = &agentapi.Container{Id: r.ID, Create: root}
	c := &container{id: r.ID, bundle: r.Bundle, rootfs: rfs, seccomp: st.Seccomp,
		init:  newProcess("", stdio{r.Stdin, r.Stdout, r.Stderr, r.Terminal}, st),
		execs: map[string]*process{}}
	s.mu.Lock()
	if first {
		s.vm, s.sandboxID, s.method = vm, r.ID, method
	}
	s.containers[r.ID] = c
	s.mu.Unlock()
	if first {
		go s.watchVM(vm)
	}
	s.send(runtime.TaskCreateEventTopic, &eventstypes.TaskCreate{
		ContainerID: r.ID, Bundle: r.Bundle, Rootfs: r.Rootfs,
		IO:  &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Pid: shimPid,
	})
	return &taskAPI.CreateTaskResponse{Pid: shimPid}, nil
}

// watchVM fails every process when the VM ends under them.
func (s *Service) watchVM(vm *sandbox) {
	<-vm.done
	s.mu.Lock()
	var ps []*process
	for _, c := range s.containers {
		ps = append(ps, c.all()...)
	}
	s.mu.Unlock()
	warned := false
	for _, p := range ps {
		if st, _, _ := p.status(); st == running && !warned {
			// Once, with the guest console's end: a guest that panicked or
			// reset says why there, and the bundle holding the console
			// log goes with the container.
			log.G(s.ctx).Warnf("the VM ended (%s) while a process ran; console:\n%s", vm.why(), vm.consoleTail())
			warned = true
		}
		p.end()
	}
}

// lookup finds a container's process.
func (s *Service) lookup(id, execID string) (*container, *process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[id]
	if c == nil {
		return nil, nil, errdefs.ToGRPCf(errdefs.ErrNotFound, "container %q", id)
	}
	p, err := c.process(execID)
	if err != nil {
		return nil, nil, errdefs.ToGRPC(err)
	}
	return c, p, nil
}

// Start starts the init process or an exec in the guest.
func (s *Service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	c, p, err := s.lookup(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	vm := s.vm
	s.mu.Unlock()
	if vm == nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "the VM is gone")
	}
	if err := p.run(ctx, vm.client, func(p *process) { s.exited(c, p) }); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if r.ExecID == "" {
		s.send(runtime.TaskStartEventTopic, &eventstypes.TaskStart{ContainerID: c.id, Pid: shimPid})
	} else {
		s.send(runtime.TaskExecStartedEventTopic, &eventstypes.TaskExecStarted{ContainerID: c.id, ExecID: r.ExecID, Pid: shimPid})
	}
	return &taskAPI.StartResponse{Pid: shimPid}, nil
}

// exited publishes a process's exit.
func (s *Service) exited(c *container, p *process) {
	_, code, at := p.status()
	id := p.execID
	if id == "" {
		id = c.id
	}
	s.send(runtime.TaskExitEventTopic, &eventstypes.TaskExit{
		ContainerID: c.id, ID: id, Pid: shimPid, ExitStatus: code, ExitedAt: protobuf.ToTimestamp(at)})
}

// Delete removes a stopped exec, or the container once its init process
// stopped: its root file system is released, and with the pod's last
// container the VM is powered off.
func (s *Service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.lookup(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st, code, at := p.status()
	if st == running {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process %q of container %q is running", r.ExecID, r.ID)
	}
	if st == created {
		p.exit(0)
		_, code, at = p.status()
	}
	resp := &taskAPI.DeleteResponse{Pid: shimPid, ExitStatus: code, ExitedAt: protobuf.ToTimestamp(at)}
	if r.ExecID != "" {
		s.mu.Lock()
		delete(c.execs, r.ExecID)
		s.mu.Unlock()
		return resp, nil
	}
	s.mu.Lock()
	execs := c.all()[1:]
	s.mu.Unlock()
	for _, e := range execs {
		e.end()
	}
	s.mu.Lock()
	delete(s.containers, r.ID)
	last := len(s.containers) == 0
	pod := s.sandboxID
	s.mu.Unlock()
	if last {
		s.stopVM() // the pod's last container: the VM goes
	}
	// The binds in the pod's shared directory (the root under Rootfs9p,
	// the volumes) go before the snapshot they may show.
	if err := unbindVolumes(c.id); err != nil {
		log.G(ctx).WithError(err).Warn("delete")
	}
	if err := c.rootfs.cleanup(); err != nil {
		log.G(ctx).WithError(err).Warn("delete")
	}
	if last {
		if err := removeShareDir(pod); err != nil {
			log.G(ctx).WithError(err).Warn("delete")
		}
	}
	s.send(runtime.TaskDeleteEventTopic, &eventstypes.TaskDelete{
		ContainerID: c.id, ID: c.id, Pid: shimPid, ExitStatus: code, ExitedAt: resp.ExitedAt})
	return resp, nil
}

// stopVM powers the VM off, once.
func (s *Service) stopVM() {
	s.mu.Lock()
	vm := s.vm
	s.vm = nil
	s.mu.Unlock()
	if vm != nil {
		vm.stop()
	}
}

// Exec adds a process to a running container.
func (s *Service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*emptypb.Empty, error) {
	if r.Spec == nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "exec %q: no process spec", r.ExecID)
	}
	var ps specs.Process
	if err := json.Unmarshal(r.Spec.Value, &ps); err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "exec %q: process spec: %v", r.ExecID, err)
	}
	st, err := execStart(&ps)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	st.Container = &agentapi.Container{Id: r.ID}
	s.mu.Lock()
	c := s.containers[r.ID]
	switch {
	case c == nil:
		err = errdefs.ToGRPCf(errdefs.ErrNotFound, "container %q", r.ID)
	case r.ExecID == "" || c.execs[r.ExecID] != nil:
		err = errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "exec %q of container %q", r.ExecID, r.ID)
	default:
		st.Seccomp = c.seccomp // an exec runs under its container's profile, as under runc
		c.execs[r.ExecID] = newProcess(r.ExecID, stdio{r.Stdin, r.Stdout, r.Stderr, r.Terminal}, st)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	s.send(runtime.TaskExecAddedEventTopic, &eventstypes.TaskExecAdded{ContainerID: r.ID, ExecID: r.ExecID})
	return &emptypb.Empty{}, nil
}

// State reports a process's state.
func (s *Service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.lookup(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st, code, at := p.status()
	resp := &taskAPI.StateResponse{
		ID: r.ID, ExecID: r.ExecID, Bundle: c.bundle, Pid: shimPid,
		Stdin: p.io.stdin, Stdout: p.io.stdout, Stderr: p.io.stderr, Terminal: p.io.terminal,
	}
	switch st {
	case created:
		resp.Status = task.Status_CREATED
	case running:
		resp.Status = task.Status_RUNNING
		s.mu.Lock()
		if s.vm != nil && s.vm.m.Paused() {
			resp.Status = task.Status_PAUSED
		}
		s.mu.Unlock()
	case stopped:
		resp.Status = task.Status_STOPPED
		resp.ExitStatus, resp.ExitedAt = code, protobuf.ToTimestamp(at)
	}
	return resp, nil
}

// Kill signals a process, or with All every process of the container.
func (s *Service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	c, p, err := s.lookup(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	targets := []*process{p}
	if r.All {
		s.mu.Lock()
		targets = c.all()
		s.mu.Unlock()
	}
	for _, t := range targets {
		before, _, _ := t.status()
		err := t.signal(r.Signal)
		if err != nil && t == p && !r.All {
			return nil, errdefs.ToGRPC(err)
		}
		if err == nil && before == created {
			s.exited(c, t) // it never ran: its exit is reported here
		}
	}
	return &emptypb.Empty{}, nil
}

// Wait blocks until the process stopped.
func (s *Service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.lookup(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, errdefs.ToGRPC(ctx.Err())
	}
	_, code, at := p.status()
	return &taskAPI.WaitResponse{ExitStatus: code, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// Pids lists the container's processes: all carried by the shim.
func (s *Service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	if _, _, err := s.lookup(r.ID, ""); err != nil {
		return nil, err
	}
	return &taskAPI.PidsResponse{Processes: []*task.ProcessInfo{{Pid: shimPid}}}, nil
}

// Pause stops the VM's vCPUs (every container of the VM).
func (s *Service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*emptypb.Empty, error) {
	vm, err := s.vmOf(r.ID)
	if err != nil {
		return nil, err
	}
	if err := vm.m.Pause(ctx); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.send(runtime.TaskPausedEventTopic, &eventstypes.TaskPaused{ContainerID: r.ID})
	return &emptypb.Empty{}, nil
}

// Resume lets a paused VM run again.
func (s *Service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*emptypb.Empty, error) {
	vm, err := s.vmOf(r.ID)
	if err != nil {
		return nil, err
	}
	if err := vm.m.Resume(); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.send(runtime.TaskResumedEventTopic, &eventstypes.TaskResumed{ContainerID: r.ID})
	return &emptypb.Empty{}, nil
}

func (s *Service) vmOf(id string) (*sandbox, error) {
	if _, _, err := s.lookup(id, ""); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm == nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "the VM is gone")
	}
	return s.vm, nil
}

// ResizePty resizes a process's terminal.
func (s *Service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*emptypb.Empty, error) {
	_, p, err := s.lookup(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if err := p.resize(r.Width, r.Height); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &emptypb.Empty{}, nil
}

// CloseIO closes a process's standard input.
func (s *Service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*emptypb.Empty, error) {
	_, p, err := s.lookup(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Stdin {
		p.closeStdin()
	}
	return &emptypb.Empty{}, nil
}

// Checkpoint is not supported (docs/containerd.md).
func (s *Service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	return nil, errdefs.ToGRPCf(errdefs.ErrNotImplemented, "checkpoint")
}

// Connect tells containerd the shim's pid.
func (s *Service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	return &taskAPI.ConnectResponse{ShimPid: shimPid, TaskPid: shimPid}, nil
}

// Shutdown ends the shim once it carries no container.
func (s *Service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	n := len(s.containers)
	s.mu.Unlock()
	if n > 0 {
		return &emptypb.Empty{}, nil
	}
	s.sd.Shutdown()
	return &emptypb.Empty{}, nil
}
