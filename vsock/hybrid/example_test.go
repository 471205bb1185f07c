package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/microvm/microvm/vsock/hybrid"
)

// Connect to guest port 52 through the VM's vsock socket and print what the
// guest sends until it closes.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := hybrid.Dial(ctx, "/run/vm/vsock.sock", 52)
	switch {
	case errors.Is(err, hybrid.ErrRefused):
		fmt.Println("nothing listens on guest port 52")
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	defer c.Close()
	_ = c.CloseWrite() // nothing to send
	_, _ = io.Copy(os.Stdout, c)
}

// Talk to guest port 52 from the terminal: stdin to the guest, the guest to
// stdout, as `microvm vsock-connect --uds /run/vm/vsock.sock --port 52`.
func ExamplePipe() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel() // the deadline bounds the handshake, not the session
	if err := hybrid.Pipe(ctx, "/run/vm/vsock.sock", 52, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
