package blk

import "testing"

// SetTestHookIO makes every worker call f with the request's sector before
// the request's I/O (testHookIO), until tb ends. f runs on the workers,
// several at once.
func SetTestHookIO(tb testing.TB, f func(sector uint64)) {
	testHookIO.Store(&f)
	tb.Cleanup(func() { testHookIO.Store(nil) })
}

// Stopping returns a channel closed once the running session has begun to
// stop (Reset, Quiesce or Close: by then it pops nothing more and knows
// whether to return what it holds), or nil when no session runs. Take it
// before starting the stop.
func Stopping(d *Device) <-chan struct{} {
	s, ok := d.life.Current()
	if !ok {
		return nil
	}
	return s.quit
}
