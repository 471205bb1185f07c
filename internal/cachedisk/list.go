package cachedisk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Info is what List says about one cache name.
type Info struct {
	Name string
	// Versions is the number of good committed versions.
	Versions int
	// Newest is the newest version's number, 0 when there is none.
	Newest int
	// Size and Allocated are the newest version's length and what it
	// takes on disk.
	Size, Allocated int64
	// Committed is when the newest version was committed.
	Committed time.Time
	// Clones is the number of clones checked out and not yet committed
	// or discarded (jobs running, or killed ones that left theirs).
	Clones int
	// Abandoned is how many of Clones no VM holds and none was written
	// for CloneGrace (reap.go): left by killed jobs, and removed by the
	// next Checkout of the name. The others are in use.
	Abandoned int
}

// List describes every cache in the store, by name. Like every operation
// on a name it cleans up after killed commits and removes corrupt
// versions on the way (one log line each).
func (s *Store) List() ([]Info, error) {
	names, err := s.names()
	if err != nil {
		return nil, fmt.Errorf("cache store: %w", err)
	}
	var out []Info
	for _, name := range names {
		info, err := s.info(name)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// info is List's entry for name.
func (s *Store) info(name string) (Info, error) {
	l, err := s.lock(name, true)
	if err != nil {
		return Info{}, err
	}
	defer l.Close()
	good, err := s.scan(name)
	if err != nil {
		return Info{}, fmt.Errorf("cache %s: %w", name, err)
	}
	info := Info{Name: name, Versions: len(good)}
	if len(good) > 0 {
		v := good[len(good)-1]
		info.Newest, info.Size, info.Allocated, info.Committed = v.n, v.m.Size, v.m.Allocated, v.m.Created
	}
	if info.Clones, info.Abandoned, err = s.countClones(name); err != nil {
		return Info{}, fmt.Errorf("cache %s: %w", name, err)
	}
	return info, nil
}

// Remove deletes a cache: its versions and its clones, abandoned ones
// and those in use. A job still running on a clone keeps its open file,
// but its Commit then fails (the clone is gone) and commits nothing.
// Removing a name that is not there is an error matching fs.ErrNotExist.
func (s *Store) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	dir := s.nameDir(name)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("cache %s: %w", name, err)
	}
	l, err := s.lock(name, true)
	if err != nil {
		return err
	}
	defer l.Close()
	// Move it out of the way first, so that no one sees half of it; the
	// lock file goes with it, and a later user of the name makes anew.
	gone, err := s.moveAway(dir)
	if err != nil {
		return fmt.Errorf("cache %s: remove: %w", name, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("cache %s: remove: %w", name, err)
	}
	return nil
}

// moveAway renames dir into a new .removed-* directory of the store and
// returns that. Open deletes such directories that a killed Remove left,
// and may take an empty one that this has just made: then this tries
// again.
func (s *Store) moveAway(dir string) (string, error) {
	for try := 0; ; try++ {
		gone, err := os.MkdirTemp(s.dir, removedPattern)
		if err != nil {
			return "", err
		}
		err = os.Rename(dir, filepath.Join(gone, filepath.Base(dir)))
		if err == nil {
			return gone, nil
		}
		os.Remove(gone)
		if _, serr := os.Stat(gone); !errors.Is(serr, fs.ErrNotExist) || try == 2 {
			return "", err
		}
	}
}
