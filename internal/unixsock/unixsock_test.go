package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want a socket with 0600", fi.Mode())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries; the temporary one was left behind", len(entries))
	}
	// A live socket is refused.
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second Listen on a live socket: %v", err)
	}
	ln.Close()
	// Now it is stale: replaced.
	ln2, err := Listen(path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the new socket does not accept: %v", err)
	}
	c.Close()
	ln2.Close()
	// A regular file is never replaced.
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Error("the regular file was changed")
	}
}

func TestListenDgram(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.dgram")
	fd, err := ListenDgram(path)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), path)
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := fc.(*net.UnixConn)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want a socket with 0600", fi.Mode())
	}
	// A live datagram socket is refused, not taken for a stale one.
	if _, err := ListenDgram(path); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second ListenDgram on a live socket: %v", err)
	}
	s, err := net.Dial("unixgram", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	buf := make([]byte, 8)
	if n, _, err := c.ReadFrom(buf); err != nil || string(buf[:n]) != "hi" {
		t.Errorf("read %q, %v", buf[:n], err)
	}
	if a := c.LocalAddr().String(); a != path {
		t.Errorf("bound as %q; want %q (the address peers reply to)", a, path)
	}
	c.Close()
	fd2, err := ListenDgram(path)
	if err != nil {
		t.Fatalf("stale datagram socket not replaced: %v", err)
	}
	unix.Close(fd2)
}
