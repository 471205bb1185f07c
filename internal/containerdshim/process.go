package containerdshim

import (
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/fifo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// stdio are the FIFO paths containerd gives a process ("" for none).
type stdio struct {
	stdin, stdout, stderr string
	terminal              bool
}

// processState is where a process is in its life; it only moves forward.
type processState int

const (
	created processState = iota
	running
	stopped
)

// process is one container process (its init or an exec) running in the
// guest through one agent Exec stream. Goroutines, all started by start
// and all ended by the stream's end: the receiver (owns the stream's Recv,
// the stdout and stderr FIFOs, and the exit), the sender (owns the
// stream's Send, fed by reqs) and the stdin copier (the stdin FIFO into
// reqs). mu guards the state fields; no call is made under it.
type process struct {
	execID string // "" for the container's init process
	io     stdio
	start  *agentapi.ExecStart

	reqs chan *agentapi.ExecRequest // to the sender; buffered
	done chan struct{}              // closed once stopped

	mu       sync.Mutex
	cancel   context.CancelFunc // ends the stream, once started
	state    processState
	exitCode uint32
	exitedAt time.Time
}

func newProcess(execID string, io stdio, st *agentapi.ExecStart) *process {
	return &process{execID: execID, io: io, start: st,
		reqs: make(chan *agentapi.ExecRequest, 16), done: make(chan struct{})}
}

// status returns the process's state and, once stopped, how it ended.
func (p *process) status() (processState, uint32, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state, p.exitCode, p.exitedAt
}

// run starts the process in the guest through client; onExit runs once,
// on the receiver goroutine, after the exit status is recorded and the
// output FIFOs closed.
func (p *process) run(ctx context.Context, client agentapi.AgentClient, onExit func(*process)) error {
	p.mu.Lock()
	if p.state != created {
		p.mu.Unlock()
		return fmt.Errorf("%w: process already started", errdefs.ErrFailedPrecondition)
	}
	p.state = running
	p.mu.Unlock()

	openCtx, openCancel := context.WithTimeout(ctx, 30*time.Second)
	defer openCancel()
	var out, errw, in io.ReadWriteCloser
	var err error
	if p.io.stdout != "" {
		if out, err = fifo.OpenFifo(openCtx, p.io.stdout, syscall.O_WRONLY, 0); err != nil {
			return p.failStart(fmt.Errorf("stdout: %w", err), onExit)
		}
	}
	if p.io.stderr != "" && !p.io.terminal {
		if errw, err = fifo.OpenFifo(openCtx, p.io.stderr, syscall.O_WRONLY, 0); err != nil {
			closeAll(out)
			return p.failStart(fmt.Errorf("stderr: %w", err), onExit)
		}
	}
	if p.io.stdin != "" {
		if in, err = fifo.OpenFifo(context.Background(), p.io.stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			closeAll(out, errw)
			return p.failStart(fmt.Errorf("stdin: %w", err), onExit)
		}
	}
	sctx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	p.cancel = cancel
	p.mu.Unlock()
	stream, err := client.Exec(sctx)
	if err == nil {
		err = stream.Send(&agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Start{Start: p.start}})
	}
	if err != nil {
		cancel()
		closeAll(out, errw, in)
		return p.failStart(fmt.Errorf("agent: %w", err), onExit)
	}
	go p.send(sctx, stream)
	if in != nil {
		go p.copyStdin(sctx, in)
	} else {
		p.closeStdin()
	}
	// Start returns once the agent has answered: the process runs (for a
	// container's init: its namespaces and mounts are set up, so an exec
	// that follows can join them), or it failed, which receive reports as
	// its exit.
	answered := make(chan struct{})
	go p.receive(stream, out, errw, in, answered, onExit)
	select {
	case <-answered:
	case <-ctx.Done():
	}
	return nil
}

// failStart records a process that never reached the guest.
func (p *process) failStart(err error, onExit func(*process)) error {
	p.exit(255)
	onExit(p)
	return fmt.Errorf("start: %w", err)
}

// send is the only caller of stream.Send after the start message.
func (p *process) send(ctx context.Context, stream agentapi.Agent_ExecClient) {
	for {
		select {
		case r := <-p.reqs:
			if stream.Send(r) != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// copyStdin feeds the stdin FIFO to the guest, then closes its stdin.
func (p *process) copyStdin(ctx context.Context, in io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			if !p.request(ctx, &agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Stdin{Stdin: chunk}}) {
				return
			}
		}
		if err != nil {
			p.closeStdin()
			return
		}
	}
}

// request queues r for the sender; false once the stream is over.
func (p *process) request(ctx context.Context, r *agentapi.ExecRequest) bool {
	select {
	case p.reqs <- r:
		return true
	case <-ctx.Done():
		return false
	case <-p.done:
		return false
	}
}

func (p *process) closeStdin() {
	p.request(context.Background(), &agentapi.ExecRequest{Msg: &agentapi.ExecRequest_CloseStdin{CloseStdin: &agentapi.CloseStdin{}}})
}

// receive copies output to the FIFOs until the exit status arrives or the
// stream fails, then records the exit.
// answered is closed at the first message or error.
func (p *process) receive(stream agentapi.Agent_ExecClient, out, errw io.WriteCloser, in io.Closer, answered chan struct{}, onExit func(*process)) {
	code := uint32(255)
	var once sync.Once
	answer := func() { once.Do(func() { close(answered) }) }
	defer answer()
recv:
	for {
		r, err := stream.Recv()
		answer()
		if err != nil {
			code = failedExit(err)
			if errw != nil {
				fmt.Fprintf(errw, "microvm: %s: %v\n", p.start.Argv[0], status.Convert(err).Message())
			}
			break
		}
		// A reader gone away loses the output, as with runc.
		switch m := r.Msg.(type) {
		case *agentapi.ExecResponse_Stdout:
			if out != nil {
				out.Write(m.Stdout)
			}
		case *agentapi.ExecResponse_Stderr:
			if errw != nil {
				errw.Write(m.Stderr)
			}
		case *agentapi.ExecResponse_Exit:
			code = uint32(m.Exit.Code)
			if m.Exit.Signal != 0 {
				code = 128 + uint32(m.Exit.Signal)
			}
			break recv
		}
	}
	p.end()
	closeAll(out, errw, in)
	p.exit(code)
	onExit(p)
}

// failedExit is the exit status of a process whose stream failed before
// its exit status came: a shell's 127 and 126 for a command that was not
// found or could not run, 137 (SIGKILL) when the guest went away.
func failedExit(err error) uint32 {
	switch status.Code(err) {
	case codes.NotFound:
		return 127
	case codes.PermissionDenied, codes.FailedPrecondition:
		return 126
	case codes.Unavailable, codes.Canceled:
		return 137
	}
	return 255
}

// exit records the exit status; only the first call counts.
func (p *process) exit(code uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stopped {
		return
	}
	p.state, p.exitCode, p.exitedAt = stopped, code, time.Now()
	close(p.done)
}

// signal sends sig to the process group in the guest. A process that was
// created and never started just counts as killed.
func (p *process) signal(sig uint32) error {
	st, _, _ := p.status()
	switch st {
	case created:
		p.exit(128 + sig)
		return nil
	case stopped:
		return fmt.Errorf("%w: process already finished", errdefs.ErrNotFound)
	}
	if !p.request(context.Background(), &agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Signal{Signal: int32(sig)}}) {
		return fmt.Errorf("%w: process already finished", errdefs.ErrNotFound)
	}
	return nil
}

// resize changes the terminal's size.
func (p *process) resize(w, h uint32) error {
	if !p.io.terminal {
		return fmt.Errorf("%w: the process has no terminal", errdefs.ErrFailedPrecondition)
	}
	p.request(context.Background(), &agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Resize{Resize: &agentapi.PtySize{Rows: h, Cols: w}}})
	return nil
}

// end ends a stream that is still open (the VM is going away): the
// receiver records 137.
func (p *process) end() {
	p.mu.Lock()
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func closeAll(cs ...io.Closer) {
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}
