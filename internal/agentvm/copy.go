package agentvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/dirtar"
	"github.com/microvm/microvm/vsock/hybrid"
)

// Addr is where an agent listens: a running VM's hybrid-vsock Unix socket
// and the agent's port there.
type Addr struct {
	UDS  string
	Port uint32
	// Timeout bounds the wait for the agent to accept.
	Timeout time.Duration
}

// Dial connects to the agent, waiting up to a.Timeout for it to accept. A
// socket that does not exist fails at once: the VM is not running (or the
// path is wrong), and waiting would not change that.
func (a Addr) Dial(ctx context.Context) (*agentapi.Conn, error) {
	if _, err := os.Stat(a.UDS); err != nil {
		return nil, fmt.Errorf("--uds %s: %w (is the VM running? give its --vsock-uds)", a.UDS, unwrapPathError(err))
	}
	ctx, cancel := context.WithTimeoutCause(ctx, a.Timeout,
		fmt.Errorf("no agent accepted on vsock port %d within --connect-timeout %v", a.Port, a.Timeout))
	defer cancel()
	return agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) { return hybrid.Dial(ctx, a.UDS, a.Port) })
}

// unwrapPathError drops *os.PathError's operation and path, which the
// message already names.
func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// GuestPrefix marks the guest side of a copy ("guest:/PATH").
const GuestPrefix = "guest:"

// Copy is one file or directory tree copied into or out of a VM through
// its agent.
type Copy struct {
	ToGuest bool
	Guest   string // absolute guest path, a file name
	Host    string // host path, or "-" for stdin or stdout
	// KeepSpecial keeps the guest's 07000 bits on what is copied out
	// (--keep-setuid); a tar archive on stdout is passed on unchanged.
	KeepSpecial bool
}

// Run opens the host side first, so that a host-side mistake is reported
// without touching the VM, then dials the agent and copies. Copied into
// the guest, a file keeps its mode bits (0644 from stdin) and a directory
// becomes the guest path (merged into it when it exists); copied out, a
// file is written to a temporary file beside the host path and renamed,
// a directory is extracted (a tar archive on stdout, for "-").
func (cp Copy) Run(ctx context.Context, a Addr, stdin io.Reader, stdout io.Writer) error {
	if cp.ToGuest {
		return cp.put(ctx, a, stdin)
	}
	if cp.Host == "-" {
		_, err := cp.get(ctx, a, stdout)
		if isNotRegular(err) { // a directory: a tar archive on stdout, as docker cp writes
			err = cp.getTree(ctx, a, stdout)
		}
		return err
	}
	target := cp.Host
	if st, err := os.Stat(target); err == nil && st.IsDir() {
		target = filepath.Join(target, path.Base(cp.Guest))
	}
	dir := filepath.Dir(target)
	if st, err := os.Stat(dir); err != nil {
		return HostSideError{fmt.Errorf("destination %s: %w", cp.Host, err)}
	} else if !st.IsDir() {
		return HostSideError{fmt.Errorf("destination %s: %s is not a directory", cp.Host, dir)}
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(target)+".microvm-*")
	if err != nil {
		return HostSideError{err}
	}
	mode, err := cp.get(ctx, a, f)
	if !cp.KeepSpecial {
		mode &^= fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky
	}
	if err == nil {
		if err = f.Chmod(mode); err != nil { // exactly the guest's bits, whatever the umask
			err = HostSideError{err}
		}
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = HostSideError{cerr}
	}
	if err == nil {
		if err = os.Rename(f.Name(), target); err != nil {
			err = HostSideError{err}
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
	var ge GuestError
	return errors.As(err, &ge) && status.Code(ge.Err) == codes.FailedPrecondition &&
		strings.Contains(Message(ge.Err), "not a regular file")
}

// getDir copies the guest directory to target: made whole in a temporary
// directory beside it and renamed into place when target does not exist
// (a failure leaves nothing), merged into it when it does (its own mode
// and time then stay). Owners are the copying user's; modes and times are
// the guest's, less 07000 unless KeepSpecial.
func (cp Copy) getDir(ctx context.Context, a Addr, target string) error {
	if _, err := os.Lstat(target); err == nil {
		return cp.getTreeInto(ctx, a, target)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(target), "."+filepath.Base(target)+".microvm-*")
	if err != nil {
		return HostSideError{err}
	}
	defer os.RemoveAll(tmp)
	// Extracted into a directory it makes, so that the tree's top gets the
	// guest directory's mode (Extract keeps an existing one's).
	made := filepath.Join(tmp, "d")
	if err := cp.getTreeInto(ctx, a, made); err != nil {
		return err
	}
	if err := os.Rename(made, target); err != nil {
		return HostSideError{err}
	}
	return nil
}

// getTreeInto extracts the guest tree into dir as it streams.
func (cp Copy) getTreeInto(ctx context.Context, a Addr, dir string) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := dirtar.Extract(pr, dir, dirtar.Options{KeepSpecial: cp.KeepSpecial})
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
		return HostSideError{fmt.Errorf("%s: %w", dir, xerr)}
	}
	return nil
}

// getTree writes the guest tree to w as a tar archive.
func (cp Copy) getTree(ctx context.Context, a Addr, w io.Writer) error {
	cc, err := a.Dial(ctx)
	if err != nil {
		return err
	}
	defer cc.Close()
	if err := agentapi.NewClient(cc).GetTree(ctx, cp.Guest, w); err != nil {
		return GuestError{cp.Guest, err}
	}
	return nil
}

// putDir copies a host directory to the guest path, which it becomes (made
// when missing, merged into when it exists).
func (cp Copy) putDir(ctx context.Context, a Addr) error {
	cc, err := a.Dial(ctx)
	if err != nil {
		return err
	}
	defer cc.Close()
	pr, pw := io.Pipe()
	go func() {
		_, err := dirtar.Write(pw, cp.Host)
		if err != nil {
			err = HostSideError{err}
		}
		pw.CloseWithError(err)
	}()
	_, err = agentapi.NewClient(cc).PutTree(ctx, cp.Guest, pr)
	pr.Close()
	if err != nil {
		var hs HostSideError
		if errors.As(err, &hs) {
			return hs
		}
		return GuestError{cp.Guest, err}
	}
	return nil
}

// put copies the host side (a regular file, or stdin) to the guest.
func (cp Copy) put(ctx context.Context, a Addr, stdin io.Reader) error {
	r, mode := stdin, fs.FileMode(0o644)
	if cp.Host != "-" {
		f, err := os.Open(cp.Host)
		if err != nil {
			return HostSideError{err}
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return HostSideError{err}
		}
		if st.IsDir() {
			return cp.putDir(ctx, a)
		}
		if !st.Mode().IsRegular() {
			return HostSideError{fmt.Errorf("%s: not a regular file", cp.Host)}
		}
		r, mode = f, st.Mode()
	}
	cc, err := a.Dial(ctx)
	if err != nil {
		return err
	}
	defer cc.Close()
	if _, err := agentapi.NewClient(cc).PutFile(ctx, cp.Guest, mode, true, r); err != nil {
		return GuestError{cp.Guest, err}
	}
	return nil
}

// get copies the guest file to w and returns its mode bits.
func (cp Copy) get(ctx context.Context, a Addr, w io.Writer) (fs.FileMode, error) {
	cc, err := a.Dial(ctx)
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	mode, err := agentapi.NewClient(cc).GetFile(ctx, cp.Guest, w)
	if err != nil {
		return 0, GuestError{cp.Guest, err}
	}
	return mode, nil
}

// GuestError is a failed agent call on a guest file, told in one short
// line ("guest:/x: no such file or directory") rather than with the whole
// gRPC status. Unwrap gives the call's error.
type GuestError struct {
	Path string
	Err  error
}

func (e GuestError) Error() string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(e.Err, &se) {
		return GuestPrefix + e.Path + ": " + e.Err.Error()
	}
	msg := se.GRPCStatus().Message()
	// The agent's own messages read "agent: OP PATH: cause"; the cause is
	// what is news here.
	if strings.HasPrefix(msg, "agent: ") {
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
	}
	return GuestPrefix + e.Path + ": " + msg
}

func (e GuestError) Unwrap() error { return e.Err }

// HostSideError marks a copy's error on the host's side of it (the local
// file), which, as for cp(1), is the copy's problem rather than a failure
// of the VM.
type HostSideError struct{ Err error }

func (e HostSideError) Error() string { return e.Err.Error() }
func (e HostSideError) Unwrap() error { return e.Err }

// IsHostSide says whether err is the local side's.
func IsHostSide(err error) bool {
	var h HostSideError
	return errors.As(err, &h)
}

// IsFileProblem says whether an agent call failed because of the guest
// file it was asked about (missing, not permitted, not a regular file, a
// bad path) rather than because of the agent or the VM.
func IsFileProblem(err error) bool {
	var ge GuestError
	if !errors.As(err, &ge) {
		return false
	}
	switch status.Code(ge.Err) {
	case codes.NotFound, codes.PermissionDenied, codes.FailedPrecondition, codes.InvalidArgument, codes.AlreadyExists:
		return true
	}
	return false
}
