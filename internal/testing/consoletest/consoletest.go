// Package consoletest is a guest console sink for tests and the soak
// tool: it keeps everything the guest printed and lets a goroutine wait
// for a line.
package consoletest

import (
	"bytes"
	"strings"
	"sync"
	"time"
)

// Console collects a guest's serial output (Config.Console) and wakes
// waiters on every write. The vCPU goroutine writes; any goroutine reads
// and waits. Its zero value is not ready: use New.
type Console struct {
	mu     sync.Mutex // guards buf and change
	buf    bytes.Buffer
	change chan struct{} // closed and replaced on every write
}

// New returns an empty console.
func New() *Console { return &Console{change: make(chan struct{})} }

// Write appends p and wakes every waiter.
func (c *Console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	close(c.change)
	c.change = make(chan struct{})
	return len(p), nil
}

// String is everything written so far.
func (c *Console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// WaitFor blocks until the output contains s (true), or done is closed
// (then true only if the output contains s by then), or d passes (false).
// done may be nil.
func (c *Console) WaitFor(s string, d time.Duration, done <-chan struct{}) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		found, ch := strings.Contains(c.buf.String(), s), c.change
		c.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-ch:
		case <-done:
			return strings.Contains(c.String(), s)
		case <-deadline.C:
			return false
		}
	}
}
