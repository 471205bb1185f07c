package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// progress tells, on a terminal, what a step that takes more than a second
// is doing: after the first second one line, rewritten in place each
// second with the time waited ("microvm: exec: booting the VM and waiting
// for its agent (3s)"), erased when the step ends, so that the command's
// own output starts on a clean line. Not on a terminal, or with --quiet, it
// says nothing: logs and pipes get only what the command writes.
//
// Owner: the goroutine that called startProgress; its ticker goroutine
// writes to w only under mu, and stop waits for it.
type progress struct {
	w    io.Writer
	what string
	// detail, when not nil, says how far the step is (a bar), after what.
	detail func() string
	start  time.Time
	done   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	shown  bool // a line is on the terminal
}

// progressAfter is how long a step runs before progress says anything.
const progressAfter = time.Second

// isTerminal says whether w is a terminal (TCGETS succeeds on it).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// startProgress starts telling what on w when w is a terminal and quiet is
// false, and returns the function that ends it (and erases the line).
func startProgress(w io.Writer, quiet bool, what string) (stop func()) {
	return startProgressDetail(w, quiet, what, nil)
}

// startProgressDetail is startProgress with detail's answer (a phase and a
// bar) shown after what, refreshed with the line.
func startProgressDetail(w io.Writer, quiet bool, what string, detail func() string) (stop func()) {
	if quiet || !isTerminal(w) {
		return func() {}
	}
	tick := time.Second
	if detail != nil {
		tick = time.Second / 4 // a bar moves
	}
	return runProgress(w, what, detail, progressAfter, tick)
}

// runProgress is startProgress on any writer, first after wait, then every
// tick.
func runProgress(w io.Writer, what string, detail func() string, wait, tick time.Duration) (stop func()) {
	p := &progress{w: w, what: what, detail: detail, start: time.Now(), done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTimer(wait)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				p.show()
				t.Reset(tick)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(p.done)
			p.wg.Wait()
			p.mu.Lock()
			if p.shown {
				fmt.Fprint(p.w, "\r\x1b[K") // back to the line's start, erase it
			}
			p.mu.Unlock()
		})
	}
}

func (p *progress) show() {
	p.mu.Lock()
	defer p.mu.Unlock()
	what := p.what
	if p.detail != nil {
		if d := p.detail(); d != "" {
			what += ": " + d
		}
	}
	fmt.Fprintf(p.w, "\r\x1b[Kmicrovm: %s (%ds)", what, int(time.Since(p.start).Round(time.Second)/time.Second))
	p.shown = true
}
