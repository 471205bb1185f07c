package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/internal/cachedisk"
)

// The cache part's disk: its size, what a job writes into it and where.
const (
	cacheSize    = 1 << 30
	cacheWritten = 100 << 20
	cacheAt      = 256 << 20
)

// cacheMain times one CI job's cache cost on this host: clone (Checkout of
// the newest version) and Commit of a 1 GiB cache, after writing
// cacheWritten bytes into the clone.
func cacheMain(args []string) error {
	fs := flag.NewFlagSet(prog+" cache", flag.ContinueOnError)
	dir := fs.String("dir", "build/bench/docker-state", "a directory for the cache store (on the file system the figures are for)")
	n := fs.Int("n", 5, "jobs to time")
	jsonOut := fs.String("json", "", "write the results as JSON here")
	parse(fs, args)
	if *n < 1 {
		fmt.Fprintf(os.Stderr, "%s: -n must be at least 1\n", prog)
		usage()
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	storeDir, err := os.MkdirTemp(*dir, "cache-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(storeDir)
	s, err := cachedisk.Open(storeDir, cachedisk.Limits{}, nil)
	if err != nil {
		return err
	}
	data := make([]byte, cacheWritten)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	// The first version: a fresh ext4 disk with the data in it.
	t := time.Now()
	if _, err := job(s, data); err != nil {
		return fmt.Errorf("first version: %w", err)
	}
	fresh := time.Since(t)

	var clones, writes, commits []time.Duration
	method := ""
	for i := 0; i < *n; i++ {
		data[0] = byte(i)
		r, err := job(s, data)
		if err != nil {
			return fmt.Errorf("job %d: %w", i+1, err)
		}
		clones, writes, commits = append(clones, r.clone), append(writes, r.write), append(commits, r.commit)
		method = r.method
	}
	fsName := fsType(storeDir)
	clone, write, commit := benchenv.MedianDuration(clones), benchenv.MedianDuration(writes), benchenv.MedianDuration(commits)

	fmt.Printf("cache disk, %d MiB ext4 holding %d MiB, %d MiB written per job, %d jobs, medians (this host, no VM)\n\n",
		cacheSize>>20, cacheWritten>>20, cacheWritten>>20, *n)
	fmt.Printf("%-12s %12s %12s   %-12s %s\n", "", "clone ms", "commit ms", "method", "file system")
	fmt.Printf("%-12s %12.1f %12.1f   %-12s %s\n", "1 GiB cache", benchenv.MS(clone), benchenv.MS(commit), method, fsName)
	fmt.Printf("\nwriting %d MiB into the clone: %.1f ms; the first version (a fresh ext4, the write, the commit): %.1f ms\n",
		cacheWritten>>20, benchenv.MS(write), benchenv.MS(fresh))
	if *jsonOut == "" {
		return nil
	}
	return benchenv.WriteJSON(*jsonOut, map[string]any{
		"host": benchenv.HostInfo(), "jobs": *n, "size_bytes": cacheSize, "written_bytes": cacheWritten,
		"clone_ms": benchenv.MS(clone), "write_ms": benchenv.MS(write), "commit_ms": benchenv.MS(commit),
		"first_version_ms": benchenv.MS(fresh), "method": method, "filesystem": fsName,
	})
}

// jobTimes is one job's cache steps.
type jobTimes struct {
	clone, write, commit time.Duration
	method               string
}

// job checks out the cache "bench", writes data into the clone at cacheAt
// and commits it.
func job(s *cachedisk.Store, data []byte) (jobTimes, error) {
	var r jobTimes
	t0 := time.Now()
	c, err := s.Checkout(context.Background(), "bench", cacheSize)
	if err != nil {
		return r, err
	}
	t1 := time.Now()
	p, err := s.Path(c)
	if err != nil {
		s.Discard(c)
		return r, err
	}
	if err := writeAt(p, cacheAt, data); err != nil {
		s.Discard(c)
		return r, err
	}
	t2 := time.Now()
	if _, err := s.Commit(c); err != nil {
		return r, err
	}
	r.clone, r.write, r.commit, r.method = t1.Sub(t0), t2.Sub(t1), time.Since(t2), c.Method
	return r, nil
}

// writeAt writes data at off in the file at path.
func writeAt(path string, off int64, data []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, off); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fsType names the file system that holds dir.
func fsType(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err.Error()
	}
	switch uint32(st.Type) {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.V9FS_MAGIC:
		return "9p"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	}
	return fmt.Sprintf("magic %#x", st.Type)
}
