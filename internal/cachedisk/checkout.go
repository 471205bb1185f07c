package cachedisk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Clone is one job's writable copy of a cache, from Checkout until Commit
// or Discard. It is plain data, so that the process that commits it (a CI
// executor's cleanup) need not be the one that checked it out: Clone
// fields saved and given back to Commit or Discard of the same store
// name the same file.
type Clone struct {
	// Name is the cache's name.
	Name string `json:"name"`
	// ID names the clone's file; 32 hex digits.
	ID string `json:"id"`
	// Base is the version cloned, 0 for a fresh disk.
	Base int `json:"base"`
	// Method says how it was made: "reflink", "sparse copy" or "new".
	Method string `json:"method"`
}

// cloneNew is Clone.Method for a fresh disk.
const cloneNew = "new"

// Path is the clone's file in s, to give the job's VM as its disk.
func (s *Store) Path(c Clone) (string, error) {
	if err := CheckName(c.Name); err != nil {
		return "", err
	}
	if !isHex(c.ID, 32) {
		return "", fmt.Errorf("cache %s: clone id %q: want 32 hex digits", c.Name, short(c.ID))
	}
	return filepath.Join(s.clonesDir(c.Name), c.ID+imageSuffix), nil
}

// isHex: s is n lower-case hex digits.
func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Checkout gives a job a private writable copy of name's newest good
// version, or, where there is none, a fresh sparse ext4 image of size
// bytes (a version keeps the size it was made with). Versions found
// corrupt on the way are removed and the next older one is tried, and
// name's abandoned clones (reap.go) are removed first; a clone that
// cannot be removed is one log line, never the checkout's failure.
func (s *Store) Checkout(ctx context.Context, name string, size int64) (Clone, error) {
	if err := CheckName(name); err != nil {
		return Clone{}, err
	}
	if size <= 0 {
		return Clone{}, fmt.Errorf("cache %s: size %d: want a positive size", name, size)
	}
	var idb [16]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return Clone{}, err
	}
	c := Clone{Name: name, ID: hex.EncodeToString(idb[:])}
	path, err := s.Path(c)
	if err != nil {
		return Clone{}, err
	}
	// What killed jobs left, before this job adds its own; never a
	// reason to fail the job.
	s.reapLogged(name)
	src, base, err := s.newest(name)
	if err != nil {
		return Clone{}, err
	}
	if err := os.MkdirAll(s.clonesDir(name), 0o700); err != nil {
		if src != nil {
			src.Close()
		}
		return Clone{}, fmt.Errorf("cache %s: %w", name, err)
	}
	if src == nil {
		if err := s.newDisk(ctx, path, size); err != nil {
			return Clone{}, fmt.Errorf("cache %s: new disk: %w", name, err)
		}
		c.Method = cloneNew
		return c, nil
	}
	defer src.Close()
	method, err := cloneFile(path, src)
	if err != nil {
		return Clone{}, fmt.Errorf("cache %s: version %d: %w", name, base, err)
	}
	c.Base, c.Method = base, string(method)
	return c, nil
}

// newest opens name's newest good version's image, found under name's
// lock, and returns it with its number; nil when there is none. The copy
// is made from the open file without the lock, so that jobs checking out
// at once do not wait for each other's copies: a version is never
// written, and one evicted meanwhile stays readable through the file.
func (s *Store) newest(name string) (*os.File, int, error) {
	l, err := s.lock(name, true)
	if err != nil {
		return nil, 0, err
	}
	defer l.Close()
	good, err := s.scan(name)
	if err != nil {
		return nil, 0, fmt.Errorf("cache %s: %w", name, err)
	}
	if len(good) == 0 {
		return nil, 0, nil
	}
	v := good[len(good)-1]
	f, err := os.Open(filepath.Join(s.nameDir(name), imageName(v.n)))
	if err != nil {
		return nil, 0, fmt.Errorf("cache %s: version %d: %w", name, v.n, err)
	}
	return f, v.n, nil
}

// Discard removes a clone without committing it: a failed or killed job.
// The versions are untouched. A clone that is gone already is fine.
func (s *Store) Discard(c Clone) error {
	path, err := s.Path(c)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cache %s: discard: %w", c.Name, err)
	}
	return nil
}
