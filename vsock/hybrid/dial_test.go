package hybrid

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// promptly is how long a Dial that must return at once may take (the
// machine may be loaded).
const promptly = 2 * time.Second

// fakeVMM listens on a fresh Unix socket and runs serve for each accepted
// connection after reading its first line (what the client sent, newline
// included, or what came before end of stream). It returns the socket path
// and a channel with the lines read.
func fakeVMM(t *testing.T, serve func(c *net.UnixConn, line string)) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			line := readClientLine(c)
			lines <- line
			serve(c, line)
			c.Close()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return path, lines
}

// readClientLine reads up to a newline byte by byte (the fake VMM must not
// swallow bytes the client sends after the line either).
func readClientLine(c *net.UnixConn) string {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	var line []byte
	var b [1]byte
	for len(line) < 100 {
		if _, err := c.Read(b[:]); err != nil {
			break
		}
		line = append(line, b[0])
		if b[0] == '\n' {
			break
		}
	}
	return string(line)
}

func dialT(t *testing.T, timeout time.Duration, path string, port uint32) (*Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return Dial(ctx, path, port)
}

func checkLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	select {
	case got := <-lines:
		if got != want {
			t.Errorf("the VMM read %q, want %q", got, want)
		}
	case <-time.After(promptly):
		t.Errorf("the VMM read no line")
	}
}

func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return string(b)
}

// TestDialOK: one-piece answer, the host port, the exact CONNECT line, and
// a stream that carries data both ways with half-close.
func TestDialOK(t *testing.T) {
	path, lines := fakeVMM(t, func(c *net.UnixConn, line string) {
		_, _ = c.Write([]byte("OK 1073741824\n"))
		// Echo until the client's half-close, then close.
		_, _ = io.Copy(c, c)
	})
	c, err := dialT(t, 5*time.Second, path, 52)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkLine(t, lines, "CONNECT 52\n")
	if got := c.HostPort(); got != 1<<30 {
		t.Errorf("HostPort = %d, want %d", got, 1<<30)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	if got := readAll(t, c); got != "ping" {
		t.Errorf("echo = %q, want %q", got, "ping")
	}
	var _ net.Conn = c // Conn is a net.Conn
}

// TestDialPieces: the answer and the payload after it arrive a byte per
// write.
func TestDialPieces(t *testing.T) {
	const payload = "guest data"
	path, lines := fakeVMM(t, func(c *net.UnixConn, line string) {
		for _, b := range []byte("OK 4294967295\n" + payload) {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	c, err := dialT(t, 5*time.Second, path, 4294967295)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkLine(t, lines, "CONNECT 4294967295\n")
	if got := c.HostPort(); got != 4294967295 {
		t.Errorf("HostPort = %d, want 4294967295", got)
	}
	if got := readAll(t, c); got != payload {
		t.Errorf("stream = %q, want %q", got, payload)
	}
}

// TestDialOKWithPayload: the guest's first bytes come in the same write as
// the OK line and must reach the caller.
func TestDialOKWithPayload(t *testing.T) {
	payload := "hello\nOK 7\n" + strings.Repeat("x", 1000)
	path, _ := fakeVMM(t, func(c *net.UnixConn, line string) {
		_, _ = c.Write([]byte("OK 1234\n" + payload))
	})
	c, err := dialT(t, 5*time.Second, path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.HostPort(); got != 1234 {
		t.Errorf("HostPort = %d, want 1234", got)
	}
	if got := readAll(t, c); got != payload {
		t.Errorf("stream = %q, want %q", got, payload)
	}
}

// TestDialAnswers: which answers are accepted.
func TestDialAnswers(t *testing.T) {
	for _, tc := range []struct {
		answer string
		port   uint32
		err    error
	}{
		{"OK 0\n", 0, nil},
		{"OK 5\r\n", 5, nil},
		{"OK 007\n", 7, nil},
		{"OK 4294967295\n", 4294967295, nil},
		{"OK 4294967296\n", 0, ErrNotVsock},
		{"OK -1\n", 0, ErrNotVsock},
		{"OK +1\n", 0, ErrNotVsock},
		{"OK 0x10\n", 0, ErrNotVsock},
		{"OK\n", 0, ErrNotVsock},
		{"OK \n", 0, ErrNotVsock},
		{"OK  5\n", 0, ErrNotVsock},
		{"OK 5 \n", 0, ErrNotVsock},
		{"ok 5\n", 0, ErrNotVsock},
		{"\n", 0, ErrNotVsock},
		{"OK 5\r\r\n", 0, ErrNotVsock},
		{"HTTP/1.1 400 Bad Request\r\n\r\n", 0, ErrNotVsock},
		{"SSH-2.0-OpenSSH_9.6\r\n", 0, ErrNotVsock},
		{"OK 5", 0, ErrNotVsock}, // closed half-way
		{strings.Repeat("9", MaxOKLine-1) + "\n", 0, ErrNotVsock},
		{"OK " + strings.Repeat("0", MaxOKLine-4) + "5\n", 0, ErrNotVsock}, // 65 bytes
		{"OK " + strings.Repeat("0", MaxOKLine-5) + "5\n", 5, nil},         // 64 bytes
		{strings.Repeat("y", 10000), 0, ErrNotVsock},
	} {
		t.Run(fmt.Sprintf("%q", tc.answer), func(t *testing.T) {
			path, _ := fakeVMM(t, func(c *net.UnixConn, line string) {
				_, _ = c.Write([]byte(tc.answer))
			})
			start := time.Now()
			c, err := dialT(t, 5*time.Second, path, 9)
			if tc.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
				if got := c.HostPort(); got != tc.port {
					t.Errorf("HostPort = %d, want %d", got, tc.port)
				}
				return
			}
			if err == nil {
				c.Close()
				t.Fatalf("Dial succeeded (host port %d), want %v", c.HostPort(), tc.err)
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("Dial: %v, want %v", err, tc.err)
			}
			if errors.Is(err, ErrRefused) || errors.Is(err, ErrTimeout) {
				t.Errorf("Dial: %v also wraps another sentinel", err)
			}
			if d := time.Since(start); d > promptly {
				t.Errorf("Dial took %v", d)
			}
		})
	}
}

// TestDialRefused: the VMM reads the line and closes (the guest refused).
// The error wraps ErrRefused and io.EOF and names the socket and port.
func TestDialRefused(t *testing.T) {
	path, lines := fakeVMM(t, func(c *net.UnixConn, line string) {})
	start := time.Now()
	c, err := dialT(t, 5*time.Second, path, 77)
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded; the VMM closed the socket")
	}
	checkLine(t, lines, "CONNECT 77\n")
	if !errors.Is(err, ErrRefused) || !errors.Is(err, io.EOF) {
		t.Errorf("Dial: %v, want ErrRefused wrapping io.EOF", err)
	}
	if errors.Is(err, ErrNotVsock) || errors.Is(err, ErrTimeout) {
		t.Errorf("Dial: %v wraps another sentinel", err)
	}
	for _, s := range []string{path, "CONNECT 77"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Dial: %q does not mention %q", err, s)
		}
	}
	if d := time.Since(start); d > promptly {
		t.Errorf("Dial took %v", d)
	}
}

// TestDialRefusedReset: the VMM closes without reading the whole line, so
// the client may see ECONNRESET or EPIPE rather than end of stream; it is
// still a refusal.
func TestDialRefusedReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		var b [3]byte
		_, _ = io.ReadFull(c, b[:]) // leave the rest of the line unread
		c.Close()
	}()
	c, err := dialT(t, 5*time.Second, path, 123456)
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded; the VMM closed the socket")
	}
	if !errors.Is(err, ErrRefused) {
		t.Errorf("Dial: %v, want ErrRefused", err)
	}
}

// TestDialTimeout: a peer that never answers; Dial returns ErrTimeout and
// context.DeadlineExceeded soon after the deadline.
func TestDialTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	path, lines := fakeVMM(t, func(c *net.UnixConn, line string) { <-release })
	const timeout = 100 * time.Millisecond
	start := time.Now()
	c, err := dialT(t, timeout, path, 3)
	d := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded; the VMM never answered")
	}
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial: %v, want ErrTimeout and context.DeadlineExceeded", err)
	}
	if errors.Is(err, ErrRefused) || errors.Is(err, ErrNotVsock) {
		t.Errorf("Dial: %v wraps another sentinel", err)
	}
	if d < timeout-10*time.Millisecond || d > timeout+promptly {
		t.Errorf("Dial returned after %v, want about %v", d, timeout)
	}
	checkLine(t, lines, "CONNECT 3\n")
}

// TestDialCancel: cancelling the context mid-handshake (no deadline) makes
// Dial return at once with context.Canceled.
func TestDialCancel(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	path, lines := fakeVMM(t, func(c *net.UnixConn, line string) { <-release })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		c   *Conn
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := Dial(ctx, path, 8)
		res <- result{c, err}
	}()
	checkLine(t, lines, "CONNECT 8\n") // Dial is now waiting for the answer
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case r := <-res:
		if r.err == nil {
			r.c.Close()
			t.Fatal("Dial succeeded; the VMM never answered")
		}
		if !errors.Is(r.err, context.Canceled) || errors.Is(r.err, ErrTimeout) {
			t.Errorf("Dial: %v, want context.Canceled only", r.err)
		}
	case <-time.After(promptly):
		t.Fatal("Dial did not return after the context was cancelled")
	}
}

// TestDialCancelled: a context done before Dial fails the dial itself.
func TestDialCancelled(t *testing.T) {
	path, _ := fakeVMM(t, func(c *net.UnixConn, line string) { _, _ = c.Write([]byte("OK 1\n")) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c, err := Dial(ctx, path, 1)
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded with a cancelled context")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Dial: %v, want context.Canceled", err)
	}
}

// TestDialNoDeadlineAfter: the context's deadline bounds only the
// handshake; the returned Conn keeps working after it.
func TestDialNoDeadlineAfter(t *testing.T) {
	const timeout = 100 * time.Millisecond
	path, _ := fakeVMM(t, func(c *net.UnixConn, line string) {
		_, _ = c.Write([]byte("OK 1\n"))
		time.Sleep(2 * timeout)
		_, _ = c.Write([]byte("late"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c, err := Dial(ctx, path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-ctx.Done()
	cancel()
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "late" {
		t.Errorf("read after the deadline: %q, %v", b[:], err)
	}
}

// TestDialMissing: a missing socket file is a plain connect error that
// wraps fs.ErrNotExist.
func TestDialMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nothing.sock")
	c, err := dialT(t, 5*time.Second, path, 1)
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded on a missing path")
	}
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("Dial: %v, want fs.ErrNotExist", err)
	}
	if errors.Is(err, ErrRefused) || errors.Is(err, ErrNotVsock) || errors.Is(err, ErrTimeout) {
		t.Errorf("Dial: %v wraps a sentinel", err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "no such file or directory") {
		t.Errorf("Dial: %q does not name the path and ENOENT", err)
	}
}

// TestDialNotSocket: a regular file, a directory and a datagram socket are
// not hybrid-vsock sockets; a socket file nobody listens on is a connect
// error of its own (the VMM is gone).
func TestDialNotSocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	dgram := filepath.Join(dir, "dgram.sock")
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: dgram, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for _, path := range []string{file, dir, dgram} {
		c, err := dialT(t, 5*time.Second, path, 1)
		if err == nil {
			c.Close()
			t.Errorf("Dial(%s) succeeded", path)
			continue
		}
		if !errors.Is(err, ErrNotVsock) {
			t.Errorf("Dial(%s): %v, want ErrNotVsock", path, err)
		}
	}

	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	c, err := dialT(t, 5*time.Second, stale, 1)
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded on a socket nobody listens on")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, ErrNotVsock) || errors.Is(err, ErrRefused) {
		t.Errorf("Dial(stale socket): %v, want ECONNREFUSED only", err)
	}
}

// FuzzOKLine: for any bytes from the VMM, readLine and parseOK never
// panic, read at most MaxOKLine bytes and nothing past the newline, and
// accept exactly "OK <decimal uint32>" with an optional '\r'.
func FuzzOKLine(f *testing.F) {
	for _, s := range []string{"OK 5\n", "OK 1073741824\npayload", "OK 5\r\n", "OK 4294967296\n", "OK x\n", "", "OK", strings.Repeat("z", 70)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		line, err := readLine(r)
		consumed := len(data) - r.Len()
		if consumed > MaxOKLine {
			t.Fatalf("read %d bytes", consumed)
		}
		if err != nil {
			return
		}
		if consumed != len(line) || line[len(line)-1] != '\n' || bytes.IndexByte(line, '\n') != len(line)-1 {
			t.Fatalf("line %q, consumed %d", line, consumed)
		}
		port, err := parseOK(line)
		if err != nil {
			if !errors.Is(err, ErrNotVsock) {
				t.Fatalf("parseOK(%q): %v without ErrNotVsock", line, err)
			}
			return
		}
		body := strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r")
		if strings.TrimLeft(body, "OK 0") != strings.TrimLeft(fmt.Sprint(port), "0") || !strings.HasPrefix(body, "OK ") {
			t.Fatalf("parseOK(%q) = %d", line, port)
		}
	})
}

// TestAwaitOK: AwaitOK on one end of a socketpair-like connected pair
// writes nothing, parses the OK line, leaves the bytes after it in the
// socket, and maps end of stream, a bad answer and the context's deadline
// to the same errors as Dial.
func TestAwaitOK(t *testing.T) {
	pair := func(t *testing.T) (*net.UnixConn, *net.UnixConn) {
		t.Helper()
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		conn := func(fd int) *net.UnixConn {
			f := os.NewFile(uintptr(fd), "socketpair")
			defer f.Close()
			c, err := net.FileConn(f)
			if err != nil {
				t.Fatal(err)
			}
			return c.(*net.UnixConn)
		}
		return conn(fds[0]), conn(fds[1])
	}
	t.Run("ok", func(t *testing.T) {
		ours, vmm := pair(t)
		defer vmm.Close()
		if _, err := vmm.Write([]byte("OK 1073741825\nguest bytes")); err != nil {
			t.Fatal(err)
		}
		if err := vmm.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := AwaitOK(ctx, ours)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.HostPort() != 1<<30+1 {
			t.Errorf("HostPort = %d, want %d", c.HostPort(), 1<<30+1)
		}
		if got := readAll(t, c); got != "guest bytes" {
			t.Errorf("stream after OK = %q, want %q", got, "guest bytes")
		}
		// AwaitOK wrote nothing.
		_ = c.CloseWrite()
		if got := readAll(t, vmm); got != "" {
			t.Errorf("AwaitOK wrote %q, want nothing", got)
		}
	})
	errCases := []struct {
		name   string
		answer string // written, then the VMM end closes; "" and hang: nothing
		hang   bool
		want   error
	}{
		{"refused", "", false, ErrRefused},
		{"not an OK", "HELLO\n", false, ErrNotVsock},
		{"timeout", "", true, ErrTimeout},
	}
	for _, tc := range errCases {
		t.Run(tc.name, func(t *testing.T) {
			ours, vmm := pair(t)
			defer vmm.Close()
			if _, err := vmm.Write([]byte(tc.answer)); err != nil {
				t.Fatal(err)
			}
			if !tc.hang {
				vmm.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			c, err := AwaitOK(ctx, ours)
			if err == nil {
				c.Close()
				t.Fatal("AwaitOK succeeded")
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("AwaitOK: %v, want %v", err, tc.want)
			}
			if d := time.Since(start); d > promptly {
				t.Errorf("AwaitOK took %v", d)
			}
			// AwaitOK closed our end on failure.
			if _, err := ours.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
				t.Errorf("write after a failed AwaitOK: %v, want net.ErrClosed", err)
			}
		})
	}
}
