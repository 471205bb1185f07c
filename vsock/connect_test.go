package vsock_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// feed runs chunks through a fresh parser until it finishes or fails, and
// returns the port, the bytes after the newline (the rest of the chunk that
// held it, then the chunks not fed), whether it finished, and its error.
func feed(chunks [][]byte) (port uint32, rest []byte, done bool, err error) {
	var p vsock.ConnectParser
	for i, c := range chunks {
		port, r, d, err := p.Feed(c)
		if err != nil {
			return 0, nil, false, err
		}
		if d {
			rest = append([]byte(nil), r...)
			for _, c := range chunks[i+1:] {
				rest = append(rest, c...)
			}
			return port, rest, true, nil
		}
	}
	return 0, nil, false, nil
}

// splits returns the ways of cutting b tried for every input: whole, at
// every single boundary, and one byte at a time.
func splits(b []byte) [][][]byte {
	out := [][][]byte{{b}}
	for i := 0; i <= len(b); i++ {
		out = append(out, [][]byte{b[:i], b[i:]})
	}
	var bytewise [][]byte
	for i := range b {
		bytewise = append(bytewise, b[i:i+1])
	}
	return append(out, bytewise)
}

func TestConnectParser(t *testing.T) {
	const (
		ok = iota
		bad
		more // no newline yet: neither done nor failed
	)
	long := func(n int) string { // a CONNECT line of n bytes with the newline
		return "CONNECT " + strings.Repeat("0", n-len("CONNECT 7\n")) + "7\n"
	}
	for _, tc := range []struct {
		in   string
		want int
		port uint32
		rest string
	}{
		{"CONNECT 1234\n", ok, 1234, ""},
		{"CONNECT 1234\npayload\nmore", ok, 1234, "payload\nmore"},
		{"connect 5\n", ok, 5, ""},
		{"CoNnEcT 5\nx", ok, 5, "x"},
		{"CONNECT 5\r\n", ok, 5, ""},
		{"CONNECT 5\r\n\r\n", ok, 5, "\r\n"},
		{"CONNECT 0\n", ok, 0, ""},
		{"CONNECT 4294967295\n", ok, 4294967295, ""},
		{long(64), ok, 7, ""},
		{long(64) + "after", ok, 7, "after"},
		{long(65), bad, 0, ""},
		{"CONNECT 4294967296\n", bad, 0, ""},
		{"CONNECT -1\n", bad, 0, ""},
		{"CONNECT +1\n", bad, 0, ""},
		{"CONNECT  12\n", ok, 12, ""}, // blanks as Firecracker splits them
		{"CONNECT 12 \n", ok, 12, ""},
		{"CONNECT 0x10\n", bad, 0, ""},
		{"CONNECT\n", bad, 0, ""},
		{"CONNECT \n", bad, 0, ""},
		{"CONNECTX 5\n", bad, 0, ""},
		{" CONNECT 5\n", ok, 5, ""},
		{"CONNECT\t5\n", ok, 5, ""},
		{"CONNECT 5 6\n", bad, 0, ""},
		{"LISTEN 5\n", bad, 0, ""},
		{"\n", bad, 0, ""},
		{"\r\n", bad, 0, ""},
		{"CONNECT 5\x00\n", bad, 0, ""},
		{"CONNECT 5", more, 0, ""},
		{"", more, 0, ""},
		{strings.Repeat("CONNECT 5", 7), more, 0, ""}, // 63 bytes: the newline would make 64
		{strings.Repeat("CONNECT 5", 7) + "5", bad, 0, ""},
		{strings.Repeat("x", 200), bad, 0, ""},
		{strings.Repeat("x", 200) + "\n", bad, 0, ""},
		{strings.Repeat("\xff", 200), bad, 0, ""},
	} {
		name := fmt.Sprintf("%.24q", tc.in)
		t.Run(name, func(t *testing.T) {
			for _, chunks := range splits([]byte(tc.in)) {
				port, rest, done, err := feed(chunks)
				switch tc.want {
				case ok:
					if err != nil || !done || port != tc.port || string(rest) != tc.rest {
						t.Fatalf("%q: port %d rest %q done %v err %v; want port %d rest %q",
							chunks, port, rest, done, err, tc.port, tc.rest)
					}
				case bad:
					if !errors.Is(err, vsock.ErrConnectLine) {
						t.Fatalf("%q: done %v err %v; want ErrConnectLine", chunks, done, err)
					}
				case more:
					if err != nil || done {
						t.Fatalf("%q: done %v err %v; want more input", chunks, done, err)
					}
				}
			}
		})
	}
	// 63 bytes without a newline: the parser still waits (the newline
	// would make 64), one more byte is too many.
	t.Run("63-then-64", func(t *testing.T) {
		var p vsock.ConnectParser
		if _, _, done, err := p.Feed([]byte(long(64)[:63])); done || err != nil {
			t.Fatalf("63 bytes: done %v err %v; want more", done, err)
		}
		if _, _, _, err := p.Feed([]byte("7")); !errors.Is(err, vsock.ErrConnectLine) {
			t.Fatalf("64th byte not a newline: err %v; want ErrConnectLine", err)
		}
	})
}

// shortDir returns a fresh directory with a short path (sun_path is small;
// t.TempDir's names are long).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "vs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestCheckUDSPath(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, false}, {1, true}, {96, true}, {97, false}, {107, false}, {200, false}} {
		p := "/" + strings.Repeat("a", max(tc.n-1, 0))
		if tc.n == 0 {
			p = ""
		}
		err := vsock.CheckUDSPath(p)
		if (err == nil) != tc.ok {
			t.Errorf("CheckUDSPath(%d bytes) = %v; want ok=%v (with _4294967295 it must fit in 107)", tc.n, err, tc.ok)
		}
	}
}

func TestListenUDS(t *testing.T) {
	e := newEnv(t, envOpts{})
	dir := shortDir(t)
	listen := func(p string) (*vsock.UDS, error) { return vsock.ListenUDS(p, e.dev, time.Second, quietLog()) }

	t.Run("mode-0600", func(t *testing.T) {
		p := filepath.Join(dir, "m.sock")
		u, err := listen(p)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Errorf("socket mode %v; want a socket with 0600", fi.Mode())
		}
		if err := u.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket file after Close: %v", err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("left behind in the directory: %v", ents)
		}
	})
	t.Run("stale-socket-replaced", func(t *testing.T) {
		p := filepath.Join(dir, "s.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
		u, err := listen(p)
		if err != nil {
			t.Fatalf("stale socket not replaced: %v", err)
		}
		u.Close()
	})
	t.Run("live-socket-refused", func(t *testing.T) {
		p := filepath.Join(dir, "l.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if u, err := listen(p); err == nil {
			u.Close()
			t.Fatal("replaced a socket someone listens on")
		}
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("the live socket is gone: %v", err)
		}
	})
	t.Run("regular-file-refused", func(t *testing.T) {
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, []byte("keep me"), 0o644); err != nil {
			t.Fatal(err)
		}
		if u, err := listen(p); err == nil {
			u.Close()
			t.Fatal("replaced a regular file")
		}
		if b, _ := os.ReadFile(p); string(b) != "keep me" {
			t.Fatal("the regular file changed")
		}
	})
	t.Run("directory-refused", func(t *testing.T) {
		p := filepath.Join(dir, "d")
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if u, err := listen(p); err == nil {
			u.Close()
			t.Fatal("replaced a directory")
		}
	})
	t.Run("too-long", func(t *testing.T) {
		p := filepath.Join(dir, strings.Repeat("x", 97-len(dir)-1))
		if len(p) != 97 {
			t.Fatalf("path of %d bytes", len(p))
		}
		if u, err := listen(p); err == nil {
			u.Close()
			t.Fatal("accepted a path that cannot take the _<port> suffix")
		}
	})
}

// The Firecracker protocol end to end over real Unix sockets: host clients
// CONNECT through the listening socket, guest connections reach
// "<uds>_<port>" through UDSDialer.
func TestUDSEndToEnd(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "v.sock")
	e := newEnv(t, envOpts{cfg: vsock.Config{Dialer: vsock.UDSDialer{Path: path}}})
	u, err := vsock.ListenUDS(path, e.dev, 200*time.Millisecond, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { u.Serve(); close(served) }()
	defer func() {
		u.Close()
		<-served
	}()

	t.Run("host-to-guest", func(t *testing.T) {
		hc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		// The line in pieces, with payload right after it.
		for _, s := range []string{"conn", "ect 52", "\nfirst bytes"} {
			if _, err := hc.Write([]byte(s)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		c := e.g.Accept(52)
		port, err := vsocktest.ReadOK(hc, waitTimeout)
		if err != nil || port != c.HostPort {
			t.Fatalf("OK %d, %v; guest saw host port %d", port, err, c.HostPort)
		}
		vsocktest.CheckEqual(t, "prefix", c.Read(11), []byte("first bytes"))
		e.transfer(c, hc, vsocktest.Pattern(1, 256<<10), vsocktest.Pattern(2, 256<<10))
	})
	t.Run("guest-to-host", func(t *testing.T) {
		ln, err := net.Listen("unix", path+"_4000")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := e.g.Connect(4000, 3333)
		if err != nil {
			t.Fatal(err)
		}
		hc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		e.transfer(c, hc, vsocktest.Pattern(3, 256<<10), vsocktest.Pattern(4, 256<<10))
		// No listener on another port: RST.
		if _, err := e.g.Connect(4001, 3334); err == nil {
			t.Fatal("connected to a port nobody listens on")
		}
	})
	t.Run("bad-lines-closed", func(t *testing.T) {
		for _, line := range []string{"CONNECT x\n", "HELLO\n", strings.Repeat("y", 100), "CONNECT 99999999999\n"} {
			hc, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = hc.Write([]byte(line))
			if err := vsocktest.WaitEOF(hc, waitTimeout); err != nil {
				t.Errorf("%q: connection not closed: %v", line, err)
			}
			hc.Close()
		}
	})
	t.Run("silent-client-times-out", func(t *testing.T) {
		hc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		_, _ = hc.Write([]byte("CONNECT 5"))
		start := time.Now()
		if err := vsocktest.WaitEOF(hc, waitTimeout); err != nil {
			t.Fatalf("not closed: %v", err)
		}
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Errorf("closed after %v; the handshake timeout is 200ms", d)
		}
	})
	t.Run("guest-does-not-answer", func(t *testing.T) {
		hc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		_, _ = hc.Write([]byte("CONNECT 77\n"))
		req := e.g.WaitRequest(77)
		if err := vsocktest.WaitEOF(hc, waitTimeout); err != nil {
			t.Fatalf("not closed: %v", err)
		}
		e.g.ExpectOp(vsock.OpRst, req.Hdr.SrcPort, 77)
	})
	t.Run("guest-refuses", func(t *testing.T) {
		hc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		_, _ = hc.Write([]byte("CONNECT 78\n"))
		req := e.g.WaitRequest(78)
		e.g.SendOp(vsock.OpRst, 78, req.Hdr.SrcPort, 0)
		b, err := io.ReadAll(hc)
		if err != nil || len(b) != 0 {
			t.Fatalf("read %q, %v; want EOF and no OK line", b, err)
		}
	})
}
