package hybrid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MaxOKLine is the most bytes Dial reads looking for the end of the VMM's
// answer, newline included. "OK 4294967295\r\n" is 15 bytes.
const MaxOKLine = 64

var (
	// ErrRefused means the VMM closed the socket without answering OK:
	// nothing listens on the guest port, the guest refused the connection,
	// or it did not answer within the VMM's connect timeout.
	ErrRefused = errors.New("closed without OK (guest port refused, not listening or not answering)")
	// ErrTimeout means the context's deadline passed before the OK line.
	// Errors wrapping it also wrap context.DeadlineExceeded.
	ErrTimeout = errors.New("no answer before the deadline")
	// ErrNotVsock means the peer is not a hybrid-vsock socket: it answered
	// something other than "OK <port>\n", or the path is not a stream
	// socket.
	ErrNotVsock = errors.New("not a hybrid-vsock socket")
)

// Conn is a connection to a guest port: the Unix socket itself, with the
// handshake done, plus the host port the VMM assigned. Dial reads nothing
// past the OK line, so every method of the embedded UnixConn (Read,
// CloseWrite, CloseRead, File, ...) sees the guest's stream from its first
// byte. Conn implements net.Conn.
type Conn struct {
	*net.UnixConn
	hostPort uint32
}

// HostPort returns the port from the VMM's "OK <port>" answer: the host-side
// port of the connection as the guest sees it.
func (c *Conn) HostPort() uint32 { return c.hostPort }

// Dial connects to the hybrid-vsock Unix socket at udsPath and asks for a
// stream to guest port port ("CONNECT <port>\n"). It returns once the VMM
// has answered "OK <host port>\n". ctx bounds the connect and the
// handshake (a real VMM answers or closes within its own connect timeout,
// but a peer of another kind may never answer, so give ctx a deadline);
// the returned Conn has no deadline. Errors wrap ErrRefused, ErrTimeout,
// ErrNotVsock, the context's error or the connect error (see the package
// documentation).
func Dial(ctx context.Context, udsPath string, port uint32) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", udsPath)
	if err != nil {
		return nil, dialError(ctx, udsPath, err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok { // net.Dialer gives *net.UnixConn for "unix"
		nc.Close()
		return nil, fmt.Errorf("hybridvsock: dial %s: got a %T", udsPath, nc)
	}
	hostPort, err := handshake(ctx, uc, "CONNECT "+strconv.FormatUint(uint64(port), 10)+"\n")
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("hybridvsock: %s: CONNECT %d: %w", udsPath, port, err)
	}
	return &Conn{UnixConn: uc, hostPort: hostPort}, nil
}

// AwaitOK is the second half of Dial for a socket whose CONNECT request
// was made some other way (microvm's Machine.DialVsock hands one end of a
// socketpair to the device directly): it reads the VMM's "OK <host
// port>\n" answer from c under ctx, exactly as Dial does after writing
// the CONNECT line, and returns c as a Conn. It reads nothing past the
// newline and leaves c without a deadline. AwaitOK takes ownership of c:
// on failure c is closed. Errors wrap ErrRefused, ErrTimeout, ErrNotVsock
// or the context's error, as Dial's do.
func AwaitOK(ctx context.Context, c *net.UnixConn) (*Conn, error) {
	hostPort, err := handshake(ctx, c, "")
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("hybridvsock: awaiting OK: %w", err)
	}
	return &Conn{UnixConn: c, hostPort: hostPort}, nil
}

// longAgo is a deadline in the past: setting it makes blocked I/O return.
var longAgo = time.Unix(1, 0)

// handshake sends request (the CONNECT line; nothing when it is empty) and
// reads the answer under ctx.
func handshake(ctx context.Context, c *net.UnixConn, request string) (uint32, error) {
	if d, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(d); err != nil {
			return 0, err
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(longAgo) })
	hostPort, err := exchange(c, request)
	if !stop() {
		// ctx is done and its hook ran (or is running): the socket may
		// be left with a past deadline, so the dial fails even if the
		// answer came.
		return 0, ctxError(ctx)
	}
	if err != nil {
		return 0, classify(ctx, err)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return 0, err
	}
	return hostPort, nil
}

// exchange writes request (if any) and parses the answer.
func exchange(rw io.ReadWriter, request string) (uint32, error) {
	if request != "" {
		if _, err := io.WriteString(rw, request); err != nil {
			return 0, err
		}
	}
	line, err := readLine(rw)
	if err != nil {
		return 0, err
	}
	return parseOK(line)
}

// readLine reads r one byte at a time up to and including the first
// newline, so that nothing after it is consumed, and at most MaxOKLine
// bytes. End of stream before any byte is returned as is (a refusal); after
// some bytes, or without a newline in MaxOKLine bytes, the error wraps
// ErrNotVsock.
func readLine(r io.Reader) ([]byte, error) {
	line := make([]byte, 0, MaxOKLine)
	var b [1]byte
	for len(line) < MaxOKLine {
		n, err := r.Read(b[:])
		if n == 1 {
			line = append(line, b[0])
			if b[0] == '\n' {
				return line, nil
			}
			continue
		}
		if err == nil {
			continue
		}
		if len(line) > 0 && errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: answer %q cut short: %w", ErrNotVsock, line, err)
		}
		if len(line) > 0 {
			return nil, fmt.Errorf("after %q: %w", line, err)
		}
		return nil, err
	}
	return nil, fmt.Errorf("%w: no newline in the first %d bytes of the answer (%q)", ErrNotVsock, MaxOKLine, line)
}

// parseOK parses a full answer line: "OK", one space, a decimal port (no
// sign, fitting in 32 bits), an optional '\r', the newline.
func parseOK(line []byte) (uint32, error) {
	s := strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r")
	digits, ok := strings.CutPrefix(s, "OK ")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, fmt.Errorf("%w: answer %q, want \"OK <host port>\"", ErrNotVsock, s)
	}
	v, err := strconv.ParseUint(digits, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: answer %q: port out of range", ErrNotVsock, s)
	}
	return uint32(v), nil
}

// classify turns an I/O error of the handshake into the package's errors.
func classify(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctxError(ctx)
	case errors.Is(err, ErrNotVsock):
		return err
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The socket's deadline is the context's; it fired just before
		// the context's own timer.
		return fmt.Errorf("%w: %w", ErrTimeout, context.DeadlineExceeded)
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
}

// ctxError is the error for a done context: ErrTimeout with
// context.DeadlineExceeded, or the context's error (context.Canceled).
func ctxError(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}

// dialError wraps a failed connect to path.
func dialError(ctx context.Context, path string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("hybridvsock: dial %s: %w: %w", path, ctxError(ctx), err)
	}
	switch {
	case errors.Is(err, syscall.EPROTOTYPE):
		// A datagram or seqpacket socket.
		return fmt.Errorf("hybridvsock: %s: %w (not a stream socket): %w", path, ErrNotVsock, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		// connect(2) says ECONNREFUSED both for a socket file nobody
		// listens on and for a file that is no socket at all.
		if fi, serr := os.Stat(path); serr == nil && fi.Mode().Type() != fs.ModeSocket {
			return fmt.Errorf("hybridvsock: %s: %w (%s, not a socket): %w", path, ErrNotVsock, describe(fi.Mode()), err)
		}
		return fmt.Errorf("hybridvsock: nothing listens on %s (has the VMM exited?): %w", path, err)
	}
	return fmt.Errorf("hybridvsock: %w", err)
}

// describe names a file's type for an error message.
func describe(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "a regular file"
	case fs.ModeDir:
		return "a directory"
	case fs.ModeNamedPipe:
		return "a named pipe"
	case fs.ModeDevice, fs.ModeDevice | fs.ModeCharDevice:
		return "a device"
	}
	return "mode " + m.Type().String()
}
