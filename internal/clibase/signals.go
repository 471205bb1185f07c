package clibase

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
)

// caughtSignal is the cause of a context that interruptible cancelled.
type caughtSignal struct{ sig syscall.Signal }

func (c caughtSignal) Error() string { return "stopped by " + c.sig.String() }

// Signal is the signal caught: a named VM's process (namedvm.Run) ends
// with status 128+N for it.
func (c caughtSignal) Signal() syscall.Signal { return c.sig }

// Interruptible returns a copy of parent that a SIGINT or SIGTERM cancels
// with cause caughtSignal, and a function that stops catching them and
// cancels the copy. The goroutine it starts ends with the copy.
func Interruptible(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			sig, _ := s.(syscall.Signal)
			cancel(caughtSignal{sig})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel(nil)
	}
}

// SignalStatus returns StatusError{128+N} when signal N cancelled ctx (see
// Interruptible), and nil otherwise.
func SignalStatus(ctx context.Context, log logrus.FieldLogger) error {
	var cs caughtSignal
	if !errors.As(context.Cause(ctx), &cs) {
		return nil
	}
	log.Warnf("stopped by %v", cs.sig)
	return StatusError{Status: 128 + int(cs.sig)}
}

// InspectOnSIGUSR1 logs what m.Inspect says, one warning per line, each
// time the process gets SIGUSR1, until ctx ends: how an operator asks a
// running machine why a device or a vsock connection stalled
// (docs/debugging.md). The goroutine it starts ends with ctx.
func InspectOnSIGUSR1(ctx context.Context, log logrus.FieldLogger, m interface{ Inspect() string }) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1)
	go func() {
		defer signal.Stop(sigs)
		for {
			select {
			case <-sigs:
				for _, l := range strings.Split(m.Inspect(), "\n") {
					log.Warn("inspect: " + l)
				}
			case <-ctx.Done():
				return
			}
		}
	}()
}
