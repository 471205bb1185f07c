// Package jail is microvm's --chroot: it makes a directory the process's
// root once the machine is set up, and keeps the paths microvm still uses
// afterwards naming the same files.
//
// Everything microvm opens by name it opens while it sets up (New: the
// kernel, the images, /dev/kvm, the TAPs, the listening sockets), under the
// host's root. A few names are used later, at run time: guest connections
// dial "<uds>_<port>" (and datagrams go to "<uds>_<port>.dgram"), exec dials
// its own vsock socket to reach the guest agent, and the socket files are
// removed at exit. Those are host paths too, given before Enter; Path maps
// each to the name the same file has once the root has changed. A path
// outside the new root has no name there: CheckInside refuses one before
// anything is set up, so each command checks its run-time paths with it.
//
// The root is process state, so it is kept in one process-wide variable,
// set by Enter (the only place microvm changes root) and read by Path from
// any goroutine.
package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
)

// root is the directory Enter made the process's root, as the host names
// it (absolute, symbolic links resolved); nil before Enter.
var root atomic.Pointer[string]

// Dir checks that dir is a directory and returns its canonical host path
// (absolute, symbolic links resolved), which Enter and CheckInside use.
func Dir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("--chroot: empty directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("--chroot %s: %w", dir, err)
	}
	canon, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("--chroot %s: %w", dir, unwrapPath(err))
	}
	fi, err := os.Stat(canon)
	if err != nil {
		return "", fmt.Errorf("--chroot %s: %w", dir, unwrapPath(err))
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("--chroot %s: not a directory", dir)
	}
	return canon, nil
}

// CheckInside returns the canonical host path of p (absolute, the symbolic
// links of its directory resolved; p itself may not exist yet) after
// checking it lies under dir, a canonical path from Dir. what names p in
// the error.
func CheckInside(dir, p, what string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, p, err)
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, p, unwrapPath(err))
	}
	canon := filepath.Join(parent, filepath.Base(abs))
	if _, ok := inside(dir, canon); !ok {
		return "", fmt.Errorf("%s %s is outside --chroot %s: microvm uses it after entering that directory, so it must lie inside it", what, p, dir)
	}
	return canon, nil
}

// inside returns p's name under root dir ("/" for dir itself) and whether
// p lies there; both are canonical absolute paths.
func inside(dir, p string) (string, bool) {
	if dir == "/" {
		return p, true
	}
	if p == dir {
		return "/", true
	}
	rest, ok := strings.CutPrefix(p, dir+"/")
	if !ok {
		return "", false
	}
	return "/" + rest, true
}

// Enter makes dir (a canonical path from Dir) the root directory of the
// whole process and its working directory: chroot(2), then chdir("/").
// It needs CAP_SYS_CHROOT; the error then says so.
func Enter(dir string) error {
	if err := syscall.Chroot(dir); err != nil {
		if errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("--chroot %s: chroot: %w (needs CAP_SYS_CHROOT: start microvm as root; it can drop to --uid/--gid afterwards)", dir, err)
		}
		return fmt.Errorf("--chroot %s: chroot: %w", dir, err)
	}
	if err := syscall.Chdir("/"); err != nil {
		return fmt.Errorf("--chroot %s: chdir /: %w", dir, err)
	}
	root.Store(&dir)
	return nil
}

// Root is the directory Enter made the root, as the host names it, or ""
// before Enter.
func Root() string {
	if r := root.Load(); r != nil {
		return *r
	}
	return ""
}

// Path returns the name host path p has now: p itself before Enter (and
// when Enter was never called); after it, p's path inside the new root.
// p must be canonical (from CheckInside) for the mapping to apply; any
// other p is returned as it is.
func Path(p string) string {
	r := root.Load()
	if r == nil {
		return p
	}
	if in, ok := inside(*r, p); ok {
		return in
	}
	return p
}

// unwrapPath drops *os.PathError's operation and path, which the callers'
// messages already give.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
