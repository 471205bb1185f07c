// Package unixsock creates the listening Unix sockets microvm serves on (the
// vsock device's host socket, the vhost-user socket) the same careful way.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoSockets is a bind refused by the file system: 9p (a directory
// shared into a VM) and some FUSE mounts hold no Unix sockets, and say so
// with ENXIO ("no such device or address") or EOPNOTSUPP, which name
// neither the file system nor what to do.
var ErrNoSockets = errors.New("the file system there does not hold Unix sockets (9p and some FUSE mounts refuse them): use a directory on a local file system such as tmpfs or ext4")

// bindError is the error of a bind at path that failed with err.
func bindError(path string, err error) error {
	if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("listen on %s: %w (%w)", path, ErrNoSockets, err)
	}
	return fmt.Errorf("listen on %s: %w", path, err)
}

// Listen creates a listening socket at path, readable and writable by its
// owner only (0600). A stale socket file (connecting to it is refused:
// nobody listens) is replaced; a live socket (a connect succeeds, or its
// queue is full) or any other kind of file is refused. The check and the
// take-over run under an exclusive flock of path's directory, so two
// processes given the same path cannot both see it stale and both claim
// it: the second finds the first's listener. The socket is bound under
// a private temporary name in path's directory and renamed into place, so it
// is never reachable with looser permissions and replacing a stale file is
// atomic. The listener does not remove the file when closed: the caller
// does.
func Listen(path string) (*net.UnixListener, error) {
	return ListenNet("unix", path)
}

// ListenNet is Listen for network "unix" (SOCK_STREAM) or "unixpacket"
// (SOCK_SEQPACKET). The liveness check before replacing a file dials with
// the same network: a live socket of the other type would look stale.
func ListenNet(network, path string) (*net.UnixListener, error) {
	unlock, err := lockDir(path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := removeStale(network, path); err != nil {
		return nil, err
	}
	if testHookChecked != nil {
		testHookChecked()
	}
	// No prefix: MkdirTemp's random name is at most 10 bytes, so
	// "<dir>/<random>/s" is at most 12 bytes longer than "<dir>/" and fits
	// in sun_path whenever path's directory leaves room for a short name.
	dir, err := os.MkdirTemp(filepath.Dir(path), "")
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix(network, &net.UnixAddr{Name: tmp, Net: network})
	if err != nil {
		return nil, bindError(path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return ln, nil
}

// ListenDgram binds a datagram socket at path and returns its descriptor
// (non-blocking, close-on-exec), with the same care as Listen: a stale
// socket is replaced, a live socket or any other file refused, and the file
// is never reachable with looser permissions than 0600. Unlike Listen it
// binds at path itself, not under a temporary name renamed into place: a
// datagram socket's bound name is the source address its peers see and
// reply to, and a rename would leave them the temporary one. The mode is
// set on the socket before bind instead (Linux creates the file with the
// socket inode's mode, less the umask). The caller removes the file after
// closing the socket.
func ListenDgram(path string) (int, error) {
	unlock, err := lockDir(path)
	if err != nil {
		return -1, err
	}
	defer unlock()
	if err := removeStale("unixgram", path); err != nil {
		return -1, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, bindError(path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		unix.Close(fd)
		os.Remove(path)
		return -1, fmt.Errorf("socket %s: %w", path, err)
	}
	return fd, nil
}

// RemoveStale removes a socket file at path that nobody listens on, and
// refuses (with an error) a live socket or a file that is not a socket.
func RemoveStale(path string) error {
	unlock, err := lockDir(path)
	if err != nil {
		return err
	}
	defer unlock()
	return removeStale("unix", path)
}

// Test hooks: testHookChecked runs between the liveness check and the
// rename into place; testHookLockWait when the directory's lock is held
// by another and the caller is about to wait for it.
var testHookChecked, testHookLockWait func()

// lockDir takes an exclusive flock of path's directory, held while a
// socket there is checked and taken over (released by unlock). The
// directory, not a lock file beside the socket, so that nothing is left
// behind; it is held for a connect and a rename, never longer.
func lockDir(path string) (unlock func(), err error) {
	dir := filepath.Dir(path)
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("socket %s: lock its directory: %w", path, err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		if testHookLockWait != nil {
			testHookLockWait()
		}
		for {
			if err = unix.Flock(int(f.Fd()), unix.LOCK_EX); !errors.Is(err, unix.EINTR) {
				break
			}
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("socket %s: lock its directory: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// removeStale removes path if it is a socket nobody listens on. Only a
// refused connect (ECONNREFUSED) proves that: a connect that succeeds, or
// fails with EAGAIN (a listener whose queue is full: busy, not gone) or
// times out, is a live socket; any other error is reported, and the file
// kept.
func removeStale(network, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; not replacing it", path)
	}
	c, err := net.DialTimeout(network, path, time.Second)
	switch {
	case err == nil:
		c.Close()
		return fmt.Errorf("%s is in use by another process; not replacing it (stop that process, or choose another path)", path)
	case errors.Is(err, unix.ENOENT):
		return nil // removed meanwhile
	case !errors.Is(err, unix.ECONNREFUSED):
		var ne net.Error
		if errors.Is(err, unix.EAGAIN) || errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("%s is in use by another process (its listener is busy); not replacing it (stop that process, or choose another path)", path)
		}
		return fmt.Errorf("socket %s: cannot tell whether it is in use, not replacing it: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}
