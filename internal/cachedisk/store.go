package cachedisk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/vms"
)

// DefaultDir is the store's directory: $MICROVM_STATE_DIR/caches.
func DefaultDir() string { return filepath.Join(vms.StateDir(), "caches") }

// Limits bound what the store keeps.
type Limits struct {
	// Versions is the most versions kept per name (0: DefaultVersions).
	Versions int
	// TotalBytes bounds the allocated bytes of all versions of all names
	// (0: no bound). Eviction never removes a name's newest version, so
	// the newest versions alone may exceed it.
	TotalBytes int64
}

// DefaultVersions is how many versions a name keeps by default: the
// newest, which jobs clone, and the one before it.
const DefaultVersions = 2

// Store is a directory of caches. Its methods may be called from several
// goroutines and processes at once: what they change on disk is
// serialized by each name's flock.
type Store struct {
	dir    string
	limits Limits
	log    io.Writer
	// newDisk makes a fresh, empty ext4 image of size bytes at path.
	newDisk func(ctx context.Context, path string, size int64) error
}

// OpenDir is Open as microvm's commands call it: dir "" is DefaultDir,
// and the corrupt versions removed are logged to os.Stderr.
func OpenDir(dir string, limits Limits) (*Store, error) {
	if dir == "" {
		dir = DefaultDir()
	}
	return Open(dir, limits, nil)
}

// Open opens (making it if missing) the store under dir. log gets one
// line per corrupt or half-written version removed (nil: os.Stderr).
func Open(dir string, limits Limits, log io.Writer) (*Store, error) {
	if limits.Versions < 0 || limits.TotalBytes < 0 {
		return nil, fmt.Errorf("cache store: negative limits %+v", limits)
	}
	if limits.Versions == 0 {
		limits.Versions = DefaultVersions
	}
	if log == nil {
		log = os.Stderr
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache store: %w", err)
	}
	// What a Remove killed half-way left (its name was already gone).
	if left, err := filepath.Glob(filepath.Join(dir, removedPattern)); err == nil {
		for _, p := range left {
			os.RemoveAll(p)
		}
	}
	return &Store{dir: dir, limits: limits, log: log, newDisk: mkfsExt4}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// mkfsExt4 makes an empty sparse ext4 image with mkfs.ext4, labelled
// microvm-cache.
func mkfsExt4(ctx context.Context, path string, size int64) error {
	empty, err := os.MkdirTemp(filepath.Dir(path), ".empty-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(empty)
	return image.WriteDirExt4(ctx, path, empty, uint64(size), "microvm-cache")
}

// nameDir is name's directory; name must have passed CheckName.
func (s *Store) nameDir(name string) string { return filepath.Join(s.dir, name) }

// clonesDir holds name's checked-out clones.
func (s *Store) clonesDir(name string) string { return filepath.Join(s.nameDir(name), "clones") }

const lockName = "lock"

// removedPattern names a removed cache's directory until it is deleted.
const removedPattern = ".removed-*"

// lock takes name's flock, making its directory if missing; closing the
// file releases it. With block false a busy lock gives unix.EWOULDBLOCK.
// A lock file that Remove took away while this waited for it is let go
// and the new one taken, so that a lock always guards the directory at
// name.
func (s *Store) lock(name string, block bool) (*os.File, error) {
	for {
		f, err := s.tryLock(name, block)
		if err != nil {
			return nil, err
		}
		held, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		now, err := os.Stat(filepath.Join(s.nameDir(name), lockName))
		if err == nil && os.SameFile(held, now) {
			return f, nil
		}
		f.Close()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
}

// tryLock is one try of lock: the flock on the file now at name's lock.
func (s *Store) tryLock(name string, block bool) (*os.File, error) {
	dir := s.nameDir(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_EX
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
		return nil, fmt.Errorf("lock cache %s: %w", name, err)
	}
	return f, nil
}

// version is a committed version found by scan.
type version struct {
	n int
	m manifest
}

// scan lists name's good versions, oldest first, with the lock held. On
// the way it removes what a killed commit left (temporary files, an image
// without a manifest) and each corrupt version, with one log line for a
// version.
func (s *Store) scan(name string) ([]version, error) {
	dir := s.nameDir(name)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	images := map[int]bool{}
	var manifests []int
	for _, e := range entries {
		file := e.Name()
		if strings.HasPrefix(file, ".") {
			// A temporary file: only made with the lock held, so what is
			// here now was left by a process that died.
			if err := os.RemoveAll(filepath.Join(dir, file)); err != nil {
				return nil, err
			}
			continue
		}
		n, ext, ok := parseVersion(file)
		switch {
		case !ok:
		case ext == imageSuffix:
			images[n] = true
		default:
			manifests = append(manifests, n)
		}
	}
	var good []version
	slices.Sort(manifests)
	for _, n := range manifests {
		delete(images, n)
		m, err := verify(dir, n)
		if errors.Is(err, errCorrupt) {
			fmt.Fprintf(s.log, "microvm: cache %s: version %d is %v: removed, not used\n", name, n, err)
			if err := s.removeVersion(name, n); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cache %s version %d: %w", name, n, err)
		}
		good = append(good, version{n, m})
	}
	// Images without a manifest: a commit killed before its last step.
	for n := range images {
		if err := os.Remove(filepath.Join(dir, imageName(n))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return good, nil
}

// removeVersion removes version n of name: the manifest first, so that
// the version stops existing before its image goes.
func (s *Store) removeVersion(name string, n int) error {
	dir := s.nameDir(name)
	for _, f := range []string{manifestName(n), imageName(n)} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cache %s: remove version %d: %w", name, n, err)
		}
	}
	return nil
}
