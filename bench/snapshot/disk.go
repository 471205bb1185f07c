package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// diskUse is what a snapshot directory takes on disk: allocated blocks
// (st_blocks), which is what a sparse memory file costs, not its length.
type diskUse struct {
	// MemoryBytes is the allocated size of the memory parts (*.mem): the
	// guest pages that held a non-zero byte.
	MemoryBytes int64 `json:"memory_allocated_bytes"`
	// MemoryLength is their apparent length: the guest's memory size.
	MemoryLength int64 `json:"memory_length_bytes"`
	// TotalBytes is the allocated size of every file in the directory:
	// the memory parts, the state parts and the manifest.
	TotalBytes int64 `json:"total_allocated_bytes"`
}

// memorySuffix names a snapshot's memory parts (internal/snapshot).
const memorySuffix = ".mem"

// measureDisk adds up the files of the snapshot in dir.
func measureDisk(dir string) (diskUse, error) {
	var u diskUse
	entries, err := os.ReadDir(dir)
	if err != nil {
		return u, fmt.Errorf("snapshot size: %w", err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return u, fmt.Errorf("snapshot size: %w", err)
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		alloc := allocated(fi)
		u.TotalBytes += alloc
		if strings.HasSuffix(e.Name(), memorySuffix) {
			u.MemoryBytes += alloc
			u.MemoryLength += fi.Size()
		}
	}
	if u.MemoryLength == 0 {
		return u, fmt.Errorf("snapshot size: no %s part in %s", memorySuffix, filepath.Base(dir))
	}
	return u, nil
}

// allocated is the disk space a file takes: its allocated blocks, which
// st_blocks counts in 512-byte units whatever the file system's block size.
func allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// canDropCache reports whether the page cache of files in dir can be
// dropped: not on a tmpfs (the nested-KVM box's /tmp), whose pages are
// the files themselves.
func canDropCache(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type != unix.TMPFS_MAGIC
}

// dropCache evicts the snapshot in dir's memory parts from the page cache
// (posix_fadvise DONTNEED: clean pages no process maps; the snapshot was
// fsynced when written), so that the next restore reads them from disk.
func dropCache(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), memorySuffix) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		if err != nil {
			return fmt.Errorf("drop %s from the page cache: %w", e.Name(), err)
		}
	}
	return nil
}
