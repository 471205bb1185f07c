//go:build !microvm_lean

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/dirtar"
)

// agentCommand groups the clients of the agent of a running VM: one
// started with `microvm run --vsock-uds PATH` from a `microvm initramfs`
// image, or any guest whose agent listens on the vsock port.
func agentCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "agent",
		Usage:        agentUsage,
		UsageText:    "microvm agent exec|cp --uds PATH [flags] ...",
		OnUsageError: onUsageError,
		Subcommands: []*cli.Command{
			agentExecCommand(stdin, stdout, stderr),
			agentCpCommand(stdin, stdout, stderr),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return usagef("agent: want a subcommand, exec or cp (see microvm agent --help)")
			}
			return usagef("agent: unknown subcommand %q (want exec or cp)", c.Args().First())
		},
	}
}

// agentDialFlags say where the agent is; readAgentAddr reads them.
func agentDialFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "uds", Usage: "the VM's vsock Unix socket (--vsock-uds of microvm run) (required)"},
		&cli.Uint64Flag{Name: "port", Value: agentPort, Usage: "the agent's guest vsock port"},
		&cli.DurationFlag{Name: "connect-timeout", Value: 5 * time.Second, Usage: "how long to wait for the agent to accept"},
	}, cliFlags(logFlags())...)
}

// agentAddr is where an agent listens.
type agentAddr struct {
	uds     string
	port    uint32
	timeout time.Duration
}

func readAgentAddr(c *cli.Context, name string) (agentAddr, error) {
	a := agentAddr{uds: c.String("uds"), port: uint32(c.Uint64("port")), timeout: c.Duration("connect-timeout")}
	if a.uds == "" {
		return a, usagef("%s: --uds PATH is required", name)
	}
	if c.Uint64("port") > 0xfffffffe {
		return a, usagef("%s: --port %d: want 0..4294967294", name, c.Uint64("port"))
	}
	if a.timeout <= 0 {
		return a, usagef("%s: --connect-timeout %v: want a positive duration", name, a.timeout)
	}
	return a, nil
}

// dial connects to the agent, waiting up to a.timeout for it to accept. A
// socket that does not exist fails at once: the VM is not running (or the
// path is wrong), and waiting would not change that.
func (a agentAddr) dial(ctx context.Context) (*agentapi.Conn, error) {
	if _, err := os.Stat(a.uds); err != nil {
		return nil, fmt.Errorf("--uds %s: %w (is the VM running? give its --vsock-uds)", a.uds, unwrapPathError(err))
	}
	ctx, cancel := context.WithTimeoutCause(ctx, a.timeout,
		fmt.Errorf("no agent accepted on vsock port %d within --connect-timeout %v", a.port, a.timeout))
	defer cancel()
	return agentapi.Connect(ctx, agentDialer(a.uds, a.port))
}

func agentExecCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "exec",
		Usage:        "run a command through the agent of a running VM",
		UsageText:    "microvm agent exec --uds PATH [--port N] [--env K=V]... [--workdir DIR] [--timeout D] -- CMD [ARG...]",
		OnUsageError: onUsageError,
		Flags:        concatFlags(agentDialFlags(), guestCmdFlags()),
		Action: func(c *cli.Context) error {
			const name = "agent exec"
			a, err := readAgentAddr(c, name)
			if err != nil {
				return err
			}
			cmd, err := readGuestCmd(c, name, "microvm agent exec --uds PATH [flags] -- CMD [ARG...]")
			if err != nil {
				return err
			}
			log, err := setupLog(c, stderr)
			if err != nil {
				return err
			}
			if err := checkTTY(cmd, stdin); err != nil {
				return err
			}
			cmd.stdin, cmd.stdout, cmd.stderr = stdin, stdout, stderr
			ctx, stop := interruptible(context.Background())
			defer stop()
			cc, err := a.dial(ctx)
			if err != nil {
				if serr := signalStatus(ctx, log); serr != nil {
					return serr
				}
				return failure{fmt.Errorf("%s: %w", name, err)}
			}
			defer cc.Close()
			return runInGuest(ctx, cc, name, cmd, log)
		},
	}
}

func agentCpCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "cp",
		Usage: "copy a file into or out of a running VM through its agent",
		Description: "Exactly one of SRC and DST is guest:/PATH. Copied into the guest, a file keeps its mode bits " +
			"(0644 from stdin) and gets missing parent directories; copied out, it is written to a temporary file " +
			"beside DST and renamed, without its setuid, setgid and sticky bits unless --keep-setuid. A DST ending " +
			"in / or naming a directory gets SRC's base name. - as the host side is stdin or stdout.",
		UsageText:    "microvm agent cp --uds PATH [--port N] SRC DST",
		OnUsageError: onUsageError,
		Flags:        append(agentDialFlags(), keepSetuidFlag),
		Action: func(c *cli.Context) error {
			a, err := readAgentAddr(c, "agent cp")
			if err != nil {
				return err
			}
			if c.NArg() != 2 {
				return usagef("agent cp: want SRC and DST, one of them guest:/PATH (got %d arguments)", c.NArg())
			}
			cp, err := parseCopy(c.Args().Get(0), c.Args().Get(1))
			if err != nil {
				return err
			}
			cp.keepSpecial = c.Bool(keepSetuidFlag.Name)
			log, err := setupLog(c, stderr)
			if err != nil {
				return err
			}
			return copyWithAgent("agent cp", cp, a, stdin, stdout, log)
		},
	}
}

// keepSetuidFlag is cp's opt-in to the guest's setuid, setgid and sticky
// bits on the host: off, a guest cannot plant a set-id program owned by
// whoever copies it out (root, often).
var keepSetuidFlag = &cli.BoolFlag{Name: "keep-setuid",
	Usage: "keep the setuid, setgid and sticky bits (07000) of what is copied out of the guest (cleared by default)"}

// guestPrefix marks the guest side of agent cp.
const guestPrefix = "guest:"

// copySpec is a checked agent cp command line.
type copySpec struct {
	toGuest bool
	guest   string // absolute guest path, a file name
	host    string // host path, or "-" for stdin or stdout
	// keepSpecial keeps the guest's 07000 bits on what is copied out
	// (--keep-setuid); a tar archive on stdout is passed on unchanged.
	keepSpecial bool
}

func parseCopy(src, dst string) (copySpec, error) {
	gsrc, srcIsGuest := strings.CutPrefix(src, guestPrefix)
	gdst, dstIsGuest := strings.CutPrefix(dst, guestPrefix)
	if srcIsGuest == dstIsGuest {
		return copySpec{}, usagef("agent cp: exactly one of SRC %q and DST %q must be %s/PATH", src, dst, guestPrefix)
	}
	cp := copySpec{toGuest: dstIsGuest, guest: gsrc, host: dst}
	if cp.toGuest {
		cp.guest, cp.host = gdst, src
	}
	if !path.IsAbs(cp.guest) {
		return cp, usagef("agent cp: guest path %q must be absolute", cp.guest)
	}
	if cp.host == "" {
		return cp, usagef("agent cp: empty host path (- means stdin or stdout)")
	}
	if cp.toGuest && strings.HasSuffix(cp.guest, "/") {
		if cp.host == "-" {
			return cp, usagef("agent cp: %s%s: name the guest file when copying from stdin", guestPrefix, cp.guest)
		}
		cp.guest += filepath.Base(cp.host)
	}
	return cp, nil
}

// run opens the host side first, so that a host-side mistake is reported
// without touching the VM, then dials the agent and copies.
func (cp copySpec) run(ctx context.Context, a agentAddr, stdin io.Reader, stdout io.Writer) error {
	if cp.toGuest {
		return cp.put(ctx, a, stdin)
	}
	if cp.host == "-" {
		_, err := cp.get(ctx, a, stdout)
		if isNotRegular(err) { // a directory: a tar archive on stdout, as docker cp writes
			err = cp.getTree(ctx, a, stdout)
		}
		return err
	}
	target := cp.host
	if st, err := os.Stat(target); err == nil && st.IsDir() {
		target = filepath.Join(target, path.Base(cp.guest))
	}
	dir := filepath.Dir(target)
	if st, err := os.Stat(dir); err != nil {
		return hostSideError{fmt.Errorf("destination %s: %w", cp.host, err)}
	} else if !st.IsDir() {
		return hostSideError{fmt.Errorf("destination %s: %s is not a directory", cp.host, dir)}
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(target)+".microvm-*")
	if err != nil {
		return hostSideError{err}
	}
	mode, err := cp.get(ctx, a, f)
	if !cp.keepSpecial {
		mode &^= fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky
	}
	if err == nil {
		if err = f.Chmod(mode); err != nil { // exactly the guest's bits, whatever the umask
			err = hostSideError{err}
		}
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = hostSideError{cerr}
	}
	if err == nil {
		if err = os.Rename(f.Name(), target); err != nil {
			err = hostSideError{err}
		}
	}
	if err != nil {
		os.Remove(f.Name())
	}
	if isNotRegular(err) {
		return cp.getDir(ctx, a, target)
	}
	return err
}

// isNotRegular says whether a guest copy failed because the guest path is
// not a regular file (a directory: copied as a tree instead).
func isNotRegular(err error) bool {
	var ge guestError
	return errors.As(err, &ge) && status.Code(ge.err) == codes.FailedPrecondition &&
		strings.Contains(agentMessage(ge.err), "not a regular file")
}

// getDir copies the guest directory to target: made whole in a temporary
// directory beside it and renamed into place when target does not exist
// (a failure leaves nothing), merged into it when it does (its own mode
// and time then stay). Owners are the copying user's; modes and times are
// the guest's, less 07000 unless keepSpecial.
func (cp copySpec) getDir(ctx context.Context, a agentAddr, target string) error {
	if _, err := os.Lstat(target); err == nil {
		return cp.getTreeInto(ctx, a, target)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(target), "."+filepath.Base(target)+".microvm-*")
	if err != nil {
		return hostSideError{err}
	}
	defer os.RemoveAll(tmp)
	// Extracted into a directory it makes, so that the tree's top gets the
	// guest directory's mode (Extract keeps an existing one's).
	made := filepath.Join(tmp, "d")
	if err := cp.getTreeInto(ctx, a, made); err != nil {
		return err
	}
	if err := os.Rename(made, target); err != nil {
		return hostSideError{err}
	}
	return nil
}

// getTreeInto extracts the guest tree into dir as it streams.
func (cp copySpec) getTreeInto(ctx context.Context, a agentAddr, dir string) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := dirtar.Extract(pr, dir, dirtar.Options{KeepSpecial: cp.keepSpecial})
		pr.CloseWithError(err) // a failed extraction stops the stream
		done <- err
	}()
	err := cp.getTree(ctx, a, pw)
	pw.CloseWithError(err)
	xerr := <-done
	if err != nil {
		return err
	}
	if xerr != nil {
		return hostSideError{fmt.Errorf("%s: %w", dir, xerr)}
	}
	return nil
}

// getTree writes the guest tree to w as a tar archive.
func (cp copySpec) getTree(ctx context.Context, a agentAddr, w io.Writer) error {
	cc, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer cc.Close()
	if err := agentapi.NewClient(cc).GetTree(ctx, cp.guest, w); err != nil {
		return guestError{cp.guest, err}
	}
	return nil
}

// putDir copies a host directory to the guest path, which it becomes (made
// when missing, merged into when it exists).
func (cp copySpec) putDir(ctx context.Context, a agentAddr) error {
	cc, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer cc.Close()
	pr, pw := io.Pipe()
	go func() {
		_, err := dirtar.Write(pw, cp.host)
		if err != nil {
			err = hostSideError{err}
		}
		pw.CloseWithError(err)
	}()
	_, err = agentapi.NewClient(cc).PutTree(ctx, cp.guest, pr)
	pr.Close()
	if err != nil {
		var hs hostSideError
		if errors.As(err, &hs) {
			return hs
		}
		return guestError{cp.guest, err}
	}
	return nil
}

// put copies the host side (a regular file, or stdin) to the guest.
func (cp copySpec) put(ctx context.Context, a agentAddr, stdin io.Reader) error {
	r, mode := stdin, fs.FileMode(0o644)
	if cp.host != "-" {
		f, err := os.Open(cp.host)
		if err != nil {
			return hostSideError{err}
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return hostSideError{err}
		}
		if st.IsDir() {
			return cp.putDir(ctx, a)
		}
		if !st.Mode().IsRegular() {
			return hostSideError{fmt.Errorf("%s: not a regular file", cp.host)}
		}
		r, mode = f, st.Mode()
	}
	cc, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer cc.Close()
	if _, err := agentapi.NewClient(cc).PutFile(ctx, cp.guest, mode, true, r); err != nil {
		return guestError{cp.guest, err}
	}
	return nil
}

// get copies the guest file to w and returns its mode bits.
func (cp copySpec) get(ctx context.Context, a agentAddr, w io.Writer) (fs.FileMode, error) {
	cc, err := a.dial(ctx)
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	mode, err := agentapi.NewClient(cc).GetFile(ctx, cp.guest, w)
	if err != nil {
		return 0, guestError{cp.guest, err}
	}
	return mode, nil
}

// guestError is a failed agent call on a guest file, told in one short
// line ("guest:/x: no such file or directory") rather than with the whole
// gRPC status. Unwrap gives the call's error.
type guestError struct {
	path string
	err  error
}

func (e guestError) Error() string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(e.err, &se) {
		return guestPrefix + e.path + ": " + e.err.Error()
	}
	msg := se.GRPCStatus().Message()
	// The agent's own messages read "agent: OP PATH: cause"; the cause is
	// what is news here.
	if strings.HasPrefix(msg, "agent: ") {
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
	}
	return guestPrefix + e.path + ": " + msg
}

func (e guestError) Unwrap() error { return e.err }

// hostSideError marks a copy's error on the host's side of it (the local
// file), which, as for cp(1), is status 1 rather than a failure of the VM.
type hostSideError struct{ err error }

func (e hostSideError) Error() string { return e.err.Error() }
func (e hostSideError) Unwrap() error { return e.err }

// isHostSide says whether err is the local side's.
func isHostSide(err error) bool {
	var h hostSideError
	return errors.As(err, &h)
}

// fileProblem says whether an agent call failed because of the file it was
// asked about (missing, not permitted, not a regular file, a bad path)
// rather than because of the agent or the VM.
func fileProblem(c codes.Code) bool {
	switch c {
	case codes.NotFound, codes.PermissionDenied, codes.FailedPrecondition, codes.InvalidArgument, codes.AlreadyExists:
		return true
	}
	return false
}

// copyWithAgent carries out cp through the agent at a, and turns its end
// into a status: 1 when a file is the problem (on either side, as cp(1)),
// a failure (125) when the agent or the VM is.
func copyWithAgent(name string, cp copySpec, a agentAddr, stdin io.Reader, stdout io.Writer, log logrus.FieldLogger) error {
	ctx, stop := interruptible(context.Background())
	defer stop()
	err := cp.run(ctx, a, stdin, stdout)
	if serr := signalStatus(ctx, log); serr != nil {
		return serr
	}
	var ge guestError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ge) && fileProblem(status.Code(ge.err)):
		// The guest file is the problem, as for cp(1): status 1.
		return fmt.Errorf("%s: %w", name, err)
	case isHostSide(err):
		return fmt.Errorf("%s: %w", name, err)
	}
	return failure{fmt.Errorf("%s: %w", name, err)}
}
