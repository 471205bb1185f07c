package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"syscall"
	"time"

	"github.com/microvm/microvm/vsock/hybrid"
)

// echoPort is the vsock port the test guest listens on (echo mode).
const echoPort = 1024

// echoLine is what the benchmark sends the echo guest and wants back.
var echoLine = []byte("snapshot-bench: are you there?\n")

// retryInterval is how long echoOnce waits between dials that found the
// socket or the guest not there yet: short, because it rounds the time
// it measures up.
const retryInterval = time.Millisecond

// echoOnce connects to the echo guest's port through the vsock socket
// uds, sends echoLine and reads it back, then closes the connection. Until
// ctx ends it dials again while the socket does not exist or accept yet
// or the guest refuses (a process still starting, a guest not listening
// yet).
func echoOnce(ctx context.Context, uds string) error {
	var c *hybrid.Conn
	for {
		var err error
		c, err = hybrid.Dial(ctx, uds, echoPort)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("echo: %w (last try: %w)", context.Cause(ctx), err)
		}
		if !notThereYet(err) {
			return fmt.Errorf("echo: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("echo: %w (last try: %w)", context.Cause(ctx), err)
		case <-time.After(retryInterval):
		}
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(echoLine); err != nil {
		return fmt.Errorf("echo: write: %w", err)
	}
	got := make([]byte, len(echoLine))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("echo: read: %w", err)
	}
	if !bytes.Equal(got, echoLine) {
		return fmt.Errorf("echo: got %q back, want %q", got, echoLine)
	}
	return nil
}

// notThereYet says whether a dial error means the VMM's socket or the
// guest's listener is not up yet, rather than a failure.
func notThereYet(err error) bool {
	return errors.Is(err, hybrid.ErrRefused) || errors.Is(err, fs.ErrNotExist) ||
		errors.Is(err, syscall.ECONNREFUSED)
}
