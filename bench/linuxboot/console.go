package main

import (
	"bytes"
	"strconv"
	"strings"
	"time"
)

// Console lines the benchmark looks for.
const (
	// readyLine is what guest/init prints first, once /proc, /sys and /dev
	// are mounted: the end of the boot as this benchmark counts it.
	readyLine = "init: ready"
	// donePrefix starts the line guest/init prints before it reboots:
	// "init: done ok" or "init: done fail".
	donePrefix = "init: done "
	// panicPrefix starts the kernel's panic message.
	panicPrefix = "Kernel panic"
)

// console is the io.Writer a VMM's stdout (its serial console) is copied
// into. It keeps everything written and notes when the milestones of a
// boot go by: the wall time of the "init: ready" line, the kernel's own
// timestamp of "Run /init as init process", the result line and a panic.
//
// exec.Cmd's copying goroutine is its only writer; its fields are read
// after cmd.Wait returns, which waits for that goroutine.
type console struct {
	start time.Time
	now   func() time.Time // time.Now; tests replace it

	all     bytes.Buffer // every byte written
	partial []byte       // the current line, not yet ended by '\n'

	// ready is when readyLine arrived, measured from start (0: not yet).
	ready time.Duration
	// runInit is the printk timestamp of the kernel's "Run ... as init
	// process" line, in seconds of guest time since the kernel's clock
	// started; hasRunInit says whether that line was seen.
	runInit    float64
	hasRunInit bool
	// done is the result word after donePrefix ("ok", "fail"); "" if unseen.
	done string
	// panicked is the kernel's panic line, if there was one.
	panicked string
}

func newConsole(start time.Time) *console {
	return &console{start: start, now: time.Now}
}

// Write records p and looks at every line it completes.
func (c *console) Write(p []byte) (int, error) {
	at := c.now().Sub(c.start)
	c.all.Write(p)
	rest := p
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			c.partial = append(c.partial, rest...)
			break
		}
		line := rest[:i]
		if len(c.partial) > 0 {
			line = append(c.partial, line...)
			c.partial = c.partial[:0]
		}
		c.observe(string(line), at)
		rest = rest[i+1:]
	}
	// A prompt-like last line without '\n' can still be the ready line: the
	// guest writes it in one write, so it is complete once it is all here.
	if c.ready == 0 && bytes.Contains(c.partial, []byte(readyLine)) {
		c.ready = at
	}
	return len(p), nil
}

// observe notes the milestone, if any, that line (without its '\n') is.
func (c *console) observe(line string, at time.Duration) {
	line = strings.TrimRight(line, "\r")
	ts, msg, isKernel := parseKernelLine(line)
	switch {
	case isKernel && isRunInit(msg):
		if !c.hasRunInit {
			c.runInit, c.hasRunInit = ts, true
		}
	case isKernel && strings.HasPrefix(msg, panicPrefix), !isKernel && strings.HasPrefix(line, panicPrefix):
		if c.panicked == "" {
			c.panicked = strings.TrimSpace(line)
		}
	case strings.Contains(line, readyLine):
		if c.ready == 0 {
			c.ready = at
		}
	case strings.HasPrefix(line, donePrefix):
		if c.done == "" {
			c.done = strings.TrimSpace(strings.TrimPrefix(line, donePrefix))
		}
	}
}

// parseKernelLine splits a console line printed by the kernel with
// CONFIG_PRINTK_TIME, "[    1.234567] message", into its timestamp in
// seconds and the message. ok is false for any other line (guest user
// space, a VMM's own output).
func parseKernelLine(line string) (ts float64, msg string, ok bool) {
	if !strings.HasPrefix(line, "[") {
		return 0, "", false
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return 0, "", false
	}
	field := strings.TrimSpace(line[1:end])
	// Only digits and one '.': ParseFloat alone would take "1e3" or "NaN".
	if field == "" || strings.Trim(field, "0123456789.") != "" || strings.Count(field, ".") != 1 {
		return 0, "", false
	}
	ts, err := strconv.ParseFloat(field, 64)
	if err != nil {
		return 0, "", false
	}
	return ts, strings.TrimPrefix(line[end+1:], " "), true
}

// isRunInit reports whether a kernel message is the one init/main.c prints
// just before it executes the init program: "Run /init as init process".
func isRunInit(msg string) bool {
	path, ok := strings.CutPrefix(msg, "Run ")
	if !ok {
		return false
	}
	path, ok = strings.CutSuffix(strings.TrimRight(path, " "), " as init process")
	return ok && strings.HasPrefix(path, "/") && !strings.ContainsRune(path, ' ')
}

// tail returns the last n bytes of the console, for error messages.
func (c *console) tail(n int) string {
	b := c.all.Bytes()
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}
