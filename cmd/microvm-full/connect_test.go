package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/vsock/hybrid"
)

// fakeVMMOnce serves one hybrid-vsock connection on a fresh socket: it
// reads the CONNECT line byte by byte, then runs serve, and sends what serve
// returns on the channel.
func fakeVMMOnce(t *testing.T, serve func(c *net.UnixConn, line string) string) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	res := make(chan string, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			res <- err.Error()
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		res <- serve(c, readConnectLine(c))
	}()
	return path, res
}

// readConnectLine reads a client's CONNECT line byte by byte (nothing
// past it), at most 64 bytes; it returns what came before an error.
func readConnectLine(c net.Conn) string {
	var line []byte
	var b [1]byte
	for len(line) < 64 && !bytes.HasSuffix(line, []byte("\n")) {
		if _, err := c.Read(b[:]); err != nil {
			break
		}
		line = append(line, b[0])
	}
	return string(line)
}

// TestVsockConnectCommand: the command sends the CONNECT line, passes the
// bytes that came with the OK line to stdout, and half-closes after stdin.
func TestVsockConnectCommand(t *testing.T) {
	path, res := fakeVMMOnce(t, func(c *net.UnixConn, line string) string {
		if line != "CONNECT 52\n" {
			return "line " + line
		}
		if _, err := c.Write([]byte("OK 1073741824\nhello from the guest")); err != nil {
			return err.Error()
		}
		got, err := io.ReadAll(c) // until the command's half-close
		if err != nil {
			return err.Error()
		}
		return string(got)
	})
	var stdout bytes.Buffer
	if err := vsockConnect(path, 52, 5*time.Second, strings.NewReader("hello from the host"), &stdout); err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); got != "hello from the guest" {
		t.Errorf("stdout = %q", got)
	}
	if got := <-res; got != "hello from the host" {
		t.Errorf("the guest got %q", got)
	}
}

// TestVsockConnectCommandRefused: a socket closed without OK is reported as
// a refusal.
func TestVsockConnectCommandRefused(t *testing.T) {
	path, _ := fakeVMMOnce(t, func(c *net.UnixConn, line string) string { return "" })
	err := vsockConnect(path, 9, 5*time.Second, strings.NewReader(""), io.Discard)
	if !errors.Is(err, hybrid.ErrRefused) || !strings.HasPrefix(err.Error(), "vsock-connect: ") {
		t.Errorf("vsockConnect: %v, want vsock-connect: ... ErrRefused", err)
	}
}
