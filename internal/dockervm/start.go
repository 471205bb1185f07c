package dockervm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/microvm/microvm/internal/agentvm"
)

// DefaultTimeout bounds the wait for the daemon when Options.Timeout is
// zero: dockerd answers in a second or two on a warm image, and its first
// start on an empty data disk sets up overlay2 and the bridge network.
const DefaultTimeout = time.Minute

// The wait's backoff: the first pause between pings, doubled after each
// up to the last.
const (
	firstPoll = 20 * time.Millisecond
	maxPoll   = 500 * time.Millisecond
)

// Options are Start's; the zero value is the defaults.
type Options struct {
	// Timeout bounds the wait for the daemon to answer once dockerd has
	// started (0: DefaultTimeout).
	Timeout time.Duration
	// DockerdArgs are added to dockerd's command line.
	DockerdArgs []string
}

// clock is the time Start waits by; tests drive it by hand.
type clock interface {
	Now() time.Time
	After(time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Start starts Docker in the guest that r runs commands in, with its data
// root on the disk CreateDisk made (attached with DiskSerial), and returns
// once the daemon answers on /var/run/docker.sock: the user's command can
// run docker then. A daemon that answers already is left as it is. Docker's
// failures are an *Error (ExitStatus); r's own are returned wrapped.
func Start(ctx context.Context, r agentvm.Runner, o Options) error {
	return start(ctx, r, o, realClock{})
}

func start(ctx context.Context, r agentvm.Runner, o Options, c clock) error {
	if err := probe(ctx, r); err != nil {
		return err
	}
	// A daemon that answers already (a second Start in this VM) is left
	// as it is; a dockerd an earlier Start left dead is started again.
	up, _, err := ping(ctx, r)
	if err != nil || up {
		return err
	}
	if st, out, err := agentvm.MountDisk(ctx, r, DiskSerial, DataRoot); err != nil {
		return fmt.Errorf("docker: mounting its data disk: %w", err)
	} else if st != 0 {
		return &Error{Reason: fmt.Sprintf("mounting the data disk at %s failed (status %d): %s", DataRoot, st, lastLine(out))}
	}
	args := append([]string{pidPath, LogPath, containerdSocket}, o.DockerdArgs...)
	if st, out, err := sh(ctx, r, startScript, args...); err != nil {
		return fmt.Errorf("docker: starting dockerd: %w", err)
	} else if st != 0 {
		return &Error{Reason: fmt.Sprintf("starting dockerd failed (status %d): %s", st, lastLine(out)), Log: tail(ctx, r)}
	}
	return wait(ctx, r, o.Timeout, c)
}

// probe checks that the image has dockerd and what starting it takes.
func probe(ctx context.Context, r agentvm.Runner) error {
	st, out, err := sh(ctx, r, probeScript)
	switch {
	case errors.Is(err, agentvm.ErrNotInImage):
		return noProgram("sh")
	case err != nil:
		return fmt.Errorf("docker: checking the image for dockerd: %w", err)
	case st == statusMissing:
		return noProgram(lastLine(out))
	case st != 0:
		return &Error{Reason: fmt.Sprintf("checking the image for dockerd failed (status %d): %s", st, lastLine(out))}
	}
	return nil
}

// noProgram is the Error of an image that lacks program.
func noProgram(program string) *Error {
	return &Error{Reason: fmt.Sprintf("the image has no %s; use an image with docker.io, e.g. the microvm CI image (docs/ci.md)", program)}
}

// ping asks whether the daemon answers (up) or, if not, whether the
// dockerd that startScript started has exited.
func ping(ctx context.Context, r agentvm.Runner) (up, exited bool, err error) {
	st, _, err := sh(ctx, r, pingScript, pidPath, dockerSocket)
	if err != nil {
		return false, false, fmt.Errorf("docker: asking dockerd: %w", err)
	}
	return st == 0, st == statusExited, nil
}

// wait pings with backoff until the daemon answers, dockerd exits or
// timeout (0: DefaultTimeout) passes.
func wait(ctx context.Context, r agentvm.Runner, timeout time.Duration, c clock) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := c.Now().Add(timeout)
	pause := firstPoll
	for {
		up, exited, err := ping(ctx, r)
		switch {
		case err != nil:
			return err
		case up:
			return nil
		case exited:
			return &Error{Reason: "dockerd exited before it answered", Log: tail(ctx, r)}
		}
		left := deadline.Sub(c.Now())
		if left <= 0 {
			return &Error{Reason: fmt.Sprintf("dockerd did not answer within %v", timeout), Log: tail(ctx, r)}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("docker: waiting for dockerd: %w", context.Cause(ctx))
		case <-c.After(min(pause, left)):
		}
		pause = min(2*pause, maxPoll)
	}
}

// tail is the end of dockerd's log for an Error, or a line saying why
// there is none.
func tail(ctx context.Context, r agentvm.Runner) string {
	st, out, err := sh(ctx, r, tailScript, LogPath)
	switch {
	case err != nil:
		return "  (reading " + LogPath + ": " + err.Error() + ")"
	case st != 0:
		return "  (reading " + LogPath + ": " + lastLine(out) + ")"
	}
	if t := logTail(out); t != "" {
		return t
	}
	return "  (" + LogPath + " is empty)"
}

// sh runs script with args as $1... through r.
func sh(ctx context.Context, r agentvm.Runner, script string, args ...string) (int, string, error) {
	return r.Run(ctx, append([]string{"sh", "-c", script, "sh"}, args...))
}

// lastLine is the last non-empty line of a step's output, cut short, for
// a one-line Reason.
func lastLine(out string) string {
	out = strings.TrimSpace(out)
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = strings.TrimSpace(out[i+1:])
	}
	if out == "" {
		return "no output"
	}
	if len(out) > logLineBytes {
		out = out[:logLineBytes] + "..."
	}
	return out
}
