package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/hybridvsock"
)

// Exec's fixed choices: the agent's vsock port and the guest's CID.
const (
	agentPort = 1024
	execCID   = 3
	// consoleKeep is how much of the guest console exec keeps, to show
	// when the agent never answers.
	consoleKeep = 64 << 10
)

func execCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "exec",
		Usage:        "run a command in a fresh VM through the guest agent",
		OnUsageError: onUsageError,
		UsageText: "microvm exec [--kernel K] [--cpus N] [--memory M] [--add SRC:DST]... [--env K=V]... " +
			"[--workdir DIR] [--timeout D] -- CMD [ARG...]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kernel", Usage: "guest kernel (default: build/kernel/bzImage next to the microvm binary's bin/, or $MICROVM_KERNEL)"},
			&cli.StringFlag{Name: "agent", Usage: "static guest agent binary (default: microvm-agent next to the microvm binary)"},
			&cli.StringFlag{Name: "busybox", Value: "/bin/busybox", Usage: "static busybox for sh and the core utilities in the guest (\"\" leaves it out)"},
			&cli.IntFlag{Name: "cpus", Value: microvm.DefaultCPUs, Usage: fmt.Sprintf("number of vCPUs (1..%d)", microvm.MaxCPUs)},
			&cli.StringFlag{Name: "memory", Value: microvm.FormatSize(microvm.DefaultMemory), Usage: "guest RAM (SIZE)"},
			&cli.StringSliceFlag{Name: "add", Usage: "copy host file or directory SRC to guest path DST (repeatable)"},
			&cli.StringSliceFlag{Name: "env", Usage: "set K=V in the command's environment (repeatable)"},
			&cli.StringFlag{Name: "workdir", Value: "/", Usage: "the command's working directory in the guest"},
			&cli.DurationFlag{Name: "timeout", Usage: "kill the command's process group after this long (0: no limit)"},
			&cli.DurationFlag{Name: "boot-timeout", Value: 2 * time.Minute, Usage: "how long to wait for the agent to answer"},
			logFlag(),
		},
		Action: func(c *cli.Context) error {
			log, err := setupLog(c, stderr)
			if err != nil {
				return err
			}
			o, err := execOptions(c)
			if err != nil {
				return err
			}
			o.stdin, o.stdout, o.stderr, o.log = stdin, stdout, stderr, log
			return runExec(o)
		},
	}
}

// execOpts is a checked exec command line.
type execOpts struct {
	argv        []string
	kernel      string
	image       agentimage.Options
	cpus        int
	memory      uint64
	env         []string
	workdir     string
	timeout     time.Duration
	bootTimeout time.Duration

	stdin          io.Reader
	stdout, stderr io.Writer
	log            logrus.FieldLogger
}

func execOptions(c *cli.Context) (*execOpts, error) {
	o := &execOpts{argv: c.Args().Slice(), cpus: c.Int("cpus"), workdir: c.String("workdir"),
		timeout: c.Duration("timeout"), bootTimeout: c.Duration("boot-timeout")}
	if len(o.argv) == 0 {
		return nil, usagef("exec: no command given (microvm exec [flags] -- CMD [ARG...])")
	}
	mem, err := microvm.ParseSize(c.String("memory"))
	if err != nil {
		return nil, usagef("--memory: %v", err)
	}
	o.memory = mem
	if o.cpus < 1 || o.cpus > microvm.MaxCPUs {
		return nil, usagef("--cpus %d: want 1..%d", o.cpus, microvm.MaxCPUs)
	}
	if o.timeout < 0 || o.bootTimeout <= 0 {
		return nil, usagef("--timeout must not be negative and --boot-timeout must be positive")
	}
	if !strings.HasPrefix(o.workdir, "/") {
		return nil, usagef("--workdir %q: want an absolute guest path", o.workdir)
	}
	for _, a := range c.StringSlice("add") {
		f, err := agentimage.ParseAdd(a)
		if err != nil {
			return nil, usageError{err}
		}
		o.image.Files = append(o.image.Files, f)
	}
	o.env = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root"}
	for _, e := range c.StringSlice("env") {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, usagef("--env %q: want K=V", e)
		}
		o.env = append(o.env, e)
	}
	exe, _ := os.Executable()
	binDir := filepath.Dir(exe)
	o.kernel = c.String("kernel")
	if o.kernel == "" {
		o.kernel = os.Getenv("MICROVM_KERNEL")
	}
	if o.kernel == "" {
		o.kernel = filepath.Join(binDir, "..", "build", "kernel", "bzImage")
	}
	o.image.Agent = c.String("agent")
	if o.image.Agent == "" {
		o.image.Agent = filepath.Join(binDir, "microvm-agent")
	}
	o.image.Busybox = c.String("busybox")
	return o, nil
}

// runExec boots the VM, waits for the agent, runs the command and returns
// its exit status as a statusError (128+signal for a signal).
func runExec(o *execOpts) error {
	dir, err := os.MkdirTemp("", "microvm-exec-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := writeImage(initrd, o.image); err != nil {
		return fmt.Errorf("exec: guest image: %w", err)
	}
	uds := filepath.Join(dir, "v.sock")
	console := &tailBuffer{max: consoleKeep}
	m, err := microvm.New(microvm.Config{
		Kernel: o.kernel, Initrd: initrd, CPUs: o.cpus, MemoryBytes: o.memory,
		Cmdline: "console=ttyS0 reboot=k panic=-1 quiet",
		Console: console, Log: o.log,
		Vsock: &microvm.VsockConfig{CID: execCID, UDSPath: uds},
	})
	if err != nil {
		return err
	}
	defer m.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var got syscall.Signal
	var gotMu sync.Mutex
	go func() {
		select {
		case s := <-sigs:
			gotMu.Lock()
			got, _ = s.(syscall.Signal)
			gotMu.Unlock()
			cancel()
		case <-ctx.Done():
		}
	}()
	signalled := func() error {
		gotMu.Lock()
		defer gotMu.Unlock()
		if got != 0 {
			o.log.Warnf("stopped by %v", got)
			return statusError{128 + int(got)}
		}
		return nil
	}

	vmDone := make(chan struct{})
	var res microvm.Result
	var runErr error
	go func() {
		defer close(vmDone)
		res, runErr = m.Run(ctx)
	}()
	defer func() { cancel(); <-vmDone }()

	if err := waitAgent(ctx, uds, o.bootTimeout, vmDone); err != nil {
		if serr := signalled(); serr != nil {
			return serr
		}
		select {
		case <-vmDone:
			err = fmt.Errorf("%w (the VM ended: %v, status %d, %v)", err, res.Kind, res.Status, runErr)
		default:
		}
		return fmt.Errorf("exec: %w; guest console:\n%s", err, strings.TrimRight(console.String(), "\n"))
	}
	cc, err := grpc.NewClient("passthrough:///microvm-agent",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return hybridvsock.Dial(ctx, uds, agentPort)
		}))
	if err != nil {
		return fmt.Errorf("exec: agent client: %w", err)
	}
	defer cc.Close()
	st, err := agentapi.NewClient(cc).Exec(ctx, &agentapi.Cmd{
		Argv: o.argv, Env: o.env, Dir: o.workdir, Timeout: o.timeout,
		Stdin: o.stdin, Stdout: o.stdout, Stderr: o.stderr,
	})
	if serr := signalled(); serr != nil {
		return serr
	}
	if err != nil {
		if status.Code(err) == codes.NotFound {
			fmt.Fprintf(o.stderr, "microvm: exec: %s: not found in the guest\n", o.argv[0])
			return statusError{127}
		}
		return fmt.Errorf("exec: %w", err)
	}
	if st.TimedOut {
		fmt.Fprintf(o.stderr, "microvm: exec: %s: killed after --timeout %v\n", o.argv[0], o.timeout)
	}
	switch {
	case st.Signal != 0:
		return statusError{128 + int(st.Signal)}
	case st.Code != 0:
		return statusError{int(st.Code)}
	}
	return nil
}

// waitAgent dials the agent until it answers, the VM ends or the boot
// timeout passes. Before the agent listens the VMM refuses the CONNECT.
func waitAgent(ctx context.Context, uds string, timeout time.Duration, vmDone <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, err := hybridvsock.Dial(ctx, uds, agentPort)
		if err == nil {
			c.Close()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the guest agent did not answer on vsock port %d within %v: %w", agentPort, timeout, err)
		}
		select {
		case <-vmDone:
			return errors.New("the VM ended before its agent answered")
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func writeImage(path string, o agentimage.Options) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = agentimage.Build(f, o)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
