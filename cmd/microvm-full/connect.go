package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/vsock/hybrid"
)

// connectCommand is a host-side client for the vsock Unix socket: it
// connects to guest port P through the Firecracker handshake and then
// copies stdin to the guest and the guest's bytes to stdout
// (hybrid.Pipe).
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

// vsockConnect is the command's one call: hybrid.Pipe with --timeout
// bounding the handshake, its errors prefixed with the command's name.
func vsockConnect(path string, port uint32, timeout time.Duration, stdin io.Reader, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := hybrid.Pipe(ctx, path, port, stdin, stdout); err != nil {
		return fmt.Errorf("vsock-connect: %w", err)
	}
	return nil
}
