package cachedisk

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"sync"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestCheckoutEmptyStore: a name with no version gives a fresh sparse
// disk of the size asked for, and commits nothing by itself.
func TestCheckoutEmptyStore(t *testing.T) {
	s, log := testStore(t, Limits{})
	c, p := checkout(t, s, "project-1-go", 8<<20)
	if c.Base != 0 || c.Method != cloneNew || c.Name != "project-1-go" {
		t.Errorf("clone %+v: want a new disk of project-1-go", c)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 8<<20 {
		t.Errorf("size %d, want %d", fi.Size(), 8<<20)
	}
	if v := versionsOf(t, s, "project-1-go"); len(v) != 0 {
		t.Errorf("versions %v after a checkout alone; want none", v)
	}
	if l := logLines(log); len(l) != 0 {
		t.Errorf("log %q; want nothing", l)
	}
}

// TestCheckoutMkfs: the store's own fresh disk is a real ext4 image
// (mkfs.ext4), sparse, that passes the commit check.
func TestCheckoutMkfs(t *testing.T) {
	testenv.NeedMkfs(t)
	s, err := Open(t.TempDir(), Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, p := checkout(t, s, "go", 64<<20)
	m, err := describe(p)
	if err != nil {
		t.Fatalf("a fresh disk: %v", err)
	}
	if m.Size != 64<<20 || m.Allocated >= m.Size {
		t.Errorf("fresh disk %d bytes, %d allocated: want 64 MiB, sparse", m.Size, m.Allocated)
	}
	if n, err := s.Commit(c); err != nil || n != 1 {
		t.Fatalf("commit: version %d, %v; want 1", n, err)
	}
	entries, err := os.ReadDir(s.clonesDir("go"))
	if err != nil || len(entries) != 0 {
		t.Errorf("clones left after the commit: %v %v", entries, err)
	}
}

// TestCommitThenCheckout: a committed clone is the next job's disk: its
// bytes are there, in a file of the job's own, and the version is kept
// unchanged by what that job writes.
func TestCommitThenCheckout(t *testing.T) {
	s, _ := testStore(t, Limits{})
	if n := commitWith(t, s, "npm", 300<<10, []byte("first job")); n != 1 {
		t.Fatalf("first commit: version %d, want 1", n)
	}
	c, p := checkout(t, s, "npm", 1<<20)
	if c.Base != 1 {
		t.Errorf("second checkout's base %d, want 1", c.Base)
	}
	if got := readAt(t, p, 300<<10, 9); string(got) != "first job" {
		t.Errorf("the clone holds %q at the written offset; want %q", got, "first job")
	}
	writeAt(t, p, 300<<10, []byte("SECOND!!!"))
	if got := readAt(t, s.imagePath("npm", 1), 300<<10, 9); string(got) != "first job" {
		t.Errorf("version 1 changed under a clone: %q", got)
	}
	if n, err := s.Commit(c); err != nil || n != 2 {
		t.Fatalf("second commit: version %d, %v; want 2", n, err)
	}
	_, p = checkout(t, s, "npm", 1<<20)
	if got := readAt(t, p, 300<<10, 9); string(got) != "SECOND!!!" {
		t.Errorf("third job sees %q; want the second job's write", got)
	}
}

// TestConcurrentCheckouts: jobs checking out the same name at once each
// get a file of their own; a write to one is not in another.
func TestConcurrentCheckouts(t *testing.T) {
	s, _ := testStore(t, Limits{})
	commitWith(t, s, "go", 128<<10, []byte("base"))
	const jobs = 8
	paths := make([]string, jobs)
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for i := range jobs {
		wg.Go(func() {
			c, err := s.Checkout(context.Background(), "go", 1<<20)
			if err == nil {
				paths[i], err = s.Path(c)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, p := range paths {
		writeAt(t, p, 200<<10, []byte{byte('A' + i)})
	}
	for i, p := range paths {
		if got := readAt(t, p, 200<<10, 1); got[0] != byte('A'+i) {
			t.Errorf("clone %d holds %q, another job's write", i, got)
		}
		fi, _ := os.Stat(p)
		for j := range i {
			fj, _ := os.Stat(paths[j])
			if os.SameFile(fi, fj) {
				t.Errorf("clones %d and %d are one file", i, j)
			}
		}
	}
}

// TestCommitRace: jobs committing the same name at once all succeed, as
// successive versions; the newest holds the writes of the commit that
// got the highest number, and every kept version is whole.
func TestCommitRace(t *testing.T) {
	const jobs = 8
	s, log := testStore(t, Limits{Versions: jobs})
	clones := make([]Clone, jobs)
	for i := range clones {
		var p string
		clones[i], p = checkout(t, s, "docker", 1<<20)
		writeAt(t, p, 500<<10, []byte{byte('a' + i)})
	}
	got := make([]int, jobs)
	errs := make([]error, jobs)
	var wg sync.WaitGroup
	for i := range clones {
		wg.Go(func() { got[i], errs[i] = s.Commit(clones[i]) })
	}
	wg.Wait()
	seen := map[int]int{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
		seen[got[i]] = i
	}
	for n := 1; n <= jobs; n++ {
		i, ok := seen[n]
		if !ok {
			t.Fatalf("versions %v: want each of 1 to %d once", got, jobs)
		}
		if b := readAt(t, s.imagePath("docker", n), 500<<10, 1); b[0] != byte('a'+i) {
			t.Errorf("version %d holds %q, want job %d's write", n, b, i)
		}
	}
	c, _ := checkout(t, s, "docker", 1<<20)
	if c.Base != jobs {
		t.Errorf("the next job clones version %d, want the newest, %d", c.Base, jobs)
	}
	if l := logLines(log); len(l) != 0 {
		t.Errorf("log %q; want nothing", l)
	}
}

// TestDiscard: a failed job's clone is removed and the versions are as
// they were; the next job sees the last commit, not the failed job's
// writes.
func TestDiscard(t *testing.T) {
	s, _ := testStore(t, Limits{})
	commitWith(t, s, "pip", 100<<10, []byte("good"))
	before, err := os.ReadFile(s.imagePath("pip", 1))
	if err != nil {
		t.Fatal(err)
	}
	c, p := checkout(t, s, "pip", 1<<20)
	writeAt(t, p, 100<<10, []byte("BAD!"))
	if err := s.Discard(c); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the discarded clone is still there: %v", err)
	}
	if v := versionsOf(t, s, "pip"); len(v) != 1 || v[0] != 1 {
		t.Errorf("versions %v after a discard; want [1]", v)
	}
	after, err := os.ReadFile(s.imagePath("pip", 1))
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("version 1 changed by a discarded job (%v)", err)
	}
	if err := s.Discard(c); err != nil {
		t.Errorf("a second discard: %v; want nothing to do", err)
	}
	if _, err := s.Commit(c); err == nil {
		t.Error("commit of a discarded clone succeeded")
	}
}

// TestCommitCorruptClone: a job that wrecked its disk's superblock
// commits nothing: an error, the clone gone, the last good version kept.
func TestCommitCorruptClone(t *testing.T) {
	s, _ := testStore(t, Limits{})
	commitWith(t, s, "go", 100<<10, []byte("good"))
	c, p := checkout(t, s, "go", 1<<20)
	var zero [2]byte
	writeAt(t, p, ext4MagicOff, zero[:])
	if _, err := s.Commit(c); err == nil || !errors.Is(err, errCorrupt) {
		t.Fatalf("commit of a disk without ext4 magic: %v; want a corrupt-disk error", err)
	}
	if v := versionsOf(t, s, "go"); len(v) != 1 || v[0] != 1 {
		t.Errorf("versions %v; want [1]", v)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the corrupt clone is still there: %v", err)
	}
}

// TestFakeExt4 keeps the test double honest: what it writes passes the
// store's check, and without the magic the check fails.
func TestFakeExt4(t *testing.T) {
	p := t.TempDir() + "/d"
	if err := fakeExt4(context.Background(), p, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := describe(p); err != nil {
		t.Fatal(err)
	}
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], 0x1234)
	writeAt(t, p, ext4MagicOff, b[:])
	if _, err := describe(p); !errors.Is(err, errCorrupt) {
		t.Errorf("describe without magic: %v; want errCorrupt", err)
	}
}
