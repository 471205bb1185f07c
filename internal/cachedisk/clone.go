package cachedisk

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// cloneMethod says how cloneFile made its copy.
type cloneMethod string

const (
	// cloneReflink: the file system shares the blocks (FICLONE).
	cloneReflink cloneMethod = "reflink"
	// cloneSparse: data ranges copied, holes kept.
	cloneSparse cloneMethod = "sparse copy"
)

// cloneFile makes dst (which must not exist) a private copy of the open
// file src: a reflink where the file system allows one, else a sparse
// copy; on error dst is removed. dst is not synced: a clone lost to a
// host crash is lost with its job, and Commit syncs what it keeps.
func cloneFile(dst string, src *os.File) (cloneMethod, error) {
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	method, err := cloneInto(out, src)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return "", fmt.Errorf("clone %s: %w", src.Name(), err)
	}
	return method, nil
}

// cloneInto copies in into the empty out, by reflink or sparse copy.
func cloneInto(out, in *os.File) (cloneMethod, error) {
	err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err == nil {
		return cloneReflink, nil
	}
	if !reflinkRefused(err) {
		return "", fmt.Errorf("FICLONE: %w", err)
	}
	return cloneSparse, sparseCopy(out, in)
}

// reflinkRefused: FICLONE's errors that mean "not here" (the file system
// cannot share blocks, or not between these files), not a failure.
func reflinkRefused(err error) bool {
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENOTSUP, unix.ENOTTY, unix.EXDEV, unix.EINVAL, unix.ENOSYS, unix.EPERM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sparseCopy copies in's data ranges (SEEK_DATA to SEEK_HOLE) into out at
// the same offsets and sets out's length to in's, leaving the holes holes.
func sparseCopy(out, in *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole to the end
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE: %w", err)
		}
		if err := copyRange(out, in, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyRange copies n bytes at off from in to out at the same offset:
// copy_file_range, or reads and writes where the kernel refuses it.
func copyRange(out, in *os.File, off, n int64) error {
	src, dst := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &src, int(out.Fd()), &dst, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeRW(out, in, src, n)
			}
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if c == 0 {
			return fmt.Errorf("copy_file_range: %w at %d", io.ErrUnexpectedEOF, src)
		}
		n -= int64(c)
	}
	return nil
}

// copyRangeRW is copyRange through a buffer.
func copyRangeRW(out, in *os.File, off, n int64) error {
	w := io.NewOffsetWriter(out, off)
	if _, err := io.Copy(w, io.NewSectionReader(in, off, n)); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	return nil
}
