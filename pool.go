package microvm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A Pool keeps clones of one snapshot restored, running and (with
// PoolOptions.Ready) ready ahead of demand, so that a job or a sandbox
// takes one at once: the warm pool of sandbox and CI platforms. Each clone
// is a Machine of its own, restored with the host resources
// PoolOptions.Host gives it; Get hands it out and the pool restores the
// next. Clones share the snapshot's unwritten memory pages (Restore maps
// it copy-on-write).
//
// Goroutines: NewPool starts the filler, which owns every clone until Get
// takes it from the ready channel (then the caller owns it); each clone's
// Run goroutine is the clone's own and ends when its guest does or Stop
// cancels it. Close stops the filler and the clones nobody took.
type Pool struct {
	dir   string
	opts  PoolOptions
	ready chan poolItem
	stop  context.CancelFunc
	done  chan struct{} // closed when the filler has returned

	mu     sync.Mutex // guards closed
	closed bool
}

// PoolOptions are a Pool's choices.
type PoolOptions struct {
	// Size is how many clones the pool keeps ready (default 1).
	Size int
	// Host returns the host resources of clone n (0, 1, ...), as
	// Restore's host Config: its console and log, a vsock CID and socket
	// of its own when the guest is reached through one, and every disk,
	// shared directory and TAP the snapshot's machine had, which Restore
	// never takes from the snapshot (ErrSnapshotHostResource). nil: none,
	// which suits a snapshot whose machine had none of them (its clones
	// reached through DialVsock only).
	Host func(n int) Config
	// Ready, when set, is called with each clone once it runs; the clone
	// joins the pool when it returns nil (its agent answered, say), and
	// is stopped and counted as a failed restore when it returns an
	// error. Machine.WaitAgent is the wait for an agent (or any guest
	// service): it ends with the clone's run, and its error says how far
	// the guest got. Where Host gives clones MACs of their own, Ready is
	// where the clone's guest takes them, before anyone uses its network:
	// with the agent, agentapi.ConnectVM, then agentapi.AdoptMACs on that
	// connection (Machine.AdoptMACs with the agent's SetMAC).
	Ready func(ctx context.Context, m *Machine) error
	// ReadyTimeout bounds each Ready call (default 30 s).
	ReadyTimeout time.Duration
}

// poolItem is what the filler hands Get: a ready clone, or why the last
// restore failed.
type poolItem struct {
	c   *Clone
	err error
}

// ErrPoolClosed is Get's error once Close was called.
var ErrPoolClosed = errors.New("microvm: pool closed")

// NewPool checks the snapshot in dir (ReadSnapshot) and starts filling
// the pool.
func NewPool(dir string, o PoolOptions) (*Pool, error) {
	if o.Size < 0 {
		return nil, fmt.Errorf("%w: pool size %d", ErrConfig, o.Size)
	}
	if o.Size == 0 {
		o.Size = 1
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if _, err := ReadSnapshot(dir); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The filler holds one clone while it waits to hand it over, so the
	// channel holds one fewer: Size clones in all.
	p := &Pool{dir: dir, opts: o, ready: make(chan poolItem, o.Size-1), stop: cancel, done: make(chan struct{})}
	go p.fill(ctx)
	return p, nil
}

// fill restores clones for as long as the pool is open, handing each to
// the ready channel; a failure is handed over too (Get returns it), then
// the filler waits a moment before it tries again.
func (p *Pool) fill(ctx context.Context) {
	defer close(p.done)
	for n := 0; ctx.Err() == nil; n++ {
		c, err := p.clone(ctx, n)
		select {
		case p.ready <- poolItem{c, err}:
		case <-ctx.Done():
			if c != nil {
				c.Stop()
			}
			return
		}
		if err != nil {
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
		}
	}
}

// clone restores clone n, starts it and waits for it to be ready.
func (p *Pool) clone(ctx context.Context, n int) (*Clone, error) {
	var host Config
	if p.opts.Host != nil {
		host = p.opts.Host(n)
	}
	m, err := Restore(p.dir, host)
	if err != nil {
		return nil, fmt.Errorf("pool: clone %d: %w", n, err)
	}
	c := startClone(m)
	if p.opts.Ready != nil {
		rctx, cancel := context.WithTimeout(ctx, p.opts.ReadyTimeout)
		err := p.opts.Ready(rctx, m)
		cancel()
		if err != nil {
			res, rerr := c.Stop()
			return nil, fmt.Errorf("pool: clone %d not ready: %w (it ended: %v, %v)", n, err, res.Kind, rerr)
		}
	}
	return c, nil
}

// Get takes a ready clone, waiting for one if none is (until ctx ends).
// The caller owns it: Stop ends it, or it ends with its guest (Wait).
func (p *Pool) Get(ctx context.Context) (*Clone, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrPoolClosed
	}
	select {
	case it := <-p.ready:
		return it.c, it.err
	case <-p.done:
		return nil, ErrPoolClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops the filler and every clone the pool still holds. Clones
// taken with Get are their takers'.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.stop()
	<-p.done
	for {
		select {
		case it := <-p.ready:
			if it.c != nil {
				it.c.Stop()
			}
		default:
			return nil
		}
	}
}

// A Clone is a running machine restored by a Pool.
type Clone struct {
	*Machine
	cancel context.CancelFunc
	ended  chan struct{} // closed when Run has returned
	res    Result
	err    error
	closed sync.Once // the machine is released once
}

// startClone runs m in a goroutine of its own.
func startClone(m *Machine) *Clone {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Clone{Machine: m, cancel: cancel, ended: make(chan struct{})}
	go func() {
		defer close(c.ended)
		c.res, c.err = m.Run(ctx)
	}()
	return c
}

// Wait waits until the clone's guest ends, then releases the machine and
// returns how it ended, as Run does.
func (c *Clone) Wait() (Result, error) {
	<-c.ended
	c.closed.Do(func() { c.Machine.Close() })
	return c.res, c.err
}

// Stop ends the clone (Run returns ExitCanceled unless the guest ended
// first), releases the machine and returns how it ended.
func (c *Clone) Stop() (Result, error) {
	c.cancel()
	return c.Wait()
}

// Done is closed once the clone's guest has ended.
func (c *Clone) Done() <-chan struct{} { return c.ended }
