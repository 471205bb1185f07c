//go:build !microvm_lean

package main

// Named VMs: `microvm run --name NAME [--detach]` and the
// commands that reach a VM by its name. A named VM's process keeps its
// state directory (internal/vms: record, lock, sockets, console log) and
// serves its control API (internal/vmctl) until the VM ends.
//
// Goroutines of a named VM's process: the caller of runNamed owns the
// machine and the lease; Run's goroutine runs the vCPUs; the control
// API's server goroutines call the vmBackend, whose methods only read
// counters, pause and resume, or cancel the run's context (stop), all safe
// from any goroutine.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/unixsock"
	"github.com/microvm/microvm/internal/vmctl"
	"github.com/microvm/microvm/internal/vms"
)

// detachFD is set, in the environment of a detached VM's process, to the
// descriptor on which it tells the `run --detach` that started it how the
// start went: "ready\n", or "error: MESSAGE\n".
const detachFD = "MICROVM_DETACH_FD"

// defaultAgentCmdline is the kernel command line of a VM booted with the
// agent image and no --cmdline.
const defaultAgentCmdline = "console=ttyS0 reboot=k panic=-1 quiet"

// runNamed is `microvm run` with --name, --detach or --with-agent.
func runNamed(c *cli.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	name := c.String("name")
	detach := c.Bool("detach")
	withAgent := c.Bool("with-agent") || isSet(c, "image")
	child := os.Getenv(detachFD) != ""
	switch {
	case detach && name == "":
		return usagef("--detach needs --name (the detached VM is reached by its name)")
	case name == "" && withAgent:
		return usagef("--with-agent and --image need --name (exec --vm and cp reach the agent by the VM's name)")
	case isSet(c, "vsock-uds"):
		return usagef("--vsock-uds: a named VM's vsock socket is in its state directory (%s)", vms.VsockSocket)
	case isSet(c, "chroot") || isSet(c, "uid") || isSet(c, "gid"):
		return usagef("--chroot, --uid and --gid are not supported with --name yet")
	}
	if err := vms.CheckName(name); err != nil {
		return usageError{err}
	}
	log, err := setupLog(c, stderr)
	if err != nil {
		return err
	}
	if c.String("kernel") == "" && !withAgent {
		return usagef("run: --kernel is required")
	}
	var img imageOpts
	if withAgent {
		if img, err = readAgentImage(c); err != nil {
			return err
		}
	}
	cfg, err := namedConfig(c, img)
	if err != nil {
		return err
	}
	if err := cfg.Check(); err != nil {
		return err
	}
	if ref := c.String("image"); ref != "" {
		// Found, or pulled with its progress on this terminal, before a
		// detached VM's process starts: it finds the image stored.
		ctx, stop := interruptible(context.Background())
		img.root, err = findImage(ctx, ref, stderr, child)
		stop()
		if err != nil {
			return failure{fmt.Errorf("run: %w", err)}
		}
		img.rootRef = ref
		if !c.Bool("idle") {
			// The image's main process, as docker run starts it; an
			// image that names none (a root file system import) idles.
			env, err := envFlags(listValues(c, "env"))
			if err != nil {
				return err
			}
			if p, err := applyImage(img.root.Config, c.Args().Slice(), env, ""); err == nil {
				img.main = &p
			} else if c.NArg() > 0 {
				return err
			}
		}
	} else if isSet(c, "idle") {
		return usagef("--idle: only with --image")
	} else if len(listValues(c, "env")) > 0 {
		return usagef("--env: only with --image (it sets the image's main process's environment)")
	}
	if detach && !child {
		return startDetached(name, c.Duration("boot-timeout"), withAgent)
	}
	err = runNamedVM(c, bootLaunch(name, cfg, img, withAgent), child, stdin, stdout, log)
	if errors.Is(err, unixsock.ErrNoSockets) {
		// The VM's sockets live in the state directory, which the
		// user may not know they chose.
		err = fmt.Errorf("%w; the state directory is %s: set $MICROVM_STATE_DIR to one on a local file system", err, vms.StateDir())
	}
	return err
}

// namedLaunch is what a named VM's process starts: its record, and how
// its machine is made once the process holds the name.
type namedLaunch struct {
	rec vms.Record
	// build makes the machine, given what the VM's process owns: the
	// vsock socket in the state directory, the console, its input and
	// the log (host's other fields zero).
	build func(host microvm.Config) (*microvm.Machine, error)
	// main, for an image VM, is its main process.
	main *imageProcess
}

// bootLaunch is the launch of `run --name`: cfg booted, from exec's
// agent image when img says so.
func bootLaunch(name string, cfg microvm.Config, img imageOpts, withAgent bool) namedLaunch {
	rec := vms.Record{Name: name, CPUs: cfg.CPUs, MemoryBytes: cfg.MemoryBytes, Kernel: cfg.Kernel,
		Initrd: cfg.Initrd, Agent: withAgent, AgentPort: agentPort, VsockCID: cfg.Vsock.CID}
	if img.root != nil {
		cfg.UseImage(img.root, img.overlay)
		rec.Image, rec.Process = img.rootRef, processDefaults(img.root.Config)
	}
	if img.build {
		rec.Initrd = "(the agent image)"
	}
	for _, d := range cfg.Disks {
		rec.Disks = append(rec.Disks, d.Path)
	}
	build := func(host microvm.Config) (*microvm.Machine, error) {
		cfg.Vsock.UDSPath = host.Vsock.UDSPath
		cfg.Log, cfg.Console, cfg.ConsoleInput = host.Log, host.Console, host.ConsoleInput
		if !img.build {
			return microvm.New(cfg)
		}
		f, err := os.CreateTemp("", "microvm-run-*.cpio")
		if err != nil {
			return nil, err
		}
		f.Close()
		defer os.Remove(f.Name()) // in guest memory once New returns
		if err := writeImage(f.Name(), img.exec.image); err != nil {
			return nil, failure{fmt.Errorf("run: guest image: %w", err)}
		}
		cfg.Initrd = f.Name()
		return microvm.New(cfg)
	}
	return namedLaunch{rec: rec, build: build, main: img.main}
}

// imageOpts is the agent image a named VM boots, when it boots one.
type imageOpts struct {
	build bool // build exec's image (no --initrd, no --root)
	exec  *execOpts
	// root is --image's image (rootRef as the user named it) and overlay
	// its copy-on-write layer's size, when the VM runs one.
	root    *image.Image
	rootRef string
	overlay uint64
	// main is the image's main process (Entrypoint and Cmd, or the
	// command line's arguments), run once the agent answers: the VM ends
	// when it does, with its status. nil with --idle.
	main *imageProcess
}

// readAgentImage reads the image flags for --with-agent.
func readAgentImage(c *cli.Context) (imageOpts, error) {
	if c.String("initrd") != "" || c.String("root") != "" {
		return imageOpts{}, nil // the given image's /init must be the agent
	}
	o := &execOpts{}
	var err error
	if o.image, err = readImageFlags(c); err != nil {
		return imageOpts{}, err
	}
	overlay, err := readRootImageFlags(c, &o.image, false)
	if err != nil {
		return imageOpts{}, err
	}
	return imageOpts{build: true, exec: o, overlay: overlay}, nil
}

// namedConfig is run's configuration for a named VM: the kernel defaults
// as exec's does with --with-agent, and the command line to exec's.
func namedConfig(c *cli.Context, img imageOpts) (microvm.Config, error) {
	cfg, err := runConfigNoKernelCheck(c)
	if err != nil {
		return cfg, err
	}
	if cfg.Kernel == "" {
		if cfg.Kernel = os.Getenv("MICROVM_KERNEL"); cfg.Kernel == "" {
			cfg.Kernel = defaultKernelPath()
			if _, err := os.Stat(cfg.Kernel); err != nil {
				return cfg, fmt.Errorf("kernel %s: %w (no --kernel and no $MICROVM_KERNEL, so this is the default: build it with make kernel, or give one)",
					cfg.Kernel, unwrapPathError(err))
			}
		}
	}
	if img.build && cfg.Cmdline == "" {
		cfg.Cmdline = defaultAgentCmdline
	}
	if cfg.Root != "" && c.Bool("with-agent") && !strings.Contains(cfg.Cmdline, "init=") {
		cfg.Cmdline = strings.TrimSpace(cfg.Cmdline + " init=/init")
	}
	// runConfigNoKernelCheck made the device from --vsock-cid and the
	// vsock limits and options; the socket is the state directory's
	// (runNamed), the CID exec's unless --vsock-cid chose one.
	if cfg.Vsock == nil {
		cfg.Vsock = &microvm.VsockConfig{}
	}
	if cfg.Vsock.CID == 0 {
		cfg.Vsock.CID = execCID
	}
	return cfg, nil
}

// startDetached starts this command again as a process of its own, in a
// session of its own with its standard streams on /dev/null, and returns
// once that process says the VM runs (and its agent answers, when it has
// one), or says why it could not start.
func startDetached(name string, bootTimeout time.Duration, withAgent bool) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		w.Close()
		return err
	}
	defer null.Close()
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), detachFD+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("run --detach: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // reaps it if it ends while we wait
	line := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(r, 4096))
		line <- strings.TrimSpace(string(b))
	}()
	limit := 30 * time.Second
	if withAgent {
		limit += bootTimeout
	}
	select {
	case l := <-line:
		if l == "ready" {
			_ = cmd.Process.Release()
			return nil
		}
		if msg, ok := strings.CutPrefix(l, "error: "); ok {
			return failure{errors.New(msg)}
		}
		err := <-done
		return failure{fmt.Errorf("VM %s: its process ended before the VM ran (%v; %s)", name, err, logHint(name))}
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		return failure{fmt.Errorf("VM %s: not running after %v; stopped it (microvm logs %s; %s)", name, limit, name, logHint(name))}
	}
}

// logHint names a detached VM's diagnostics file.
func logHint(name string) string {
	return "its diagnostics: " + vms.StateDir() + "/vms/" + name + "/" + vms.LogFile
}

// runNamedVM is the process of a named VM: it takes the name, builds the
// machine, serves the control API and runs the VM until it ends.
func runNamedVM(c *cli.Context, l namedLaunch, detached bool,
	stdin io.Reader, stdout io.Writer, log logrus.FieldLogger) (err error) {
	name, withAgent := l.rec.Name, l.rec.Agent
	var ready *os.File
	if detached {
		fd, _ := strconv.Atoi(os.Getenv(detachFD))
		ready = os.NewFile(uintptr(fd), "detach")
		os.Unsetenv(detachFD)
		defer func() {
			if err != nil && ready != nil {
				fmt.Fprintf(ready, "error: %v\n", err)
			}
			if ready != nil {
				ready.Close()
			}
		}()
	}
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	lease, err := store.Create(l.rec)
	if err != nil {
		return failure{err}
	}
	defer lease.Release()
	if detached {
		// The detached process's own diagnostics (logrus, a seccomp
		// report) go to microvm.log in its directory.
		if f, err := os.OpenFile(lease.Path(vms.LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
			_ = unix.Dup3(int(f.Fd()), 2, 0)
			f.Close()
		}
	}
	exitStatus, exitReason := microvm.StatusError, "microvm failed to start it"
	defer func() {
		_ = lease.Update(func(r *vms.Record) {
			r.State, r.Ended, r.ExitStatus, r.ExitReason = vms.StateExited, time.Now().UTC(), exitStatus, exitReason
		})
	}()
	clog, err := vms.OpenConsoleLog(lease.Dir(), vms.ConsoleMax)
	if err != nil {
		return err
	}
	defer clog.Close()
	host := microvm.Config{Log: log, Console: clog, Vsock: &microvm.VsockConfig{UDSPath: lease.Path(vms.VsockSocket)}}
	if !detached {
		host.Console = io.MultiWriter(stdout, clog)
		if l.main == nil { // else stdin is the main process's
			host.ConsoleInput = stdin
		}
	}
	m, err := l.build(host)
	if err != nil {
		return err
	}
	defer m.Close()
	cfg := m.Config()

	sigCtx, stopSignals := interruptible(context.Background())
	defer stopSignals()
	inspectOnSIGUSR1(sigCtx, log, m)
	runCtx, cancelRun := context.WithCancelCause(sigCtx)
	defer cancelRun(nil)
	be := &vmBackend{m: m, lease: lease, cancel: cancelRun, started: time.Now(), log: log}
	srv, err := vmctl.Serve(lease.Path(vms.APISocket), be, log)
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := confine(c, vmmPolicy(cfg).WithSnapshots(), log); err != nil {
		return err
	}

	vmDone := make(chan struct{})
	var res microvm.Result
	var runErr error
	go func() {
		defer close(vmDone)
		res, runErr = m.Run(runCtx)
	}()
	_ = lease.Update(func(r *vms.Record) { r.State = vms.StateRunning })
	var mainDone chan mainEnd
	if l.main != nil {
		mainDone = make(chan mainEnd, 1)
		var in io.Reader
		if !detached {
			in = stdin
		}
		go func() {
			mainDone <- be.runMain(runCtx, *l.main, c.Duration("boot-timeout"), vmDone, in, host.Console)
		}()
	}
	if ready == nil && withAgent && len(m.MACChanges()) > 0 {
		// In the foreground nothing waits for the agent: the clone's
		// MACs are set once it answers, meanwhile.
		go func() {
			if err := be.waitAgent(runCtx, c.Duration("boot-timeout"), vmDone); err != nil {
				log.WithError(err).Warn("the restored guest keeps the snapshot's MAC addresses")
			}
		}()
	}
	if ready != nil {
		if withAgent {
			if err := be.waitAgent(runCtx, c.Duration("boot-timeout"), vmDone); err != nil {
				cancelRun(err)
				<-vmDone
				return failure{fmt.Errorf("VM %s: %w (microvm logs %s)", name, err, name)}
			}
		}
		fmt.Fprintln(ready, "ready")
		ready.Close()
		ready = nil
	}
	<-vmDone
	exitStatus, exitReason = namedEnd(res, runErr, be.stopRequested(), sigCtx)
	select {
	case me := <-mainDone:
		switch {
		case runErr != nil:
		case me.failed:
			exitStatus, exitReason = statusFailure, fmt.Sprintf("its main process %s could not run: %v", l.main.argv[0], me.err)
			return failure{fmt.Errorf("VM %s: main process %s: %w", name, l.main.argv[0], me.err)}
		case me.err == nil:
			exitStatus, exitReason = me.status, fmt.Sprintf("its main process %s ended with status %d", l.main.argv[0], me.status)
		}
	default:
	}
	if runErr != nil {
		return runErr
	}
	if exitStatus != 0 {
		return statusError{exitStatus}
	}
	return nil
}

// namedEnd is a named VM's exit status and what ended it, for its record
// and the process's status.
func namedEnd(res microvm.Result, err error, stopped bool, sigCtx context.Context) (int, string) {
	var cs caughtSignal
	switch {
	case err != nil:
		return microvm.StatusError, err.Error()
	case stopped && res.Kind == microvm.ExitCanceled:
		return 0, "stopped through the control API"
	case errors.As(context.Cause(sigCtx), &cs):
		return 128 + int(cs.sig), "stopped by " + cs.sig.String()
	}
	return res.Status, agentvm.End(res, nil)
}

// vmBackend is a named VM behind its control API.
type vmBackend struct {
	m       *microvm.Machine
	lease   *vms.Lease
	cancel  context.CancelCauseFunc
	started time.Time
	log     logrus.FieldLogger

	mu       sync.Mutex // guards stopping
	stopping bool
}

var _ vmctl.Backend = (*vmBackend)(nil)

func (b *vmBackend) stopRequested() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopping
}

// Info implements vmctl.Backend.
func (b *vmBackend) Info() vmctl.VMInfo {
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
func (b *vmBackend) WriteMetrics(w io.Writer) error { return b.m.Metrics().WritePrometheus(w) }

// SetState implements vmctl.Backend.
func (b *vmBackend) SetState(ctx context.Context, req vmctl.StateRequest) error {
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
		b.mu.Lock()
		b.stopping = true
		b.mu.Unlock()
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
func (b *vmBackend) Snapshot(ctx context.Context, req vmctl.SnapshotRequest) error {
	if b.stopRequested() {
		return fmt.Errorf("the VM is stopping: %w", vmctl.ErrConflict)
	}
	if req.Stop {
		b.mu.Lock()
		b.stopping = true
		b.mu.Unlock()
	}
	rec := b.lease.Record()
	labels := map[string]string{labelAgent: strconv.FormatBool(rec.Agent)}
	if rec.Agent {
		labels[labelAgentPort] = strconv.FormatUint(uint64(rec.AgentPort), 10)
	}
	err := b.m.Snapshot(ctx, req.Path, microvm.SnapshotOptions{Stop: req.Stop, Overwrite: req.Overwrite, Diff: req.Diff, Labels: labels})
	switch {
	case err != nil && req.Stop:
		b.mu.Lock()
		b.stopping = false
		b.mu.Unlock()
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

// The labels a named VM's snapshot carries (microvm.SnapshotOptions.Labels),
// for restore --name: whether its guest runs the agent, and on which port.
const (
	labelAgent     = "microvm.agent"
	labelAgentPort = "microvm.agent-port"
)

// errStopRequested is the run's cancel cause for a stop through the API.
var errStopRequested = errors.New("stopped through the control API")

func conflictIfNotRunning(err error) error {
	if errors.Is(err, microvm.ErrNotRunning) {
		return fmt.Errorf("%w: %w", err, vmctl.ErrConflict)
	}
	return err
}

// shutdownThroughAgent asks the guest's agent to power the guest off, and
// stops the VM itself if the guest has not ended within timeout.
func (b *vmBackend) shutdownThroughAgent(timeout time.Duration) {
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
// foreground), stdin from in, and then powers the guest off, as a
// container ends with its main process.
func (b *vmBackend) runMain(ctx context.Context, p imageProcess, timeout time.Duration, vmDone <-chan struct{},
	in io.Reader, console io.Writer) mainEnd {
	fail := func(err error) mainEnd {
		if ctx.Err() != nil || b.stopRequested() {
			return mainEnd{err: err} // the VM is ending anyway: not the cause
		}
		b.cancel(fmt.Errorf("main process %s: %w", p.argv[0], err))
		return mainEnd{err: err, failed: true}
	}
	cc, err := agentvm.Wait(ctx, b.m, timeout, vmDone)
	if err != nil {
		return fail(err)
	}
	defer cc.Close()
	st, err := agentapi.NewClient(cc).Exec(ctx, &agentapi.Cmd{Argv: p.argv, Env: p.env, Dir: p.workdir, UID: p.uid, GID: p.gid,
		Stdin: in, Stdout: console, Stderr: console})
	if err != nil {
		return fail(errors.New(agentvm.Message(err)))
	}
	status := agentvm.ShellStatus(st)
	b.mu.Lock()
	b.stopping = true
	b.mu.Unlock()
	go b.shutdownThroughAgent(10 * time.Second)
	return mainEnd{status: status}
}

// waitAgent waits until the VM's agent answers, the boot timeout passes or
// the VM ends; a restored clone's agent then takes the clone's MACs.
func (b *vmBackend) waitAgent(ctx context.Context, timeout time.Duration, vmDone <-chan struct{}) error {
	cc, err := agentvm.Wait(ctx, b.m, timeout, vmDone)
	if err != nil {
		return err
	}
	err = agentvm.AdoptMACs(ctx, b.m, cc)
	if cerr := cc.Close(); err == nil {
		err = cerr
	}
	return err
}

// namedCommands are the commands that reach a named VM by its name.
func namedCommands(stdin io.Reader, stdout, stderr io.Writer) []*cli.Command {
	usage := map[string]string{}
	for _, n := range namedCommandNames {
		usage[n.name] = n.usage
	}
	one := func(c *cli.Context, what string) (string, error) {
		if c.NArg() != 1 {
			return "", usagef("%s: want one VM name (got %d arguments)", what, c.NArg())
		}
		if err := vms.CheckName(c.Args().First()); err != nil {
			return "", usageError{err}
		}
		return c.Args().First(), nil
	}
	return []*cli.Command{
		{
			Name: "ls", Usage: usage["ls"], UsageText: "microvm ls [--json]", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "one JSON array of the VMs' records, for machines"}},
			Action: func(c *cli.Context) error {
				if c.NArg() > 0 {
					return usagef("ls takes no arguments")
				}
				return listVMs(stdout, c.Bool("json"))
			},
		},
		{
			Name: "stop", Usage: usage["stop"], UsageText: "microvm stop [--timeout D] NAME", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long the guest has to power off before the VM is stopped"}},
			Action: func(c *cli.Context) error {
				name, err := one(c, "stop")
				if err != nil {
					return err
				}
				if c.Duration("timeout") < 0 {
					return usagef("--timeout %v: must not be negative", c.Duration("timeout"))
				}
				return stopVM(name, false, c.Duration("timeout"))
			},
		},
		restoreCommand(stdin, stdout, stderr),
		{
			Name: "snapshot", Usage: usage["snapshot"], UsageText: "microvm snapshot [--stop] [--overwrite] [--diff] --out DIR NAME", OnUsageError: onUsageError,
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "out", Usage: "the snapshot's directory (must not exist, or hold a snapshot with --overwrite)"},
				&cli.BoolFlag{Name: "stop", Usage: "end the VM once the snapshot is written"},
				&cli.BoolFlag{Name: "overwrite", Usage: "replace the snapshot at --out"},
				&cli.BoolFlag{Name: "diff", Usage: "save only the memory pages written since the VM's previous snapshot (run --track-dirty-pages), against it"},
			},
			Action: func(c *cli.Context) error {
				name, err := one(c, "snapshot")
				if err != nil {
					return err
				}
				if c.String("out") == "" {
					return usagef("snapshot: --out DIR is required")
				}
				out, err := filepath.Abs(c.String("out"))
				if err != nil {
					return usagef("snapshot: --out %s: %v", c.String("out"), err)
				}
				return snapshotVM(name, vmctl.SnapshotRequest{Path: out, Stop: c.Bool("stop"), Overwrite: c.Bool("overwrite"), Diff: c.Bool("diff")})
			},
		},
		{
			Name: "kill", Usage: usage["kill"], UsageText: "microvm kill NAME", OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				name, err := one(c, "kill")
				if err != nil {
					return err
				}
				return stopVM(name, true, 0)
			},
		},
		{
			Name: "rm", Usage: usage["rm"], UsageText: "microvm rm [-f] NAME...", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "kill running VMs first"}},
			Action: func(c *cli.Context) error {
				if c.NArg() == 0 {
					return usagef("rm: want VM names")
				}
				store, err := vms.Open(vms.StateDir())
				if err != nil {
					return err
				}
				var errs []error
				for _, name := range c.Args().Slice() {
					if err := vms.CheckName(name); err != nil {
						return usageError{err}
					}
					if c.Bool("force") {
						if e, err := store.Get(name); err == nil && e.Alive {
							if err := stopVM(name, true, 0); err != nil {
								errs = append(errs, err)
								continue
							}
						}
					}
					if err := store.Remove(name); err != nil {
						errs = append(errs, err)
					}
				}
				return errors.Join(errs...)
			},
		},
		{
			Name: "logs", Usage: usage["logs"], UsageText: "microvm logs [-f] NAME", OnUsageError: onUsageError,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing what the console says until the VM ends (or SIGINT)"}},
			Action: func(c *cli.Context) error {
				name, err := one(c, "logs")
				if err != nil {
					return err
				}
				return printLogs(stdout, name, c.Bool("follow"))
			},
		},
		{
			Name: "pause", Usage: usage["pause"], UsageText: "microvm pause NAME", OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				name, err := one(c, "pause")
				if err != nil {
					return err
				}
				return setVMState(name, vmctl.StateRequest{State: vmctl.Paused})
			},
		},
		{
			Name: "resume", Usage: usage["resume"], UsageText: "microvm resume NAME", OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				name, err := one(c, "resume")
				if err != nil {
					return err
				}
				return setVMState(name, vmctl.StateRequest{State: vmctl.Running})
			},
		},
		namedCpCommand(stdin, stdout, stderr, usage["cp"]),
	}
}

// liveVM returns the running VM named name, or an error saying it is not.
func liveVM(name string) (vms.Entry, error) {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return vms.Entry{}, err
	}
	e, err := store.Get(name)
	if err != nil {
		return e, err
	}
	if !e.Alive {
		return e, fmt.Errorf("VM %s is not running (%s%s)", name, e.State, describeEnd(e))
	}
	return e, nil
}

// describeEnd says how an exited VM ended, for messages.
func describeEnd(e vms.Entry) string {
	if e.ExitReason == "" {
		return ""
	}
	return ": " + e.ExitReason
}

// setVMState asks a running VM's API for a state.
func setVMState(name string, req vmctl.StateRequest) error {
	e, err := liveVM(name)
	if err != nil {
		return err
	}
	c := vmctl.NewClient(e.Dir + "/" + vms.APISocket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.SetState(ctx, req); err != nil {
		return fmt.Errorf("VM %s: %w", name, err)
	}
	return nil
}

// snapshotVM is `microvm snapshot`: the VM's own process writes the
// snapshot (it holds the VM), so the wait is bounded by the time that
// takes, not by a fixed timeout.
func snapshotVM(name string, req vmctl.SnapshotRequest) error {
	e, err := liveVM(name)
	if err != nil {
		return err
	}
	c := vmctl.NewClient(e.Dir + "/" + vms.APISocket)
	defer c.Close()
	if err := c.Snapshot(context.Background(), req); err != nil {
		return fmt.Errorf("VM %s: %w", name, err)
	}
	return nil
}

// stopVM stops a running VM through its API (force: at once; otherwise the
// agent powers the guest off, and the VM is stopped after timeout), waits
// for its process to end, and kills the process if the API does not
// answer.
func stopVM(name string, force bool, timeout time.Duration) error {
	e, err := liveVM(name)
	if err != nil {
		return err
	}
	apiErr := setVMState(name, vmctl.StateRequest{State: vmctl.Stopped, Force: force, TimeoutMS: timeout.Milliseconds()})
	store, _ := vms.Open(vms.StateDir())
	wait := func(d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if g, err := store.Get(name); err != nil || !g.Alive {
				return true
			}
		}
		return false
	}
	if apiErr == nil && wait(timeout+10*time.Second) {
		return nil
	}
	// The API did not answer, or the VM did not end: its process goes.
	if killVMProcess(store, name, e.PID) == nil && wait(10*time.Second) {
		return nil
	}
	if apiErr != nil {
		return fmt.Errorf("VM %s: %w (and killing its process %d did not end it)", name, apiErr, e.PID)
	}
	return fmt.Errorf("VM %s: still running after it was killed (pid %d)", name, e.PID)
}

// beforeVMKill, when set (by tests), runs in killVMProcess between the
// check that pid is still the VM's and the signal.
var beforeVMKill func()

// killVMProcess sends SIGKILL to the process of the VM named name, pid,
// through a pidfd opened before checking that the VM is alive with that
// pid: the check then holds for the process the pidfd names, and a pid
// that the VM's process left and another process took meanwhile is never
// signalled (the pidfd's process is gone: ESRCH).
func killVMProcess(store *vms.Store, name string, pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("VM %s: process %d: %w", name, pid, err)
	}
	defer unix.Close(fd)
	if g, err := store.Get(name); err != nil || !g.Alive || g.PID != pid {
		return fmt.Errorf("VM %s: process %d is no longer the VM's", name, pid)
	}
	if beforeVMKill != nil {
		beforeVMKill()
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("VM %s: kill process %d: %w", name, pid, err)
	}
	return nil
}

// listVMs is `microvm ls`.
func listVMs(w io.Writer, asJSON bool) error {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	list, err := store.List()
	if err != nil {
		return err
	}
	// A running VM's own view of its state (paused, stopping) is fresher
	// than its record.
	for i, e := range list {
		if !e.Alive {
			continue
		}
		c := vmctl.NewClient(e.Dir + "/" + vms.APISocket)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if info, err := c.Info(ctx); err == nil {
			list[i].State = info.State
		}
		cancel()
		c.Close()
	}
	if asJSON {
		recs := make([]vms.Record, 0, len(list))
		for _, e := range list {
			recs = append(recs, e.Record)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(recs)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tPID\tCPUS\tMEMORY\tUP\tSTATUS\tWITH")
	for _, e := range list {
		up, pid, status := "-", "-", "-"
		if e.Alive {
			up = time.Since(e.Created).Round(time.Second).String()
			pid = strconv.Itoa(e.PID)
		} else if e.State == vms.StateExited {
			status = strconv.Itoa(e.ExitStatus)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.Name, e.State, pid, e.CPUs,
			microvm.FormatSize(e.MemoryBytes), up, status, e.Describe())
	}
	return tw.Flush()
}

// printLogs is `microvm logs`: the console log, and with follow what it
// says next, until the VM ends or a signal.
func printLogs(w io.Writer, name string, follow bool) error {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	e, err := store.Get(name)
	if err != nil {
		return err
	}
	b, err := vms.ReadConsole(e.Dir)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil || !follow {
		return err
	}
	ctx, stop := interruptible(context.Background())
	defer stop()
	path := e.Dir + "/" + vms.ConsoleFile
	var off int64
	if fi, err := os.Stat(path); err == nil {
		off = fi.Size()
	}
	for {
		f, err := os.Open(path)
		if err == nil {
			if fi, err := f.Stat(); err == nil && fi.Size() < off {
				off = 0 // rotated
			}
			n, _ := io.Copy(w, io.NewSectionReader(f, off, 1<<62))
			off += n
			f.Close()
		}
		if g, err := store.Get(name); err != nil || !g.Alive {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// namedCpCommand is `microvm cp SRC DST` with NAME:/PATH on one side.
func namedCpCommand(stdin io.Reader, stdout, stderr io.Writer, usage string) *cli.Command {
	return &cli.Command{
		Name: "cp", Usage: usage, UsageText: "microvm cp [--keep-setuid] SRC DST   (one of them NAME:/PATH)", OnUsageError: onUsageError,
		Flags: append(cliFlags(logFlags()), keepSetuidFlag),
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return usagef("cp: want SRC and DST, one of them NAME:/PATH (got %d arguments)", c.NArg())
			}
			src, dst := c.Args().Get(0), c.Args().Get(1)
			name, guestSrc, guestDst := "", "", ""
			if n, p, ok := splitVMPath(src); ok {
				name, guestSrc = n, p
			}
			if n, p, ok := splitVMPath(dst); ok {
				if name != "" {
					return usagef("cp: both SRC and DST name a VM; one side must be the host")
				}
				name, guestDst = n, p
			}
			if name == "" {
				return usagef("cp: neither SRC nor DST is NAME:/PATH")
			}
			if guestSrc != "" {
				src = guestPrefix + guestSrc
			} else {
				dst = guestPrefix + guestDst
			}
			cp, err := parseCopy(src, dst)
			if err != nil {
				return err
			}
			cp.KeepSpecial = c.Bool(keepSetuidFlag.Name)
			log, err := setupLog(c, stderr)
			if err != nil {
				return err
			}
			e, err := liveVM(name)
			if err != nil {
				return failure{fmt.Errorf("cp: %w", err)}
			}
			if !e.Agent {
				return failure{fmt.Errorf("cp: VM %s runs no agent (start it with --with-agent)", name)}
			}
			return copyWithAgent("cp", cp, vmAgentAddr(e, 5*time.Second), stdin, stdout, log)
		},
	}
}

// vmAgentAddr is where a named VM's agent answers: its vsock socket in
// the VM's directory, the agent's port.
func vmAgentAddr(e vms.Entry, timeout time.Duration) agentvm.Addr {
	return agentvm.Addr{UDS: e.Dir + "/" + vms.VsockSocket, Port: e.AgentPort, Timeout: timeout}
}

// splitVMPath splits "NAME:/PATH" (NAME a valid VM name, PATH absolute).
func splitVMPath(s string) (name, path string, ok bool) {
	n, p, found := strings.Cut(s, ":")
	if !found || vms.CheckName(n) != nil || !strings.HasPrefix(p, "/") {
		return "", "", false
	}
	return n, p, true
}
