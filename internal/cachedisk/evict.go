package cachedisk

import (
	"errors"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// evict applies the limits after a commit to name, whose lock is held and
// whose good versions, oldest first, are good. It removes name's oldest
// versions beyond Limits.Versions, then, while the store's versions take
// more than Limits.TotalBytes, the oldest version of any name that is not
// that name's newest. Another name whose lock is busy is counted (from
// its manifests) but left alone. Removing a version never disturbs a job:
// each clone is a file of its own (a reflink or a copy), not a view of
// its version. With a total bound, the walk across names also removes
// each name's abandoned clones (reap.go), the busy ones' included.
//
// Allocated bytes are each version's own st_blocks: versions that share
// blocks by reflink are counted once each, so the bound is conservative.
func (s *Store) evict(name string, good []version) error {
	for len(good) > s.limits.Versions {
		if err := s.removeVersion(name, good[0].n); err != nil {
			return err
		}
		good = good[1:]
	}
	if s.limits.TotalBytes == 0 {
		return nil
	}
	type candidate struct {
		name string
		v    version
	}
	var total int64
	var candidates []candidate
	add := func(n string, vs []version, evictable bool) {
		for i, v := range vs {
			total += v.m.Allocated
			if evictable && i < len(vs)-1 {
				candidates = append(candidates, candidate{n, v})
			}
		}
	}
	add(name, good, true)
	// The walk across the store also removes what killed jobs left, as a
	// checkout of each name would (reap.go); never a reason to fail.
	s.reapLogged(name)
	names, err := s.names()
	if err != nil {
		return err
	}
	var locks []*os.File
	defer func() {
		for _, l := range locks {
			l.Close()
		}
	}()
	for _, other := range names {
		if other == name {
			continue
		}
		s.reapLogged(other) // needs no lock: a busy name's too
		l, err := s.lock(other, false)
		if errors.Is(err, unix.EWOULDBLOCK) {
			add(other, s.peek(other), false)
			continue
		}
		if err != nil {
			return err
		}
		locks = append(locks, l)
		vs, err := s.scan(other)
		if err != nil {
			return err
		}
		add(other, vs, true)
	}
	slices.SortStableFunc(candidates, func(a, b candidate) int { return a.v.m.Created.Compare(b.v.m.Created) })
	for _, c := range candidates {
		if total <= s.limits.TotalBytes {
			break
		}
		if err := s.removeVersion(c.name, c.v.n); err != nil {
			return err
		}
		total -= c.v.m.Allocated
	}
	return nil
}

// peek reads a busy name's manifests without its lock, for their sizes:
// a version removed meanwhile is skipped.
func (s *Store) peek(name string) []version {
	entries, err := os.ReadDir(s.nameDir(name))
	if err != nil {
		return nil
	}
	var vs []version
	for _, e := range entries {
		n, ext, ok := parseVersion(e.Name())
		if !ok || ext != manifestExt {
			continue
		}
		if m, err := readManifest(s.nameDir(name), n); err == nil {
			vs = append(vs, version{n, m})
		}
	}
	return vs
}

// names lists the store's cache names (directories with valid names).
func (s *Store) names() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && CheckName(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
