package agentapi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/microvm/microvm/vsock/hybrid"
)

// DialFunc opens a new transport to the agent, such as
//
//	func(ctx context.Context) (net.Conn, error) { return m.DialVsock(ctx, 1024) }
//
// for a Machine of the embeddable package, or hybrid.Dial on a
// running VM's vsock socket.
type DialFunc func(ctx context.Context) (net.Conn, error)

// DefaultPort is the vsock port the agent listens on unless told
// otherwise (microvm-agent -listen vsock://:PORT).
const DefaultPort = 1024

// RetryInterval is how often Connect dials again while the agent is not
// there yet.
// Dials are cheap (a refused one is a REQUEST and an RST in the guest), and
// a boot-time measurement should not be rounded up by much.
const RetryInterval = 10 * time.Millisecond

// Conn is a gRPC client connection to the agent; NewClient(conn) calls
// it, and so does any other gRPC client (the health service's).
type Conn struct {
	*grpc.ClientConn

	mu    sync.Mutex
	first net.Conn // Connect's connection until gRPC takes it
}

// Connect waits until the agent accepts a connection made by dial and
// returns a gRPC connection whose first transport is that one; after a
// break gRPC dials again through dial. While the agent is not there yet —
// the VMM refuses the port (hybrid.ErrRefused: the guest is still
// booting) or its socket does not exist or accept yet — Connect retries
// every RetryInterval until ctx ends, so give ctx a deadline (and cancel it
// when the VM ends). Any other error is returned at once.
func Connect(ctx context.Context, dial DialFunc) (*Conn, error) {
	first, err := waitDial(ctx, dial)
	if err != nil {
		return nil, err
	}
	return newConn(first, dial)
}

// VM is a running machine whose guest runs the agent: a *microvm.Machine
// (this package does not import the embedding API, which links no gRPC).
type VM interface {
	// WaitAgent returns the first connection the guest accepts on port,
	// waiting while it boots (Machine.WaitAgent).
	WaitAgent(ctx context.Context, port uint32, timeout time.Duration) (net.Conn, error)
	// DialVsock opens one connection to port (Machine.DialVsock), for
	// gRPC's dials after a break.
	DialVsock(ctx context.Context, port uint32) (net.Conn, error)
}

// ConnectVM waits until vm's guest accepts a connection on port (the
// agent's is DefaultPort), as vm.WaitAgent does, and returns a gRPC
// connection whose first transport is that one; after a break gRPC dials
// again through vm.DialVsock. The wait ends when timeout passes (timeout
// <= 0: when ctx ends) or the machine stops (the error then wraps
// microvm.ErrStopped); on a timeout the error tells how far the guest got
// (docs/debugging.md); the error is WaitAgent's. Run the machine on
// another goroutine meanwhile.
func ConnectVM(ctx context.Context, vm VM, port uint32, timeout time.Duration) (*Conn, error) {
	first, err := vm.WaitAgent(ctx, port, timeout)
	if err != nil {
		return nil, err // the machine's own words say what it waited for
	}
	return newConn(first, func(ctx context.Context) (net.Conn, error) { return vm.DialVsock(ctx, port) })
}

// newConn is a gRPC connection whose first transport is first and whose
// later ones dial makes.
func newConn(first net.Conn, dial DialFunc) (*Conn, error) {
	c := &Conn{first: first}
	cc, err := grpc.NewClient("passthrough:///microvm-agent",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if f := c.take(); f != nil {
				return f, nil
			}
			return dial(ctx)
		}))
	if err != nil {
		first.Close()
		return nil, fmt.Errorf("agentapi: client: %w", err)
	}
	c.ClientConn = cc
	return c, nil
}

// Close closes the gRPC connection, and Connect's first transport if gRPC
// never used it.
func (c *Conn) Close() error {
	err := c.ClientConn.Close()
	if f := c.take(); f != nil {
		f.Close()
	}
	return err
}

func (c *Conn) take() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.first
	c.first = nil
	return f
}

// notThereYet says whether err means the agent (or the VMM's socket) is
// not up yet, rather than a mistake that retrying cannot fix.
func notThereYet(err error) bool {
	return errors.Is(err, hybrid.ErrRefused) || errors.Is(err, fs.ErrNotExist) ||
		errors.Is(err, syscall.ECONNREFUSED)
}

func waitDial(ctx context.Context, dial DialFunc) (net.Conn, error) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		c, err := dial(ctx)
		if err == nil {
			return c, nil
		}
		if dl, ok := ctx.Deadline(); ctx.Err() != nil || ok && !time.Now().Before(dl) {
			// The dial failed because ctx ended, or its deadline passed
			// (a dialer may time out a moment before ctx's own timer
			// fires: wait for that, to report ctx's cause).
			<-ctx.Done()
			return nil, fmt.Errorf("agentapi: connect: %w (last try: %w)", context.Cause(ctx), err)
		}
		if !notThereYet(err) {
			return nil, fmt.Errorf("agentapi: connect: %w", err)
		}
		t.Reset(RetryInterval)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("agentapi: connect: %w (last try: %w)", context.Cause(ctx), err)
		case <-t.C:
		}
	}
}
