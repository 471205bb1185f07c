package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/microvm/microvm/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// Store is a directory of converted images:
//
//	lock                  flock taken for every read (shared) or change (exclusive)
//	refs.json             name -> ID, replaced atomically
//	images/<ID>/rootfs.ext4
//	images/<ID>/image.json
//	tmp/<random>/         work in progress, renamed into images/ when done
//
// Every method is safe for concurrent use, by goroutines and by processes.
type Store struct {
	dir string
}

const (
	imagesDir  = "images"
	tmpDir     = "tmp"
	lockFile   = "lock"
	refsFile   = "refs.json"
	rootfsName = "rootfs.ext4"
	metaName   = "image.json"
)

// refsDoc is refs.json.
type refsDoc struct {
	Refs map[string]string `json:"refs"` // normalized name -> ID
}

// Open opens the store in dir, creating dir (0700) and its layout when
// missing. It removes work left in tmp/ by interrupted pulls and imports
// more than an hour ago, and image directories no name points at (left by
// a crash between storing an image and naming it).
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	s := &Store{dir: abs}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	for _, d := range []string{imagesDir, tmpDir} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	if err := sweepTmp(s.path(tmpDir), time.Now()); err != nil {
		return nil, fmt.Errorf("image store %s: %w", abs, err)
	}
	unlock, err := s.lock(true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.collectOrphans(); err != nil {
		return nil, fmt.Errorf("image store %s: %w", abs, err)
	}
	return s, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

// lock takes the store's flock, exclusive for a change, shared for a read.
func (s *Store) lock(exclusive bool) (unlock func(), err error) {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	f, err := flockFile(s.path(lockFile), how, true)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	return func() { f.Close() }, nil
}

func validID(id string) bool {
	if len(id) != 64 {
		return false
	}
	return isHex(id)
}

func isHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return s != ""
}

// readRefs reads refs.json; a store without one has no names.
func (s *Store) readRefs() (map[string]string, error) {
	b, err := os.ReadFile(s.path(refsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read refs: %w", err)
	}
	var doc refsDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse %s: %w", s.path(refsFile), err)
	}
	if doc.Refs == nil {
		doc.Refs = map[string]string{}
	}
	for n, id := range doc.Refs {
		if !validID(id) {
			return nil, fmt.Errorf("parse %s: name %q points at invalid ID %q", s.path(refsFile), n, id)
		}
	}
	return doc.Refs, nil
}

// writeRefs replaces refs.json: a temporary file, synced, renamed over it,
// and the directory synced. Called with the exclusive lock held.
func (s *Store) writeRefs(refs map[string]string) error {
	b, err := json.MarshalIndent(refsDoc{Refs: refs}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode refs: %w", err)
	}
	if err := atomicfile.Write(s.path(refsFile), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write refs: %w", err)
	}
	return nil
}

// imageIDs lists the IDs stored under images/.
func (s *Store) imageIDs() ([]string, error) {
	entries, err := os.ReadDir(s.path(imagesDir))
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && validID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// exists says whether images/<id> holds a stored image.
func (s *Store) exists(id string) bool {
	_, err := os.Stat(s.path(imagesDir, id, metaName))
	return err == nil
}

// load reads images/<id>/image.json and fills in what is not stored there:
// the rootfs path (so the store can move) and the names from refs.
func (s *Store) load(id string, refs map[string]string) (*Image, error) {
	b, err := os.ReadFile(s.path(imagesDir, id, metaName))
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", id, err)
	}
	var im Image
	if err := json.Unmarshal(b, &im); err != nil {
		return nil, fmt.Errorf("image %s: parse %s: %w", id, metaName, err)
	}
	im.ID = id
	im.Rootfs = s.path(imagesDir, id, rootfsName)
	im.Refs = nil
	for n, rid := range refs {
		if rid == id {
			im.Refs = append(im.Refs, n)
		}
	}
	sort.Strings(im.Refs)
	return &im, nil
}

// normalize turns a user's name for an image into the form stored in
// refs.json.
func normalize(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", err
	}
	return r.Name(), nil
}

// resolve finds what ref means: a stored name (normalized) or an ID or
// unique ID prefix (4 hex digits at least, "sha256:" allowed in front).
// It returns the ID, and the name when ref was one.
func (s *Store) resolve(ref string, refs map[string]string) (id, byName string, err error) {
	if n, err := normalize(ref); err == nil {
		if id, ok := refs[n]; ok {
			return id, n, nil
		}
	}
	p := strings.TrimPrefix(strings.ToLower(ref), "sha256:")
	if len(p) >= 4 && len(p) <= 64 && isHex(p) {
		ids, err := s.imageIDs()
		if err != nil {
			return "", "", err
		}
		var match []string
		for _, id := range ids {
			if strings.HasPrefix(id, p) {
				match = append(match, id)
			}
		}
		switch len(match) {
		case 1:
			return match[0], "", nil
		case 0:
		default:
			return "", "", fmt.Errorf("image %q: ID prefix matches %d images; give more digits", ref, len(match))
		}
	}
	return "", "", fmt.Errorf("image %q: %w", ref, ErrNotFound)
}

// Get finds a stored image by name (normalized as Pull does, so "debian:12"
// finds index.docker.io/library/debian:12) or by ID or unique ID prefix
// of at least 4 hex digits. A miss wraps ErrNotFound.
func (s *Store) Get(ref string) (*Image, error) {
	unlock, err := s.lock(false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	refs, err := s.readRefs()
	if err != nil {
		return nil, err
	}
	id, _, err := s.resolve(ref, refs)
	if err != nil {
		return nil, err
	}
	return s.load(id, refs)
}

// List returns the stored images, one entry per image with all its names,
// sorted by first name (images without a name last, by ID).
func (s *Store) List() ([]Image, error) {
	unlock, err := s.lock(false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	refs, err := s.readRefs()
	if err != nil {
		return nil, err
	}
	ids, err := s.imageIDs()
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, id := range ids {
		im, err := s.load(id, refs)
		if errors.Is(err, fs.ErrNotExist) {
			continue // not a finished image
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *im)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case len(a.Refs) == 0 && len(b.Refs) == 0:
			return a.ID < b.ID
		case len(a.Refs) == 0:
			return false
		case len(b.Refs) == 0:
			return true
		}
		return a.Refs[0] < b.Refs[0]
	})
	return out, nil
}

// Remove drops a name; given an ID (or unique prefix) it drops every name
// of that image. An image no name points at any more is deleted (a VM
// that has its rootfs open keeps reading it).
func (s *Store) Remove(ref string) error {
	unlock, err := s.lock(true)
	if err != nil {
		return err
	}
	defer unlock()
	refs, err := s.readRefs()
	if err != nil {
		return err
	}
	id, byName, err := s.resolve(ref, refs)
	if err != nil {
		return err
	}
	if byName != "" {
		delete(refs, byName)
	} else {
		for n, rid := range refs {
			if rid == id {
				delete(refs, n)
			}
		}
	}
	if err := s.writeRefs(refs); err != nil {
		return err
	}
	for _, rid := range refs {
		if rid == id {
			return nil // still named
		}
	}
	return s.deleteImage(id)
}

// deleteImage moves images/<id> into tmp/ (so it vanishes at once) and
// removes it there. Called with the exclusive lock held.
func (s *Store) deleteImage(id string) error {
	trash, err := os.MkdirTemp(s.path(tmpDir), "rm-")
	if err != nil {
		return fmt.Errorf("remove image %s: %w", id, err)
	}
	dst := filepath.Join(trash, id)
	if err := os.Rename(s.path(imagesDir, id), dst); err != nil {
		os.Remove(trash)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove image %s: %w", id, err)
	}
	if err := removeTree(trash); err != nil {
		return fmt.Errorf("remove image %s: %w", id, err)
	}
	return nil
}

// collectOrphans deletes stored images no name points at. Called with the
// exclusive lock held.
func (s *Store) collectOrphans() error {
	refs, err := s.readRefs()
	if err != nil {
		return err
	}
	named := map[string]bool{}
	for _, id := range refs {
		named[id] = true
	}
	ids, err := s.imageIDs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if !named[id] {
			if err := s.deleteImage(id); err != nil {
				return err
			}
		}
	}
	return nil
}

// nameExisting gives the stored image id the names, when it is stored. It
// reports whether it was. Names that pointed at other images move; an
// image left without a name is deleted.
func (s *Store) nameExisting(id string, names []string) (*Image, bool, error) {
	unlock, err := s.lock(true)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if !s.exists(id) {
		return nil, false, nil
	}
	im, err := s.setNames(id, names)
	return im, true, err
}

// commit moves a finished image directory into images/<id> and names it;
// when another pull stored the same image meanwhile, dir is left alone
// (the caller removes its work directory) and the stored one is named.
func (s *Store) commit(id, dir string, names []string) (*Image, error) {
	unlock, err := s.lock(true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !s.exists(id) {
		dst := s.path(imagesDir, id)
		// A directory without image.json is debris; make room.
		if err := removeTree(dst); err != nil {
			return nil, fmt.Errorf("store image %s: %w", id, err)
		}
		if err := os.Rename(dir, dst); err != nil {
			return nil, fmt.Errorf("store image %s: %w", id, err)
		}
		if err := atomicfile.SyncDir(s.path(imagesDir)); err != nil {
			return nil, fmt.Errorf("store image %s: %w", id, err)
		}
	}
	return s.setNames(id, names)
}

// setNames points names at id, deletes images left without a name, and
// returns the image. Called with the exclusive lock held.
func (s *Store) setNames(id string, names []string) (*Image, error) {
	refs, err := s.readRefs()
	if err != nil {
		return nil, err
	}
	old := map[string]bool{}
	for _, n := range names {
		if prev, ok := refs[n]; ok && prev != id {
			old[prev] = true
		}
		refs[n] = id
	}
	if err := s.writeRefs(refs); err != nil {
		return nil, err
	}
	for _, rid := range refs {
		delete(old, rid)
	}
	for prev := range old {
		if err := s.deleteImage(prev); err != nil {
			return nil, err
		}
	}
	return s.load(id, refs)
}
