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
	initMntFd   = 5 // joining only: the container init's mount namespace
)

// setupTimeout bounds a container process's set-up step (mounts,
// pivot_root): past it the process is killed.
const setupTimeout = 2 * time.Minute

// containerDirBase holds one directory per container in the guest, where
// its set-up step binds the root before pivot_root.
const containerDirBase = "/run/microvm-agent/containers"

// A container always gets a mount namespace of its own; the network stays
// the VM's, shared by every container (the pod's network). Its PID, UTS
// and IPC namespaces are new unless ContainerRoot.namespaces says
// otherwise (namespaceKinds).
const containerNamespaces = unix.CLONE_NEWNS

// namespaceKind is one of the namespaces a process can enter with setns
// (the mount namespace is entered through the container's root instead,
// see ContainerInit).
type namespaceKind struct {
	name string
	flag int
}

// namespaceKinds are the namespaces a container's PID, UTS and IPC modes
// (ContainerNamespaces) place, in order.
var namespaceKinds = []namespaceKind{{"pid", unix.CLONE_NEWPID}, {"uts", unix.CLONE_NEWUTS}, {"ipc", unix.CLONE_NEWIPC}}

// joinKinds are the namespaces a process joining a container enters, in
// order: those, and its cgroup namespace (the guest's own, unless the
// container has one: ContainerNamespaces.cgroup).
var joinKinds = append(namespaceKinds[:len(namespaceKinds):len(namespaceKinds)], namespaceKind{"cgroup", unix.CLONE_NEWCGROUP})

// nsFile is an open namespace and the kind setns enters it as.
type nsFile struct {
	f    *os.File
	flag int
}

func closeNS(ns []nsFile) {
	for _, n := range ns {
		n.f.Close()
	}
}

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
// namespaces that the agent enters for it (joinKinds), and its mount
// namespace, which the process enters itself (enterContainer).
func (cs *containers) joinFiles(id string) (ns []nsFile, mnt *os.File, err error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	ns, err = cs.namespaces(id, joinKinds)
	if err != nil {
		return nil, nil, err
	}
	mnt, err = os.Open(fmt.Sprintf("/proc/%d/ns/mnt", cs.ids[id].pid))
	if err != nil {
		closeNS(ns)
		return nil, nil, status.Errorf(codes.Internal, "agent: exec: container %q: mount namespace: %v", id, err)
	}
	return ns, mnt, nil
}

// namespaces opens the given namespaces of running container id's init.
// Call it under cs.mu (the init's zombie keeps its pid until drop).
func (cs *containers) namespaces(id string, kinds []namespaceKind) ([]nsFile, error) {
	e := cs.ids[id]
	if !e.running() {
		return nil, status.Errorf(codes.FailedPrecondition, "agent: exec: container %q is not running", id)
	}
	var ns []nsFile
	for _, k := range kinds {
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", e.pid, k.name))
		if err != nil {
			closeNS(ns)
			return nil, status.Errorf(codes.Internal, "agent: exec: container %q: %v", id, err)
		}
		ns = append(ns, nsFile{f, k.flag})
	}
	return ns, nil
}

// createNamespaces turns a new container's ContainerRoot.namespaces into
// clone flags (the mount namespace and the NEW ones) and the namespaces of
// another container to enter first (the JOIN ones); GUEST ones are
// neither. It also says whether the container owns its PID namespace.
func (cs *containers) createNamespaces(id string, n *agentapi.ContainerNamespaces) (flags uintptr, join []nsFile, ownPID bool, err error) {
	flags = containerNamespaces
	var kinds []namespaceKind
	for i, mode := range []agentapi.NamespaceMode{n.GetPid(), n.GetUts(), n.GetIpc()} {
		switch mode {
		case agentapi.NamespaceMode_NAMESPACE_NEW:
			flags |= uintptr(namespaceKinds[i].flag)
		case agentapi.NamespaceMode_NAMESPACE_JOIN:
			kinds = append(kinds, namespaceKinds[i])
		case agentapi.NamespaceMode_NAMESPACE_GUEST:
		default:
			return 0, nil, false, status.Errorf(codes.InvalidArgument, "agent: exec: container %q: %s namespace mode %v", id, namespaceKinds[i].name, mode)
		}
	}
	ownPID = n.GetPid() == agentapi.NamespaceMode_NAMESPACE_NEW
	if len(kinds) == 0 {
		return flags, nil, ownPID, nil
	}
	if err := checkContainerID("exec", n.Of); err != nil {
		return 0, nil, false, err
	}
	if n.Of == id {
		return 0, nil, false, status.Errorf(codes.InvalidArgument, "agent: exec: container %q cannot join its own namespaces", id)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	join, err = cs.namespaces(n.Of, kinds)
	return flags, join, ownPID, err
}

// startIn runs start on a thread that has entered the namespaces ns first
// (setns changes the calling thread only; the PID namespace: for its
// children), or on the caller's thread when there are none. The thread is
// never unlocked, so it exits with its goroutine instead of running other
// goroutines in the container's namespaces.
func startIn(ns []nsFile, start func() (*child, error)) (*child, error) {
	if len(ns) == 0 {
		return start()
	}
	type result struct {
		c   *child
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		for _, n := range ns {
			if err := unix.Setns(int(n.f.Fd()), n.flag); err != nil {
				res <- result{err: fmt.Errorf("setns %s: %w", n.f.Name(), err)}
				return
			}
		}
		c, err := start()
		res <- result{c, err}
	}()
	r := <-res
	return r.c, r.err
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
			removeCgroup(s.cgroupDir(ct.Id), false)
			return nil, err
		}
		flags, join, ownPID, err := s.ctrs.createNamespaces(ct.Id, ct.Create.Namespaces)
		if err != nil {
			s.ctrs.drop(ct.Id, e)
			removeCgroup(s.cgroupDir(ct.Id), false)
			return nil, err
		}
		defer closeNS(join)
		sys.Cloneflags = flags
		cgDir := s.cgroupDir(ct.Id)
		c, err := startIn(join, func() (*child, error) {
			return s.starter.start(self, argv, attr, func(pid int) {
				s.ctrs.drop(ct.Id, e)
				os.RemoveAll(filepath.Join(containerDirBase, ct.Id))
				g.leaderExited(pid)
				// Without a PID namespace of its own, the init's end
				// does not end the container's other processes.
				go removeCgroup(cgDir, !ownPID)
			})
		})
		if err != nil {
			s.ctrs.drop(ct.Id, e)
			removeCgroup(cgDir, false)
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

	ns, mnt, err := s.ctrs.joinFiles(ct.Id)
	if err != nil {
		return nil, err
	}
	defer closeNS(ns)
	defer mnt.Close()
	cg, err := s.containerCgroup(ct.Id, false)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "agent: exec: container %q: %v", ct.Id, err)
	}
	if cg != nil {
		defer cg.Close()
		sys.UseCgroupFD, sys.CgroupFD = true, int(cg.Fd())
	}
	attr.Files = append(attr.Files, mnt.Fd())
	c, err := startIn(ns, func() (*child, error) { return s.starter.start(self, argv, attr, g.leaderExited) })
	if err != nil {
		return nil, startErr(st.Argv[0], err)
	}
	g.started(c.pid)
	readyW.Close()
	waitSetUp(readyR, g)
	return c, nil
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
