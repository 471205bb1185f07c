// Package atomicfile writes a file whole or not at all: readers of the
// path see the old contents or the new, never part of them (the image
// store's refs and metadata, the CI executor's pool files).
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to a temporary file beside path, syncs it, renames it
// to path and syncs the directory. The temporary file is removed when any
// step fails.
func Write(path string, data []byte, perm os.FileMode) error {
	return place(path, data, perm, os.Rename)
}

// Create is Write for a path that must not exist yet: the temporary file
// is linked to path, which fails (an error matching fs.ErrExist) when
// something is there, so of two writers exactly one wins and readers never
// see part of the file.
func Create(path string, data []byte, perm os.FileMode) error {
	return place(path, data, perm, os.Link)
}

// place writes data to a temporary file beside path, syncs it, puts it at
// path with put (rename or link) and syncs the directory. The temporary
// file is removed unless put renamed it.
func place(path string, data []byte, perm os.FileMode, put func(tmp, path string) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := put(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir makes a directory's entries (a rename, a new file) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
