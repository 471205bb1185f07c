package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/microvm/microvm/guest/agentapi"
)

// ContainerInitArg0 is the argv[0] under which the agent's own binary runs
// as a container process's set-up step: a program embedding the agent
// must call ContainerInit first thing in main when os.Args[0] is this.
const ContainerInitArg0 = "microvm-container-init"

// Files a container's set-up step finds open, after stdin, stdout, stderr.
const (
	initSpecFd  = 3 // a memfd holding the marshalled ExecStart
	initReadyFd = 4 // a pipe's write end, closed by the execve of the program
	initRootFd  = 5 // joining only: an O_PATH descriptor of the container's root
)

// setupTimeout bounds a container process's set-up step (mounts,
// pivot_root): past it the process is killed.
const setupTimeout = 2 * time.Minute

// containerDirBase holds one directory per container in the guest, where
// its set-up step binds the root before pivot_root.
const containerDirBase = "/run/microvm-agent/containers"

// The namespaces a container gets of its own; the network stays the
// VM's, shared by every container (the pod's network).
const containerNamespaces = unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC

// joinNamespaces are the namespaces a joining process enters with setns
// (mount: through its root instead, see ContainerInit).
var joinNamespaces = []struct {
	name string
	flag int
}{{"pid", unix.CLONE_NEWPID}, {"uts", unix.CLONE_NEWUTS}, {"ipc", unix.CLONE_NEWIPC}}

// containerEntry is one running container: its init's pid once started.
type containerEntry struct {
	pid   int  // guarded by containers.mu; 0 until the init has started
	ready bool // guarded by containers.mu: the init's set-up is done
	gone  bool // guarded by containers.mu: the init has exited
}

// running says whether processes may join the container (or read its
// cgroup): its init has started, set it up and not exited. Call it under
// containers.mu; a nil e is no container.
func (e *containerEntry) running() bool {
	return e != nil && e.pid != 0 && e.ready && !e.gone
}

// containers is the agent's registry of running containers. Lock order:
// Reaper.mu, then containers.mu (dropped from the init's beforeReap, while
// its zombie keeps the pid from being reused, so a joiner that finds the
// pid under mu opens the right process's namespaces).
type containers struct {
	mu  sync.Mutex
	ids map[string]*containerEntry // guarded by mu
}

// reserve registers id for a container about to start.
func (cs *containers) reserve(id string) (*containerEntry, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.ids == nil {
		cs.ids = make(map[string]*containerEntry)
	}
	if _, ok := cs.ids[id]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "agent: exec: container %q already exists", id)
	}
	e := &containerEntry{}
	cs.ids[id] = e
	return e, nil
}

// started records the init's pid, unless it has already exited.
func (cs *containers) started(e *containerEntry, pid int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if !e.gone {
		e.pid = pid
	}
}

// setUp records that the init's set-up is done: processes may join.
func (cs *containers) setUp(e *containerEntry) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e.ready = true
}

// checkRunning is the status for a call (op) on container id: nil when
// it runs, INVALID_ARGUMENT for a malformed id, NOT_FOUND otherwise.
func (cs *containers) checkRunning(op, id string) error {
	if err := checkContainerID(op, id); err != nil {
		return err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if !cs.ids[id].running() {
		return status.Errorf(codes.NotFound, "agent: %s: container %q is not running", op, id)
	}
	return nil
}

// drop forgets the container whose init is e.
func (cs *containers) drop(id string, e *containerEntry) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e.gone = true
	if cs.ids[id] == e {
		delete(cs.ids, id)
	}
}

// joinFiles opens what a process joining container id needs: its init's
// namespaces (joinNamespaces order) and root.
func (cs *containers) joinFiles(id string) (ns []*os.File, root *os.File, err error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e := cs.ids[id]
	if !e.running() {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "agent: exec: container %q is not running", id)
	}
	proc := fmt.Sprintf("/proc/%d", e.pid)
	for _, n := range joinNamespaces {
		f, err := os.Open(filepath.Join(proc, "ns", n.name))
		if err != nil {
			closeAll(ns)
			return nil, nil, status.Errorf(codes.Internal, "agent: exec: container %q: %v", id, err)
		}
		ns = append(ns, f)
	}
	fd, err := unix.Open(filepath.Join(proc, "root"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		closeAll(ns)
		return nil, nil, status.Errorf(codes.Internal, "agent: exec: container %q: root: %v", id, err)
	}
	return ns, os.NewFile(uintptr(fd), "container-root"), nil
}

// checkContainerID accepts 1 to 128 of [A-Za-z0-9_.-], not "." or ".."
// (the id names a directory); otherwise it is INVALID_ARGUMENT for op.
func checkContainerID(op, id string) error {
	bad := id == "" || len(id) > 128 || id == "." || id == ".."
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		bad = bad || !ok
	}
	if bad {
		return status.Errorf(codes.InvalidArgument, "agent: %s: container id %.40q: want 1 to 128 of [A-Za-z0-9_.-]", op, id)
	}
	return nil
}

// specFile returns a memfd holding st, for the set-up step to read.
func specFile(st *agentapi.ExecStart) (*os.File, error) {
	b, err := proto.Marshal(st)
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("microvm-exec", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "microvm-exec")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// startInContainer starts a container process: the agent's binary as
// ContainerInitArg0 with the spec on initSpecFd, which sets the container
// up (creating: in new namespaces; joining: in the init's namespaces,
// entered on a locked thread that is thrown away afterwards) and then
// execs the program. Its pid is the program's.
func (s *Server) startInContainer(st *agentapi.ExecStart, x *execIO, g *group, sys *syscall.SysProcAttr) (*child, error) {
	ct := st.Container
	if err := checkContainerID("exec", ct.Id); err != nil {
		return nil, err
	}
	if r := ct.Create; r != nil && !filepath.IsAbs(r.Root) {
		return nil, status.Errorf(codes.InvalidArgument, "agent: exec: container %q: root %q is not absolute", ct.Id, r.Root)
	}
	spec, err := specFile(st)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "agent: exec: %v", err)
	}
	defer spec.Close()
	attr := &syscall.ProcAttr{Dir: "/", Sys: sys}
	for _, f := range x.child {
		attr.Files = append(attr.Files, f.Fd())
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "agent: exec: %v", err)
	}
	defer readyR.Close()
	defer readyW.Close()
	attr.Files = append(attr.Files, spec.Fd(), readyW.Fd())
	argv := []string{ContainerInitArg0}
	self := s.opts.Self
	if self == "" {
		self = "/proc/self/exe"
	}

	if ct.Create != nil {
		e, err := s.ctrs.reserve(ct.Id)
		if err != nil {
			return nil, err
		}
		cg, err := s.containerCgroup(ct.Id, true)
		if err != nil {
			s.ctrs.drop(ct.Id, e)
			return nil, status.Errorf(codes.Internal, "agent: exec: container %q: %v", ct.Id, err)
		}
		if cg != nil {
			defer cg.Close()
			sys.UseCgroupFD, sys.CgroupFD = true, int(cg.Fd())
		}
		if err := s.setResources(ct.Id, ct.Create.Resources); err != nil {
			s.ctrs.drop(ct.Id, e)
			removeCgroup(s.cgroupDir(ct.Id))
			return nil, err
		}
		sys.Cloneflags = containerNamespaces
		cgDir := s.cgroupDir(ct.Id)
		c, err := s.starter.start(self, argv, attr, func(pid int) {
			s.ctrs.drop(ct.Id, e)
			os.RemoveAll(filepath.Join(containerDirBase, ct.Id))
			g.leaderExited(pid)
			go removeCgroup(cgDir)
		})
		if err != nil {
			s.ctrs.drop(ct.Id, e)
			removeCgroup(cgDir)
			if errors.Is(err, unix.EINVAL) {
				return nil, status.Errorf(codes.FailedPrecondition,
					"agent: exec: container %q: new namespaces refused (%v): does the guest kernel have CONFIG_PID_NS, UTS_NS and IPC_NS?", ct.Id, err)
			}
			return nil, startErr(st.Argv[0], err)
		}
		s.ctrs.started(e, c.pid)
		g.started(c.pid)
		readyW.Close()
		waitSetUp(readyR, g)
		s.ctrs.setUp(e)
		return c, nil
	}

	ns, root, err := s.ctrs.joinFiles(ct.Id)
	if err != nil {
		return nil, err
	}
	defer closeAll(ns)
	defer root.Close()
	cg, err := s.containerCgroup(ct.Id, false)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "agent: exec: container %q: %v", ct.Id, err)
	}
	if cg != nil {
		defer cg.Close()
		sys.UseCgroupFD, sys.CgroupFD = true, int(cg.Fd())
	}
	attr.Files = append(attr.Files, root.Fd())
	type result struct {
		c   *child
		err error
	}
	res := make(chan result, 1)
	go func() {
		// setns changes this thread only (the PID namespace: for its
		// children); it is never unlocked, so the thread exits with this
		// goroutine instead of running other goroutines in the container.
		runtime.LockOSThread()
		for i, f := range ns {
			if err := unix.Setns(int(f.Fd()), joinNamespaces[i].flag); err != nil {
				res <- result{err: fmt.Errorf("setns %s: %w", joinNamespaces[i].name, err)}
				return
			}
		}
		c, err := s.starter.start(self, argv, attr, g.leaderExited)
		res <- result{c, err}
	}()
	r := <-res
	if r.err != nil {
		return nil, startErr(st.Argv[0], r.err)
	}
	g.started(r.c.pid)
	readyW.Close()
	waitSetUp(readyR, g)
	return r.c, nil
}

// waitSetUp waits until the set-up step has executed the program or
// exited (either closes the ready pipe), killing it after setupTimeout.
func waitSetUp(ready *os.File, g *group) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(io.Discard, ready)
	}()
	select {
	case <-done:
	case <-time.After(setupTimeout):
		g.signal(unix.SIGKILL)
		<-done
	}
}
