package unixsock

import (
	"errors"
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

// TestBusyListenerIsNotStale: a listener that does not accept and whose
// queue is full answers a connect with EAGAIN; it is alive, and Listen
// must refuse its path rather than replace it.
func TestBusyListenerIsNotStale(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	// Fill its queue: non-blocking connects until one is refused with EAGAIN.
	for i := 0; ; i++ {
		c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(c)
		err = unix.Connect(c, &unix.SockaddrUnix{Name: path})
		if err == unix.EAGAIN {
			break
		}
		if err != nil || i > 100 {
			t.Fatalf("connect %d: %v", i, err)
		}
	}
	var before unix.Stat_t
	if err := unix.Stat(path, &before); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(path)
	if err == nil {
		ln.Close()
		t.Fatal("Listen replaced a busy listener's socket")
	}
	if !strings.Contains(err.Error(), "in use") {
		t.Errorf("error %v, want it to say the socket is in use", err)
	}
	var after unix.Stat_t
	if err := unix.Stat(path, &after); err != nil || after.Ino != before.Ino {
		t.Errorf("the busy listener's socket file was replaced or removed: %v", err)
	}
}

// TestListenRacing: two Listens on one path, the second starting after
// the first checked the path and before it renamed its socket there: one
// of them must fail, not both succeed with one of them orphaned.
func TestListenRacing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	type result struct {
		ln  *net.UnixListener
		err error
	}
	second := make(chan result, 1)
	waiting := make(chan struct{})
	testHookLockWait = func() { close(waiting) }
	first := true
	testHookChecked = func() {
		if !first {
			return
		}
		first = false
		go func() {
			ln, err := Listen(path)
			second <- result{ln, err}
		}()
		// The second either waits for the directory's lock or, without
		// one, runs to its end.
		select {
		case <-waiting:
		case r := <-second:
			second <- r
		}
	}
	defer func() { testHookChecked, testHookLockWait = nil, nil }()
	ln1, err1 := Listen(path)
	r := <-second
	if err1 == nil {
		defer ln1.Close()
	}
	if r.err == nil {
		defer r.ln.Close()
	}
	if err1 == nil && r.err == nil {
		t.Fatal("both Listens claimed the path; one listener is orphaned")
	}
	if err1 != nil {
		t.Errorf("the first Listen failed: %v", err1)
	}
	if r.err != nil && !strings.Contains(r.err.Error(), "in use") {
		t.Errorf("the second Listen: %v, want in use", r.err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the socket alone", len(entries))
	}
}

// TestBindErrorNoSockets: a bind the file system refuses (ENXIO from 9p,
// EOPNOTSUPP from some FUSE mounts) says what is wrong and what to do;
// other bind errors stay as they were.
func TestBindErrorNoSockets(t *testing.T) {
	for _, tc := range []struct {
		errno unix.Errno
		want  bool
	}{{unix.ENXIO, true}, {unix.EOPNOTSUPP, true}, {unix.EADDRINUSE, false}, {unix.EACCES, false}} {
		bind := &net.OpError{Op: "listen", Net: "unix", Err: os.NewSyscallError("bind", tc.errno)}
		err := bindError("/x/s", bind)
		if got := errors.Is(err, ErrNoSockets); got != tc.want {
			t.Errorf("%v: ErrNoSockets %v, want %v (%v)", tc.errno, got, tc.want, err)
		}
		if !errors.Is(err, tc.errno) || !strings.HasPrefix(err.Error(), "listen on /x/s: ") {
			t.Errorf("%v: %v lost the errno or the path", tc.errno, err)
		}
	}
}
