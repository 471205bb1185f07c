package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// Limits on an ExecStart.
const (
	// MaxEnvBytes bounds the environment: the sum of len(entry)+1.
	MaxEnvBytes = 1 << 20
	// MaxArgvBytes bounds the arguments: the sum of len(arg)+1.
	MaxArgvBytes = 1 << 20
	// DefaultPath is the PATH a process gets when its env has none.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// drainTimeout bounds how long output is still read after the process
	// exited and its group was killed: only processes that left the group
	// (setsid) can hold the pipes open that long.
	drainTimeout = time.Second
)

// group is the process group of one Exec; its id is the leader's pid.
type group struct {
	mu   sync.Mutex
	pgid int  // guarded by mu: 0 until the leader has started
	gone bool // guarded by mu: the leader has been reaped, pgid may be reused
}

// started records the leader's pid; the leader may already have exited.
func (g *group) started(pid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pgid = pid
}

// signal sends sig to every process of the group, unless the leader has
// been reaped.
func (g *group) signal(sig unix.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.gone && g.pgid > 0 {
		unix.Kill(-g.pgid, sig) // ESRCH: nobody left
	}
}

// leaderExited runs while the exited leader pid is a zombie, which keeps
// the group id reserved: whatever is left of the group is killed, and later
// signals are dropped. It may run before started.
func (g *group) leaderExited(pid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	unix.Kill(-pid, unix.SIGKILL)
	g.gone = true
}

// execIO holds the agent's ends of the process's standard streams.
type execIO struct {
	stdin   *os.File   // the process reads what is written here
	outputs []*os.File // stdout then stderr; one file (the pty master) with a pty
	pty     *os.File   // the pty master, or nil
	child   []*os.File // the process's ends, closed once it has started

	stdinOnce sync.Once
	closeOnce sync.Once
}

// closeStdin ends the process's input: the pipe is closed, and a terminal
// gets its EOF character (^D, VEOF by default) instead.
func (x *execIO) closeStdin() {
	x.stdinOnce.Do(func() {
		if x.pty != nil {
			x.pty.Write([]byte{4})
			return
		}
		x.stdin.Close()
	})
}

// close closes the agent's ends, waking any goroutine blocked on them.
func (x *execIO) close() {
	x.closeOnce.Do(func() {
		x.stdin.Close()
		for _, f := range x.outputs {
			f.Close()
		}
	})
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// pipe returns a pipe whose end for the agent is non-blocking (run by the
// Go poller, so Close wakes a blocked Read or Write) and whose end for the
// process is blocking.
func pipe(agentReads bool) (agent, proc *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("agent: pipe: %w", err)
	}
	a, c := p[1], p[0]
	if agentReads {
		a, c = p[0], p[1]
	}
	if err := unix.SetNonblock(a, true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, fmt.Errorf("agent: pipe: %w", err)
	}
	return os.NewFile(uintptr(a), "|agent"), os.NewFile(uintptr(c), "|process"), nil
}

func newPipes() (*execIO, error) {
	x := &execIO{}
	var files []*os.File
	for i, agentReads := range []bool{false, true, true} {
		a, c, err := pipe(agentReads)
		if err != nil {
			closeAll(files)
			return nil, err
		}
		files = append(files, a, c)
		if i == 0 {
			x.stdin = a
		} else {
			x.outputs = append(x.outputs, a)
		}
		x.child = append(x.child, c)
	}
	return x, nil
}

func newPtyIO(size *agentapi.PtySize) (*execIO, error) {
	master, slave, err := openPty(clampSize(size.GetRows(), 24), clampSize(size.GetCols(), 80))
	if err != nil {
		return nil, err
	}
	return &execIO{stdin: master, outputs: []*os.File{master}, pty: master, child: []*os.File{slave, slave, slave}}, nil
}

// clampSize turns a wire size into a winsize field; 0 takes def.
func clampSize(v uint32, def uint16) uint16 {
	switch {
	case v == 0:
		return def
	case v > 0xffff:
		return 0xffff
	}
	return uint16(v)
}

// validateStart checks a start message; its error is an InvalidArgument
// status.
func validateStart(st *agentapi.ExecStart) error {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, "agent: exec: "+format, args...)
	}
	if len(st.Argv) == 0 || st.Argv[0] == "" {
		return bad("empty argv")
	}
	n := 0
	for _, a := range st.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return bad("argument contains NUL")
		}
		n += len(a) + 1
	}
	if n > MaxArgvBytes {
		return bad("argv is %d bytes, more than %d", n, MaxArgvBytes)
	}
	n = 0
	for _, e := range st.Env {
		if strings.IndexByte(e, 0) >= 0 {
			return bad("environment entry contains NUL")
		}
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return bad("environment entry %.40q is not KEY=VALUE", e)
		}
		n += len(e) + 1
	}
	if n > MaxEnvBytes {
		return bad("environment is %d bytes, more than %d", n, MaxEnvBytes)
	}
	if strings.IndexByte(st.Dir, 0) >= 0 {
		return bad("directory contains NUL")
	}
	if st.Container == nil && (len(st.Rlimits) > 0 || st.Capabilities != nil || st.NoNewPrivileges || len(st.AdditionalGids) > 0) {
		return bad("rlimits, capabilities, no_new_privileges and additional_gids apply to container processes only")
	}
	if sc := st.Seccomp; sc != nil {
		if st.Container == nil {
			return bad("a seccomp filter applies to container processes only")
		}
		if n := len(sc.Program); n == 0 || n%8 != 0 || n > 8*4096 {
			return bad("seccomp program of %d bytes: want 1 to 4096 instructions of 8 bytes", n)
		}
	}
	return nil
}

// envPath returns the PATH in env, or "" with ok false.
func envPath(env []string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- { // the last one wins, as in getenv
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v, true
		}
	}
	return "", false
}

// processEnv returns a process's environment, with DefaultPath added when
// env has no PATH, and the PATH its program is looked up in.
func processEnv(env []string) ([]string, string) {
	if path, ok := envPath(env); ok {
		return env, path
	}
	return append(env[:len(env):len(env)], "PATH="+DefaultPath), DefaultPath
}

// findProgram resolves an argv[0] without a slash in path (relative
// entries against dir); one with a slash is a path already.
func findProgram(argv0, path, dir string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	return lookPath(argv0, path, dir)
}

// errNotExecutable reports an argv[0] not found in PATH.
var errNotExecutable = errors.New("executable file not found in PATH")

// lookPath resolves name (no slash) in path, relative entries against dir.
func lookPath(name, path, dir string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", errNotExecutable
}

// startErr turns a fork/exec error into a status a client can act on.
func startErr(argv0 string, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, errNotExecutable):
		code = codes.NotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		code = codes.PermissionDenied
	case errors.Is(err, unix.ENOEXEC), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR):
		code = codes.FailedPrecondition
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOMEM):
		code = codes.ResourceExhausted
	}
	return status.Errorf(code, "agent: exec %q: %v", argv0, err)
}

// startProcess forks the process described by st on x in a process group
// (a session, with a pty) of its own.
func (s *Server) startProcess(st *agentapi.ExecStart, x *execIO, g *group) (*child, error) {
	defer closeAll(x.child) // the process has its copies once started
	sys := &syscall.SysProcAttr{Setpgid: true}
	if x.pty != nil {
		// A new session makes the process its own group leader too.
		sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	if st.Container != nil {
		return s.startInContainer(st, x, g, sys)
	}
	dir := st.Dir
	if dir == "" {
		dir = "/"
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		if err == nil {
			err = unix.ENOTDIR
		}
		return nil, status.Errorf(codes.FailedPrecondition, "agent: exec: working directory: %v", err)
	}
	env, path := processEnv(st.Env)
	argv0, err := findProgram(st.Argv[0], path, dir)
	if err != nil {
		return nil, startErr(st.Argv[0], err)
	}
	if st.Uid != nil || st.Gid != nil {
		sys.Credential = &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), NoSetGroups: false}
		if st.Uid != nil {
			sys.Credential.Uid = *st.Uid
		}
		if st.Gid != nil {
			sys.Credential.Gid = *st.Gid
		}
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Sys: sys}
	for _, f := range x.child {
		attr.Files = append(attr.Files, f.Fd()) // Fd keeps these blocking
	}
	c, err := s.starter.start(argv0, st.Argv, attr, g.leaderExited)
	if err != nil {
		return nil, startErr(st.Argv[0], err)
	}
	g.started(c.pid)
	return c, nil
}

// Exec runs one process; see agentapi.AgentServer and docs/agent.md.
//
// Goroutines, all owned by this call:
//   - this handler: starts the process, waits for it (or the timeout, or
//     the end of the call), then for the output readers, and sends the exit;
//   - one reader per output (two with pipes, one with a pty): read 32 KiB
//     chunks and Send them (sends are serialized by sendMu); they end at
//     EOF, or when the handler closes their file after drainTimeout;
//   - the receiver: the only caller of stream.Recv after the start message;
//     it writes stdin, closes it, forwards signals and resizes. It ends when
//     the client closes its side or when the call ends (gRPC then fails
//     Recv); the handler does not wait for it, since it could not wake it.
func (s *Server) Exec(stream agentapi.Agent_ExecServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	st := req.GetStart()
	if st == nil {
		return status.Error(codes.InvalidArgument, "agent: exec: the first message must be start")
	}
	if err := validateStart(st); err != nil {
		return err
	}
	if err := s.enterExec(); err != nil {
		return err
	}
	defer s.leaveExec()

	var x *execIO
	if st.Pty != nil {
		x, err = newPtyIO(st.Pty)
	} else {
		x, err = newPipes()
	}
	if err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	defer x.close()
	g := &group{}
	c, err := s.startProcess(st, x, g)
	if err != nil {
		return err
	}
	s.logf("exec pid %d: %q", c.pid, st.Argv)
	// Nothing else is sent yet: started is the first message.
	if err := stream.Send(&agentapi.ExecResponse{Msg: &agentapi.ExecResponse_Started{Started: &agentapi.Started{Pid: uint32(c.pid)}}}); err != nil {
		g.signal(unix.SIGKILL)
		<-c.done
		return err
	}

	ctx := stream.Context()
	var sendMu sync.Mutex // serializes stream.Send
	send := func(m *agentapi.ExecResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	var readers sync.WaitGroup
	for i, f := range x.outputs {
		wrap := func(b []byte) *agentapi.ExecResponse {
			return &agentapi.ExecResponse{Msg: &agentapi.ExecResponse_Stdout{Stdout: b}}
		}
		if i == 1 {
			wrap = func(b []byte) *agentapi.ExecResponse {
				return &agentapi.ExecResponse{Msg: &agentapi.ExecResponse_Stderr{Stderr: b}}
			}
		}
		readers.Add(1)
		go func() {
			defer readers.Done()
			readOutput(f, func(b []byte) error { return send(wrap(b)) })
		}()
	}
	violation := make(chan error, 1)
	go receiveInput(stream, x, g, violation)

	var timeout <-chan time.Time
	if st.TimeoutMs > 0 {
		t := time.NewTimer(time.Duration(min(st.TimeoutMs, uint64(1<<63-1)/uint64(time.Millisecond))) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var (
		timedOut bool
		callErr  error
	)
	select {
	case <-c.done:
	case <-timeout:
		timedOut = true
		g.signal(unix.SIGKILL)
		<-c.done
	case <-ctx.Done():
		g.signal(unix.SIGKILL)
		<-c.done
		callErr = status.FromContextError(ctx.Err()).Err()
	case callErr = <-violation:
		g.signal(unix.SIGKILL)
		<-c.done
	}
	s.logf("exec pid %d: %v timed_out=%v", c.pid, c.status, timedOut)

	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		x.close()
		<-drained
	}
	x.close() // wakes the receiver if it is blocked writing stdin
	if callErr != nil {
		return callErr
	}
	if c.err != nil {
		return status.Errorf(codes.Internal, "%v", c.err)
	}
	return send(&agentapi.ExecResponse{Msg: &agentapi.ExecResponse_Exit{Exit: exitStatus(c.status, timedOut)}})
}

// readOutput sends what f yields in chunks of at most ChunkSize until EOF,
// an error (EIO from a pty master once the terminal is closed, or a closed
// file) or a failed send.
func readOutput(f *os.File, send func([]byte) error) {
	for {
		buf := make([]byte, agentapi.ChunkSize) // Send may keep the message
		n, err := f.Read(buf)
		if n > 0 {
			if send(buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// receiveInput handles the client's messages after start; see Exec.
func receiveInput(stream agentapi.Agent_ExecServer, x *execIO, g *group, violation chan<- error) {
	defer x.closeStdin()
	for {
		req, err := stream.Recv()
		if err != nil {
			return // io.EOF: the client closed its side; else the call is over
		}
		switch m := req.Msg.(type) {
		case *agentapi.ExecRequest_Stdin:
			// Write blocks while the process does not read: the client's
			// sends then block too, through gRPC flow control.
			if _, err := x.stdin.Write(m.Stdin); err != nil && x.pty == nil {
				x.closeStdin() // EPIPE: the process closed its stdin
			}
		case *agentapi.ExecRequest_CloseStdin:
			x.closeStdin()
		case *agentapi.ExecRequest_Signal:
			if m.Signal > 0 && m.Signal < 65 {
				g.signal(unix.Signal(m.Signal))
			}
		case *agentapi.ExecRequest_Resize:
			if x.pty != nil {
				if rc, err := x.pty.SyscallConn(); err == nil {
					rc.Control(func(fd uintptr) {
						setPtySize(int(fd), clampSize(m.Resize.Rows, 24), clampSize(m.Resize.Cols, 80))
					})
				}
			}
		default:
			violation <- status.Error(codes.InvalidArgument, "agent: exec: start sent twice")
			return
		}
	}
}

// exitStatus converts a wait status.
func exitStatus(ws unix.WaitStatus, timedOut bool) *agentapi.ExitStatus {
	es := &agentapi.ExitStatus{Code: int32(ws.ExitStatus()), TimedOut: timedOut}
	if ws.Signaled() {
		es.Code = -1
		es.Signal = int32(ws.Signal())
	}
	return es
}

// enterExec counts a running Exec, refusing one over the limit.
func (s *Server) enterExec() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running >= s.maxExecs {
		return status.Errorf(codes.ResourceExhausted, "agent: exec: %d processes already running", s.running)
	}
	s.running++
	return nil
}

// leaveExec uncounts an Exec and calls Options.Idle when none is left.
func (s *Server) leaveExec() {
	s.mu.Lock()
	s.running--
	idle := s.running == 0
	s.mu.Unlock()
	if idle && s.opts.Idle != nil {
		s.opts.Idle()
	}
}
