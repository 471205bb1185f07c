package cachedisk

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkCloneCommit1GiB is one CI job's cache cost: check out a clone
// of a 1 GiB cache (a real mkfs.ext4 image where e2fsprogs is installed)
// that holds 100 MiB of data, write 100 MiB into it as a job would, and
// commit it as the next version. It reports each step's milliseconds per
// job; the store is in the test's temporary directory, so the figures are
// that file system's (reflink on btrfs or XFS, a sparse copy on ext4).
func BenchmarkCloneCommit1GiB(b *testing.B) {
	const size, written, at = 1 << 30, 100 << 20, 256 << 20
	s, _ := testStore(b, Limits{})
	if _, err := exec.LookPath("mkfs.ext4"); err == nil {
		s.newDisk = mkfsExt4
	} else if _, err := os.Stat("/usr/sbin/mkfs.ext4"); err == nil {
		s.newDisk = mkfsExt4
	}
	data := make([]byte, written)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	commitWith(b, s, "bench", at, data)
	var clone, write, commit time.Duration
	method := ""
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		c, p := checkout(b, s, "bench", size)
		t1 := time.Now()
		data[0] = byte(i)
		writeAt(b, p, at, data)
		t2 := time.Now()
		if _, err := s.Commit(c); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		clone, write, commit = clone+t1.Sub(t0), write+t2.Sub(t1), commit+t3.Sub(t2)
		method = c.Method
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(clone), "clone-ms/op")
	b.ReportMetric(ms(write), "write-ms/op")
	b.ReportMetric(ms(commit), "commit-ms/op")
	b.Logf("clone method: %s; file system: %s", method, fsType(s.Dir()))
}

// fsType names the file system under dir, for the benchmark's log.
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
	}
	return fmt.Sprintf("magic %#x", st.Type)
}
