package agentapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ChunkSize is the largest data chunk either side puts in one message.
const ChunkSize = 32 << 10

// ErrProtocol reports a message sequence that breaks the API's rules, such
// as an Exec stream that ends without an exit status.
var ErrProtocol = errors.New("agentapi: protocol violation")

// ErrAgentLost reports a call that failed because the connection to the
// agent broke or could not be made (gRPC's Unavailable): the agent process
// or its VM stopped, or the vsock connection was reset. The gRPC status
// stays reachable through errors.As and status.Code.
var ErrAgentLost = errors.New("lost the connection to the agent")

// callErr wraps a failed call's error for op, marking a broken connection
// with ErrAgentLost.
func callErr(op string, err error) error {
	if status.Code(err) == codes.Unavailable {
		return fmt.Errorf("agentapi: %s: %w: %w", op, ErrAgentLost, err)
	}
	return fmt.Errorf("agentapi: %s: %w", op, err)
}

// Client calls an agent. It is safe for concurrent use, as is the
// underlying connection.
type Client struct {
	// Agent is the generated client, for calls the helpers do not cover.
	Agent AgentClient
}

// NewClient returns a Client that calls the agent on cc.
func NewClient(cc grpc.ClientConnInterface) *Client {
	return &Client{Agent: NewAgentClient(cc)}
}

// SetMAC asks the agent to give the interface whose address is old the
// address mac (a restored clone's own; see the SetMAC call) and returns
// the interface's name.
func (c *Client) SetMAC(ctx context.Context, old, mac net.HardwareAddr) (string, error) {
	r, err := c.Agent.SetMAC(ctx, &SetMACRequest{Old: old, Mac: mac})
	if err != nil {
		return "", callErr("set MAC", err)
	}
	return r.GetInterface(), nil
}

// Cmd describes a process for Client.Exec.
type Cmd struct {
	Argv []string
	// Env is the complete environment; see ExecStart.env.
	Env []string
	// Dir is the working directory ("" means "/").
	Dir string
	// UID and GID, when not nil, are the process's credentials.
	UID, GID *uint32
	// Timeout > 0 makes the agent kill the process group after that long.
	// It is rounded up to a millisecond.
	Timeout time.Duration
	// Pty, when not nil, runs the process on a pseudo-terminal.
	Pty *PtySize
	// Resize, when not nil, carries new sizes of that terminal (a host
	// terminal's SIGWINCH), sent in order with stdin until the call ends.
	Resize <-chan *PtySize
	// Container, when not nil, runs the process in a container of the
	// guest; the fields after it apply to container processes only (see
	// ExecStart).
	Container       *Container
	Rlimits         []*Rlimit
	Capabilities    *Capabilities
	NoNewPrivileges bool
	AdditionalGIDs  []uint32
	Seccomp         *SeccompFilter

	// Stdin, when not nil, is copied to the process's standard input,
	// which is closed when Stdin returns io.EOF; a nil Stdin closes it at
	// once. Stdout and Stderr receive the output; nil discards it.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Exec runs cmd and returns how it ended. A process that exits non-zero or
// dies by a signal is not an error: the error is non-nil only when the
// call failed (a gRPC status: codes.NotFound for a missing binary,
// codes.InvalidArgument for a bad request, ...), when ctx ended, or when
// writing to Stdout or Stderr failed (the call is then cancelled, which
// kills the process group).
//
// Exec returns once the exit status has arrived; it does not wait for a
// Stdin.Read that is still blocked, whose data is then discarded.
func (c *Client) Exec(ctx context.Context, cmd *Cmd) (*ExitStatus, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Agent.Exec(ctx)
	if err != nil {
		return nil, callErr("exec", err)
	}
	start := &ExecStart{
		Argv: cmd.Argv, Env: cmd.Env, Dir: cmd.Dir,
		Uid: cmd.UID, Gid: cmd.GID, Pty: cmd.Pty,
		Container: cmd.Container, Rlimits: cmd.Rlimits, Capabilities: cmd.Capabilities,
		NoNewPrivileges: cmd.NoNewPrivileges, AdditionalGids: cmd.AdditionalGIDs,
		Seccomp: cmd.Seccomp,
	}
	if cmd.Timeout > 0 {
		start.TimeoutMs = uint64((cmd.Timeout + time.Millisecond - 1) / time.Millisecond)
	}
	if err := stream.Send(&ExecRequest{Msg: &ExecRequest_Start{Start: start}}); err != nil {
		return nil, execErr(stream, err)
	}
	// The stdin copier is the only sender from here on (gRPC allows one
	// sender and one receiver at a time). It ends when Stdin does or when
	// the stream is over (Send fails once ctx is cancelled on return).
	go sendInput(ctx, stream, cmd.Stdin, cmd.Resize)

	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return nil, fmt.Errorf("agentapi: exec: stream ended without exit status: %w", ErrProtocol)
		}
		if err != nil {
			return nil, callErr("exec", err)
		}
		switch m := resp.Msg.(type) {
		case *ExecResponse_Stdout:
			if err := write(cmd.Stdout, m.Stdout); err != nil {
				return nil, fmt.Errorf("agentapi: exec: write stdout: %w", err)
			}
		case *ExecResponse_Stderr:
			if err := write(cmd.Stderr, m.Stderr); err != nil {
				return nil, fmt.Errorf("agentapi: exec: write stderr: %w", err)
			}
		case *ExecResponse_Exit:
			if err := checkExit(m.Exit); err != nil {
				return nil, fmt.Errorf("agentapi: exec: %w", err)
			}
			return m.Exit, nil
		}
	}
}

// checkExit refuses an exit status no process can have (agent.proto:
// code 0..255 with signal 0, or code -1 with signal 1..64): the agent runs
// in the guest, and a caller turns Code or 128+Signal into its own exit
// status, where 256 would read as success.
func checkExit(st *ExitStatus) error {
	switch {
	case st == nil:
		return fmt.Errorf("no exit status in the exit message: %w", ErrProtocol)
	case st.Signal == 0 && (st.Code < 0 || st.Code > 255):
		return fmt.Errorf("exit status %d (want 0..255): %w", st.Code, ErrProtocol)
	case st.Signal != 0 && (st.Signal < 0 || st.Signal > maxSignal || st.Code != -1):
		return fmt.Errorf("signal %d with exit status %d (want 1..%d with -1): %w", st.Signal, st.Code, maxSignal, ErrProtocol)
	}
	return nil
}

// maxSignal is Linux's highest signal number (SIGRTMAX).
const maxSignal = 64

// execErr prefers the call's status to the local error of a failed Send:
// when the server ends the call, Send returns io.EOF and Recv the status.
func execErr(stream grpc.BidiStreamingClient[ExecRequest, ExecResponse], err error) error {
	if err == io.EOF {
		if _, rerr := stream.Recv(); rerr != nil && rerr != io.EOF {
			err = rerr
		}
	}
	return callErr("exec", err)
}

// sendInput is the call's one sender: stdin's chunks, then CloseStdin,
// and each size from resize as it comes. Stdin is read by a goroutine of
// its own (a Read may block for ever on a terminal), which ends when stdin
// does or when the call is over.
func sendInput(ctx context.Context, stream grpc.BidiStreamingClient[ExecRequest, ExecResponse], r io.Reader, resize <-chan *PtySize) {
	chunks := make(chan []byte)
	go func() {
		defer close(chunks)
		if r == nil {
			return
		}
		for {
			buf := make([]byte, ChunkSize) // gRPC may keep a sent message
			n, err := r.Read(buf)
			if n > 0 {
				select {
				case chunks <- buf[:n]:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				return // io.EOF or a failed Stdin: either way stdin ends
			}
		}
	}()
	for chunks != nil || resize != nil {
		select {
		case b, ok := <-chunks:
			if !ok {
				chunks = nil
				if stream.Send(&ExecRequest{Msg: &ExecRequest_CloseStdin{CloseStdin: &CloseStdin{}}}) != nil {
					return
				}
				if resize == nil {
					stream.CloseSend()
				}
				continue
			}
			if stream.Send(&ExecRequest{Msg: &ExecRequest_Stdin{Stdin: b}}) != nil {
				return
			}
		case sz, ok := <-resize:
			if !ok {
				resize = nil
				if chunks == nil {
					stream.CloseSend()
				}
				continue
			}
			if stream.Send(&ExecRequest{Msg: &ExecRequest_Resize{Resize: sz}}) != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func write(w io.Writer, b []byte) error {
	if w == nil {
		return nil
	}
	_, err := w.Write(b)
	return err
}

// PutFile writes r to path in the guest with permission bits mode, creating
// missing parent directories when makeParents is set, and returns the
// number of bytes written. The file appears (atomically) only if all of r
// was sent.
func (c *Client) PutFile(ctx context.Context, path string, mode fs.FileMode, makeParents bool, r io.Reader) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // on a failed read, cancelling discards the partial file
	stream, err := c.Agent.PutFile(ctx)
	if err != nil {
		return 0, callErr("put "+path, err)
	}
	hdr := &PutFileHeader{Path: path, Mode: ModeBits(mode), MakeParents: makeParents}
	if stream.Send(&PutFileRequest{Msg: &PutFileRequest_Header{Header: hdr}}) == nil {
		err := sendReader(r, func(b []byte) error { return stream.Send(&PutFileRequest{Msg: &PutFileRequest_Data{Data: b}}) })
		if err != nil {
			return 0, fmt.Errorf("agentapi: put %s: read source: %w", path, err)
		}
	}
	// A failed Send means the server ended the call: its status comes from
	// CloseAndRecv.
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return 0, callErr("put "+path, err)
	}
	return int64(resp.Size), nil
}

// GetFile copies the guest file at path to w and returns its permission
// bits.
func (c *Client) GetFile(ctx context.Context, path string, w io.Writer) (fs.FileMode, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Agent.GetFile(ctx, &GetFileRequest{Path: path})
	if err != nil {
		return 0, callErr("get "+path, err)
	}
	var info *FileInfo
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, callErr("get "+path, err)
		}
		switch m := resp.Msg.(type) {
		case *GetFileResponse_Info:
			info = m.Info
		case *GetFileResponse_Data:
			if info == nil {
				return 0, fmt.Errorf("agentapi: get %s: data before file info: %w", path, ErrProtocol)
			}
			if _, err := w.Write(m.Data); err != nil {
				return 0, fmt.Errorf("agentapi: get %s: write: %w", path, err)
			}
		}
	}
	if info == nil {
		return 0, fmt.Errorf("agentapi: get %s: no file info: %w", path, ErrProtocol)
	}
	return FileMode(info.Mode), nil
}

// ModeBits converts the permission, setuid, setgid and sticky bits of m to
// the Unix bits (07777) used on the wire.
func ModeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// FileMode converts Unix bits (07777) from the wire to an fs.FileMode.
func FileMode(b uint32) fs.FileMode {
	m := fs.FileMode(b & 0o777)
	if b&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if b&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if b&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// PutTree unpacks the tar archive r into dir in the guest (created when
// missing) and reports what was made. A failed read of r cancels the call.
func (c *Client) PutTree(ctx context.Context, dir string, r io.Reader) (*PutTreeResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Agent.PutTree(ctx)
	if err != nil {
		return nil, callErr("put tree "+dir, err)
	}
	if stream.Send(&PutTreeRequest{Msg: &PutTreeRequest_Dir{Dir: dir}}) == nil {
		err := sendReader(r, func(b []byte) error { return stream.Send(&PutTreeRequest{Msg: &PutTreeRequest_Data{Data: b}}) })
		if err != nil {
			return nil, fmt.Errorf("agentapi: put tree %s: read: %w", dir, err)
		}
	}
	// As for PutFile: after a failed Send the status comes from here.
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, callErr("put tree "+dir, err)
	}
	return resp, nil
}

// sendReader sends what r holds with send, in chunks of at most
// ChunkSize, until r ends or send fails (the server ended the call; the
// caller learns why from CloseAndRecv). It returns r's error, io.EOF
// aside.
func sendReader(r io.Reader, send func([]byte) error) error {
	for {
		buf := make([]byte, ChunkSize) // gRPC may keep a sent message
		n, err := r.Read(buf)
		if n > 0 && send(buf[:n]) != nil {
			return nil
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// GetTree writes the guest's directory (or file) at path to w as a tar
// archive, names relative to it.
func (c *Client) GetTree(ctx context.Context, path string, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Agent.GetTree(ctx, &GetTreeRequest{Path: path})
	if err != nil {
		return callErr("get tree "+path, err)
	}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return callErr("get tree "+path, err)
		}
		if _, err := w.Write(resp.Data); err != nil {
			return fmt.Errorf("agentapi: get tree %s: write: %w", path, err)
		}
	}
}
