package vhufront

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// The host side: what a host program does with its end of a stream, over
// the back-end's Unix sockets or, for the AF_UNIX reference, a plain
// Unix socket. Every call is bounded by the connection's deadline, which
// the caller sets.

// DialVsock connects to a back-end's host socket and asks for guest port
// port: "CONNECT <port>\n", answered "OK <host port>\n". The answer is
// read a byte at a time so no payload byte after it is consumed.
func DialVsock(uds string, port uint32, timeout time.Duration) (*net.UnixConn, uint32, error) {
	c, err := DialUnix(uds, timeout)
	if err != nil {
		return nil, 0, err
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	fail := func(err error) (*net.UnixConn, uint32, error) {
		c.Close()
		return nil, 0, fmt.Errorf("CONNECT %d on %s: %w", port, uds, err)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		return fail(err)
	}
	var line []byte
	var b [1]byte
	for len(line) < 64 {
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return fail(fmt.Errorf("no OK line (%q so far): %w", line, err))
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
	}
	rest, ok := strings.CutPrefix(string(line), "OK ")
	hp, err := strconv.ParseUint(rest, 10, 32)
	if !ok || err != nil {
		return fail(fmt.Errorf("answer %q, want OK <port>", line))
	}
	_ = c.SetDeadline(time.Time{})
	return c, uint32(hp), nil
}

// DialUnix connects to a Unix stream socket.
func DialUnix(path string, timeout time.Duration) (*net.UnixConn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// ListenUnix listens on path, replacing a stale socket file.
func ListenUnix(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(true)
	return l, nil
}

// AcceptOne accepts one connection within timeout and closes the listener.
func AcceptOne(l *net.UnixListener, timeout time.Duration) (*net.UnixConn, error) {
	defer l.Close()
	_ = l.SetDeadline(time.Now().Add(timeout))
	c, err := l.AcceptUnix()
	if err != nil {
		return nil, fmt.Errorf("accept on %s: %w", l.Addr(), err)
	}
	return c, nil
}

// HostSource writes messages of payload bytes of the pattern for dur, then
// half-closes and waits for the other side to close (it has everything).
func HostSource(c *net.UnixConn, payload int, dur, timeout time.Duration) (Transfer, error) {
	var t Transfer
	if payload < 1 || payload > MaxPayload {
		return t, fmt.Errorf("payload of %d bytes", payload)
	}
	_ = c.SetDeadline(time.Now().Add(dur + timeout))
	t.Start = Mono()
	stop := time.Now().Add(dur)
	for time.Now().Before(stop) {
		n, err := c.Write(PatternAt(t.Bytes, payload))
		t.Bytes += int64(n)
		if err != nil {
			return t, fmt.Errorf("write after %d bytes: %w", t.Bytes, err)
		}
		t.Msgs++
	}
	t.End = Mono()
	if err := c.CloseWrite(); err != nil {
		return t, err
	}
	var b [64]byte
	n, err := c.Read(b[:])
	if n > 0 {
		return t, fmt.Errorf("%d unexpected bytes from the receiver", n)
	}
	if err != io.EOF {
		return t, fmt.Errorf("waiting for the receiver to close: %v", err)
	}
	return t, nil
}

// HostSink reads to end of stream with reads of readSize bytes, checking
// the pattern.
func HostSink(c *net.UnixConn, readSize int, timeout time.Duration) (Transfer, error) {
	var t Transfer
	_ = c.SetDeadline(time.Now().Add(timeout))
	buf := make([]byte, readSize)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if t.Bytes == 0 {
				t.Start = Mono()
			}
			if cerr := CheckPattern(t.Bytes, buf[:n]); cerr != nil {
				return t, cerr
			}
			t.Bytes += int64(n)
			t.Msgs++
		}
		if err == io.EOF {
			t.End = Mono()
			return t, nil
		}
		if err != nil {
			return t, fmt.Errorf("read after %d bytes: %w", t.Bytes, err)
		}
	}
}

// HostPing writes messages of payload bytes one at a time, each after the
// previous came back whole, for dur or max messages, then half-closes and
// waits for the echo side to close. It returns each round trip in ns.
func HostPing(c *net.UnixConn, payload int, dur time.Duration, max int, timeout time.Duration) ([]int64, error) {
	if payload < 1 || payload > MaxPayload {
		return nil, fmt.Errorf("payload of %d bytes", payload)
	}
	_ = c.SetDeadline(time.Now().Add(dur + timeout))
	buf := make([]byte, payload)
	var rtts []int64
	var off int64
	stop := time.Now().Add(dur)
	for len(rtts) < max && time.Now().Before(stop) {
		t0 := time.Now()
		if _, err := c.Write(PatternAt(off, payload)); err != nil {
			return rtts, fmt.Errorf("ping %d: %w", len(rtts), err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return rtts, fmt.Errorf("pong %d: %w", len(rtts), err)
		}
		rtts = append(rtts, time.Since(t0).Nanoseconds())
		if err := CheckPattern(off, buf); err != nil {
			return rtts, err
		}
		off += int64(payload)
	}
	if err := c.CloseWrite(); err != nil {
		return rtts, err
	}
	n, err := c.Read(buf[:1])
	if n > 0 || err != io.EOF {
		return rtts, fmt.Errorf("waiting for the echo side to close: %d bytes, %v", n, err)
	}
	return rtts, nil
}

// HostEcho writes back everything it reads until end of stream, then
// closes its side.
func HostEcho(c *net.UnixConn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	buf := make([]byte, MaxPayload)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return fmt.Errorf("echo: %w", werr)
			}
		}
		if err == io.EOF {
			return c.CloseWrite()
		}
		if err != nil {
			return fmt.Errorf("echo: %w", err)
		}
	}
}
