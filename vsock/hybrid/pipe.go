package hybrid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// Pipe connects to guest port port through the hybrid-vsock socket at
// udsPath (Dial) and then copies in to the guest and the guest's bytes to
// out, like `socat - UNIX-CONNECT:PATH` after a CONNECT line; it is
// `microvm vsock-connect`.
//
// ctx bounds the connect and the handshake only, as in Dial: once the
// guest has accepted, the copy runs on whatever happens to ctx (as
// net.Dialer.DialContext's connection does).
//
// When in ends, Pipe half-closes the stream (CloseWrite), so the guest
// reads end of stream and may still answer. Pipe returns when the guest's
// side ends, without waiting for in to end: in may never end (a terminal),
// and the goroutine copying from it stays blocked in in.Read until the
// read returns, then finds the socket closed and ends. When in had ended
// by then, its error (or the half-close's) is reported, unless the guest
// had closed its end (net.ErrClosed, EPIPE).
//
// Errors: Dial's (they wrap ErrRefused, ErrTimeout, ErrNotVsock, ...); a
// failed read from the guest or write to out, as the copy returned it;
// a failed read from in or write to the guest, prefixed "sending: ".
func Pipe(ctx context.Context, udsPath string, port uint32, in io.Reader, out io.Writer) error {
	uc, err := Dial(ctx, udsPath, port)
	if err != nil {
		return err
	}
	defer uc.Close()
	sent := make(chan error, 1) // buffered: the goroutine never blocks on it
	inEnded := make(chan struct{})
	go func() {
		_, err := io.Copy(uc, in)
		close(inEnded) // before the half-close that the guest may answer
		if cerr := uc.CloseWrite(); err == nil {
			err = cerr
		}
		sent <- err
	}()
	if _, err := io.Copy(out, uc); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	select {
	case <-inEnded:
		// Only the half-close is left to it: its result comes at once.
		if err := <-sent; err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EPIPE) {
			return fmt.Errorf("sending: %w", err)
		}
	default:
	}
	return nil
}
