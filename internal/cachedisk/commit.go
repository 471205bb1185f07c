package cachedisk

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/microvm/microvm/internal/atomicfile"
)

// Commit makes a job's clone name's next version and evicts what the
// limits no longer allow (evict.go). The clone is synced and checked
// (an ext4 image at least headLen long) before it is renamed into place
// under name's lock; the manifest, written last, makes the version
// exist. A clone that fails the check is discarded and the versions are
// left as they were. Of two commits at once, both succeed as successive
// versions, the later the newest. It returns the new version's number.
func (s *Store) Commit(c Clone) (int, error) {
	path, err := s.Path(c)
	if err != nil {
		return 0, err
	}
	if err := syncFile(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("cache %s: commit: the clone is gone (discarded, or the cache was removed)", c.Name)
		}
		return 0, fmt.Errorf("cache %s: commit: %w", c.Name, err)
	}
	m, err := describe(path)
	if err != nil {
		if errors.Is(err, errCorrupt) {
			os.Remove(path)
			return 0, fmt.Errorf("cache %s: commit: the job's disk is %w: discarded, the last good version kept", c.Name, err)
		}
		return 0, fmt.Errorf("cache %s: commit: %w", c.Name, err)
	}
	l, err := s.lock(c.Name, true)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	good, err := s.scan(c.Name)
	if err != nil {
		return 0, fmt.Errorf("cache %s: commit: %w", c.Name, err)
	}
	n := 1
	if len(good) > 0 {
		n = good[len(good)-1].n + 1
	}
	dir := s.nameDir(c.Name)
	if err := os.Rename(path, filepath.Join(dir, imageName(n))); err != nil {
		return 0, fmt.Errorf("cache %s: commit: %w", c.Name, err)
	}
	m.Version, m.Created, m.Base = n, time.Now().UTC(), c.Base
	b, err := json.Marshal(m)
	if err == nil {
		err = atomicfile.Write(filepath.Join(dir, manifestName(n)), b, 0o600)
	}
	if err != nil {
		// No manifest: the version does not exist; take its image away.
		os.Remove(filepath.Join(dir, imageName(n)))
		return 0, fmt.Errorf("cache %s: commit: manifest: %w", c.Name, err)
	}
	good = append(good, version{n, m})
	if err := s.evict(c.Name, good); err != nil {
		return n, fmt.Errorf("cache %s: committed version %d, then eviction: %w", c.Name, n, err)
	}
	return n, nil
}

// syncFile flushes a file's data to disk.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
