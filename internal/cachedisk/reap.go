package cachedisk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CloneGrace is how long a clone that no process holds may go unwritten
// before it counts as abandoned: left by a job whose process was killed
// (SIGKILL, a crash, a host reboot) before its Commit or Discard.
//
// A live job's clone is held (flock) by its VM's block device for as
// long as the VM runs, so only the short stretches outside it need the
// grace: from Checkout to the VM's opening its disks (for the GitLab
// executor, prepare's copy of a Docker cache of several GB beside it and
// the VM's start: seconds to a few minutes on a slow disk), and from the
// VM's end to the Commit or Discard (the same process, or cleanup right
// after its stop: seconds). In both the clone's mtime is recent: the copy
// or mkfs that made it, or the guest's unmount that wrote it back just
// before the VM ended. Ten minutes is well over either, and short enough
// that a killed job's disk (as large as its cache) does not sit for long.
const CloneGrace = 10 * time.Minute

// cloneNameLen is the length of a clone file's name: 32 hex digits and
// the image suffix.
const cloneNameLen = 32 + len(imageSuffix)

// isCloneFile says whether file (a name in a clones directory) is a
// clone's: what Checkout makes, and nothing else is reaped.
func isCloneFile(file string) bool {
	return len(file) == cloneNameLen && strings.HasSuffix(file, imageSuffix) && isHex(strings.TrimSuffix(file, imageSuffix), 32)
}

// probeAbandoned says whether the clone at path is abandoned: unwritten
// for longer than CloneGrace before now and flocked by no process. A
// clone is only probed once old, so a job's VM that opens its young clone
// never meets the probe's lock. When abandoned, the file returned holds
// the probe's exclusive flock, so that nothing opens the clone as a disk
// until the caller has removed it and closed the file; else it is nil. A
// clone gone meanwhile (committed, discarded) is not abandoned.
func probeAbandoned(path string, now time.Time) (*os.File, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if now.Sub(fi.ModTime()) < CloneGrace {
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EWOULDBLOCK {
		f.Close() // held: a VM runs on it
		return nil, nil
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("flock: %w", err)
	}
	return f, nil
}

// reapClones removes name's abandoned clones (probeAbandoned) and
// returns how many; a held or young clone is never touched. It needs no
// lock of name's: each clone is one job's file, and one committed or
// discarded meanwhile is simply gone.
func (s *Store) reapClones(name string) (int, error) {
	dir := s.clonesDir(name)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	now, removed := time.Now(), 0
	var errs []error
	for _, e := range entries {
		if !isCloneFile(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := probeAbandoned(path, now)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		if f == nil {
			continue
		}
		err = os.Remove(path)
		f.Close()
		switch {
		case err == nil:
			removed++
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// reapLogged is reapClones where nothing may fail because of it (a
// checkout, an eviction): what it removed and what it could not are one
// line each on the store's log.
func (s *Store) reapLogged(name string) {
	n, err := s.reapClones(name)
	if n > 0 {
		fmt.Fprintf(s.log, "microvm: cache %s: removed %d abandoned clone(s) (held by no VM, unwritten for over %v)\n", name, n, CloneGrace)
	}
	if err != nil {
		fmt.Fprintf(s.log, "microvm: cache %s: abandoned clones not removed, going on: %v\n", name, err)
	}
}

// countClones counts name's clones: all of them, and the abandoned ones
// among them (probeAbandoned, each probe's lock let go at once). A clone
// it cannot probe counts as in use.
func (s *Store) countClones(name string) (total, abandoned int, err error) {
	entries, err := os.ReadDir(s.clonesDir(name))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	for _, e := range entries {
		total++
		if !isCloneFile(e.Name()) {
			continue
		}
		f, err := probeAbandoned(filepath.Join(s.clonesDir(name), e.Name()), now)
		if err == nil && f != nil {
			f.Close()
			abandoned++
		}
	}
	return total, abandoned, nil
}
