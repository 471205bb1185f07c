package vhufront

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"time"
)

// The peer is the host program on the other end of every stream, run as a
// process of its own (the generator's -peer mode) so that the host side of
// a vsock stream and both ends of the AF_UNIX reference are separate
// processes, as they are in real use. The generator drives it over its
// stdin and stdout, one JSON object per line: a PeerCmd in; a PeerReply
// with Ready once it is connected or listening, then one with the result.

// Peer roles.
const (
	RoleSource = "source" // HostSource
	RoleSink   = "sink"   // HostSink
	RolePing   = "ping"   // HostPing
	RoleEcho   = "echo"   // HostEcho
)

// PeerCmd is one stream for the peer to run.
type PeerCmd struct {
	Role string `json:"role"`
	// Dial connects to this socket; with Port, through the vsock
	// handshake (CONNECT Port). Listen instead listens there and accepts
	// one connection.
	Dial   string `json:"dial,omitempty"`
	Port   uint32 `json:"port,omitempty"`
	Listen string `json:"listen,omitempty"`

	Payload  int           `json:"payload"`
	ReadSize int           `json:"read_size,omitempty"` // sink reads (default 64 KiB)
	Duration time.Duration `json:"duration,omitempty"`  // source, ping
	MaxMsgs  int           `json:"max_msgs,omitempty"`  // ping
	Timeout  time.Duration `json:"timeout"`             // bounds every wait
}

// PeerReply is the peer's answer: Ready, then the result.
type PeerReply struct {
	Ready    bool      `json:"ready,omitempty"`
	Transfer *Transfer `json:"transfer,omitempty"`
	RTTs     []int64   `json:"rtts,omitempty"`
	Err      string    `json:"error,omitempty"`
}

// ServePeer runs commands from in until it ends, answering on out.
func ServePeer(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		var cmd PeerCmd
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			return fmt.Errorf("peer: bad command %q: %w", sc.Bytes(), err)
		}
		res := RunPeerCmd(cmd, func() { _ = enc.Encode(PeerReply{Ready: true}) })
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	return sc.Err()
}

// RunPeerCmd runs one command, calling ready once connected or listening.
func RunPeerCmd(cmd PeerCmd, ready func()) PeerReply {
	if cmd.Timeout <= 0 {
		cmd.Timeout = 10 * time.Second
	}
	fail := func(err error) PeerReply { return PeerReply{Err: err.Error()} }
	var c *net.UnixConn
	switch {
	case cmd.Listen != "":
		l, err := ListenUnix(cmd.Listen)
		if err != nil {
			ready()
			return fail(err)
		}
		ready()
		if c, err = AcceptOne(l, cmd.Timeout); err != nil {
			return fail(err)
		}
	case cmd.Dial != "":
		ready()
		var err error
		if cmd.Port != 0 {
			c, _, err = DialVsock(cmd.Dial, cmd.Port, cmd.Timeout)
		} else {
			c, err = DialUnix(cmd.Dial, cmd.Timeout)
		}
		if err != nil {
			return fail(err)
		}
	default:
		ready()
		return fail(errors.New("peer: command without dial or listen"))
	}
	defer c.Close()
	var res PeerReply
	var err error
	switch cmd.Role {
	case RoleSource:
		var t Transfer
		t, err = HostSource(c, cmd.Payload, cmd.Duration, cmd.Timeout)
		res.Transfer = &t
	case RoleSink:
		rs := cmd.ReadSize
		if rs <= 0 {
			rs = MaxPayload
		}
		var t Transfer
		t, err = HostSink(c, rs, cmd.Duration+cmd.Timeout)
		res.Transfer = &t
	case RolePing:
		res.RTTs, err = HostPing(c, cmd.Payload, cmd.Duration, cmd.MaxMsgs, cmd.Timeout)
	case RoleEcho:
		err = HostEcho(c, cmd.Duration+cmd.Timeout)
	default:
		err = fmt.Errorf("peer: unknown role %q", cmd.Role)
	}
	if err != nil {
		res.Err = err.Error()
	}
	return res
}

// Peer is a running peer process, driven by one goroutine.
type Peer struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan []byte
	// exitErr is why the peer's output ended; set before lines is closed.
	exitErr error
	// busy: a command was begun and its result not yet read.
	busy bool
}

// StartPeer starts the peer process cmd (whose stdin and stdout must be
// unset: they become the command channel).
func StartPeer(cmd *exec.Cmd) (*Peer, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the peer: %w", err)
	}
	p := &Peer{cmd: cmd, in: in, lines: make(chan []byte, 4)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<16), 64<<20) // RTT lists are long lines
		for sc.Scan() {
			p.lines <- append([]byte(nil), sc.Bytes()...)
		}
		p.exitErr = sc.Err()
		if p.exitErr == nil {
			p.exitErr = io.EOF
		}
		close(p.lines)
	}()
	return p, nil
}

func (p *Peer) next(timeout time.Duration) (PeerReply, error) {
	var r PeerReply
	select {
	case l, ok := <-p.lines:
		if !ok {
			return r, fmt.Errorf("peer exited: %v", p.exitErr)
		}
		if err := json.Unmarshal(l, &r); err != nil {
			return r, fmt.Errorf("peer said %q: %w", l, err)
		}
		return r, nil
	case <-time.After(timeout):
		return r, fmt.Errorf("peer did not answer within %v", timeout)
	}
}

// Begin sends cmd and waits until the peer is connected or listening.
// Pid is the peer process's id, for reading what it used (/proc).
func (p *Peer) Pid() int { return p.cmd.Process.Pid }

func (p *Peer) Begin(cmd PeerCmd) error {
	if p.busy {
		return errors.New("peer: a command is still running")
	}
	b, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	p.busy = true
	r, err := p.next(cmd.Timeout + 5*time.Second)
	if err != nil {
		return err
	}
	if !r.Ready {
		return fmt.Errorf("peer answered %+v, want ready", r)
	}
	return nil
}

// End waits for the result of the command begun last.
func (p *Peer) End(timeout time.Duration) (PeerReply, error) {
	r, err := p.next(timeout)
	if err != nil {
		return r, err
	}
	p.busy = false
	if r.Err != "" {
		return r, errors.New("peer: " + r.Err)
	}
	return r, nil
}

// Close ends the peer (closing its stdin) and waits for it, killing it
// after timeout.
func (p *Peer) Close(timeout time.Duration) error {
	_ = p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		return <-done
	}
}
