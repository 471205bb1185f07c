package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/vsock/hybrid"
)

// connectCommand is a host-side client for the vsock Unix socket: it
// connects to guest port P through the Firecracker handshake
// (hybrid.Dial) and then copies stdin to the guest and the guest's
// bytes to stdout, like `socat - UNIX-CONNECT:PATH` after a CONNECT line.
func connectCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "vsock-connect",
		Usage:        connectUsage,
		UsageText:    "microvm vsock-connect --uds PATH --port N",
		OnUsageError: onUsageError,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "uds", Usage: "the VM's vsock Unix socket (--vsock-uds of microvm run) (required)"},
			&cli.Uint64Flag{Name: "port", Usage: "guest vsock port (required)"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "how long to wait for the guest to accept"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return clibase.Usagef("vsock-connect: unexpected argument %q", c.Args().First())
			}
			if c.String("uds") == "" || !clibase.IsSet(c, "port") || c.Uint64("port") > 0xfffffffe {
				return clibase.Usagef("vsock-connect: --uds PATH and --port N (0..4294967294) are required")
			}
			return vsockConnect(c.String("uds"), uint32(c.Uint64("port")), c.Duration("timeout"), stdin, stdout)
		},
	}
}

func vsockConnect(path string, port uint32, timeout time.Duration, stdin io.Reader, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	uc, err := hybrid.Dial(ctx, path, port)
	if err != nil {
		return fmt.Errorf("vsock-connect: %w", err)
	}
	defer uc.Close()
	// stdin -> guest runs beside guest -> stdout. When the guest side ends
	// the command returns without waiting for stdin, which may never end (a
	// terminal); the copying goroutine dies with the process. An error it
	// already hit is reported.
	sent := make(chan error, 1)
	go func() {
		_, err := io.Copy(uc, stdin)
		if cerr := uc.CloseWrite(); err == nil {
			err = cerr
		}
		sent <- err
	}()
	_, rerr := io.Copy(stdout, uc)
	if rerr != nil && !errors.Is(rerr, net.ErrClosed) {
		return fmt.Errorf("vsock-connect: %w", rerr)
	}
	select {
	case err := <-sent:
		if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EPIPE) {
			return fmt.Errorf("vsock-connect: sending: %w", err)
		}
	default:
	}
	return nil
}
