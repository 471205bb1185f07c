package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// flockFile takes a flock on path (created if missing). It returns the
// open file holding the lock; closing it releases the lock. With block
// false a lock held elsewhere gives unix.EWOULDBLOCK.
func flockFile(path string, how int, block bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if !block {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return f, nil
}

// workDir is a private directory under the store's tmp/ where one Pull or
// Import does its work. It holds a flock on its .lock file for as long as
// it lives, so that Open in another process does not sweep it away.
type workDir struct {
	path string
	lock *os.File
}

const workLockName = ".lock"

func newWorkDir(tmp string) (*workDir, error) {
	p, err := os.MkdirTemp(tmp, "work-")
	if err != nil {
		return nil, fmt.Errorf("create work directory: %w", err)
	}
	l, err := flockFile(filepath.Join(p, workLockName), unix.LOCK_EX, false)
	if err != nil {
		os.RemoveAll(p)
		return nil, fmt.Errorf("lock work directory: %w", err)
	}
	return &workDir{path: p, lock: l}, nil
}

func (w *workDir) join(elem ...string) string {
	return filepath.Join(append([]string{w.path}, elem...)...)
}

// remove deletes the work directory and everything left in it.
func (w *workDir) remove() error {
	err := removeTree(w.path)
	w.lock.Close()
	return err
}

// removeTree is os.RemoveAll that also copes with directories whose mode
// denies their owner writing or searching them (an image's 0555 /usr
// staged by a user who is not root): on failure it gives every directory
// under path owner rwx and tries again.
func removeTree(path string) error {
	err := os.RemoveAll(path)
	if err == nil {
		return nil
	}
	// WalkDir hands a directory to the function before reading it, so the
	// chmod comes in time for the walk to go on into it.
	filepath.WalkDir(path, func(p string, d fs.DirEntry, werr error) error {
		if werr == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(path)
}

// staleAfter: an entry of tmp/ this old whose lock nobody holds is left
// over from an interrupted Pull or Import (or a crash), and Open removes
// it.
const staleAfter = time.Hour

// sweepTmp removes stale entries of tmp.
func sweepTmp(tmp string, now time.Time) error {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return fmt.Errorf("read %s: %w", tmp, err)
	}
	for _, e := range entries {
		p := filepath.Join(tmp, e.Name())
		info, err := e.Info()
		if err != nil {
			continue // gone meanwhile
		}
		if now.Sub(info.ModTime()) < staleAfter {
			continue
		}
		if e.IsDir() {
			l, err := flockFile(filepath.Join(p, workLockName), unix.LOCK_EX, false)
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue // still in use
			}
			if err == nil {
				defer l.Close()
			}
		}
		if err := removeTree(p); err != nil {
			return fmt.Errorf("remove stale %s: %w", p, err)
		}
	}
	return nil
}
