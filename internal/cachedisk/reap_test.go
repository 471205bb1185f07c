package cachedisk

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// age sets path's times to ago before now.
func age(t testing.TB, path string, ago time.Duration) {
	t.Helper()
	when := time.Now().Add(-ago)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
}

// holdFlock holds an exclusive flock on path, as a running VM's block
// device holds its disk, until the test ends.
func holdFlock(t testing.TB, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
}

// wantGone and wantThere check whether the file at path exists.
func wantGone(t testing.TB, what, path string) {
	t.Helper()
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s is still there (%v); want it removed", what, err)
	}
}

func wantThere(t testing.TB, what, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("%s: %v; want it kept", what, err)
	}
}

// TestCheckoutReapsAbandoned: a checkout removes the clones that no
// process holds and that were not written for CloneGrace, and keeps a
// held one however old, a young unheld one (a job between its checkout
// and its VM's start) and a file that is not a clone's. List counts them
// before: four clones, one abandoned.
func TestCheckoutReapsAbandoned(t *testing.T) {
	s, log := testStore(t, Limits{})
	_, held := checkout(t, s, "go", 1<<20)
	_, young := checkout(t, s, "go", 1<<20)
	_, old := checkout(t, s, "go", 1<<20)
	other := filepath.Join(s.clonesDir("go"), "notes.txt")
	if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{held, old, other} {
		age(t, p, 2*CloneGrace)
	}
	age(t, young, CloneGrace-time.Minute)
	holdFlock(t, held)
	infos, err := s.List()
	if err != nil || len(infos) != 1 || infos[0].Clones != 4 || infos[0].Abandoned != 1 {
		t.Fatalf("List: %+v, %v; want 4 clones, 1 abandoned", infos, err)
	}
	_, mine := checkout(t, s, "go", 1<<20)
	wantGone(t, "the old clone no one holds", old)
	wantThere(t, "the held clone", held)
	wantThere(t, "the young clone", young)
	wantThere(t, "a file not a clone's", other)
	wantThere(t, "the new clone", mine)
	if l := logLines(log); len(l) != 1 || !strings.Contains(l[0], "removed 1 abandoned clone") {
		t.Errorf("log %q; want one line for the clone removed", l)
	}
	// The probe let go of the lock: a VM may still open what stays.
	holdFlock(t, young)
}

// TestReapErrorKeepsCheckout: an abandoned clone that cannot be removed
// (here a directory under a clone's name, not empty) is one log line and
// the checkout goes on, reaping the others.
func TestReapErrorKeepsCheckout(t *testing.T) {
	s, log := testStore(t, Limits{})
	_, old := checkout(t, s, "go", 1<<20)
	stuck := filepath.Join(s.clonesDir("go"), strings.Repeat("ab", 16)+imageSuffix)
	if err := os.MkdirAll(filepath.Join(stuck, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	age(t, old, 2*CloneGrace)
	age(t, stuck, 2*CloneGrace)
	_, mine := checkout(t, s, "go", 1<<20)
	wantThere(t, "the new clone", mine)
	wantGone(t, "the old clone", old)
	wantThere(t, "the clone that cannot go", stuck)
	l := logLines(log)
	if len(l) != 2 || !strings.Contains(l[1], "not removed, going on") {
		t.Errorf("log %q; want the clone removed and the one not", l)
	}
}

// TestEvictReapsOtherNames: the walk of a commit's eviction across the
// store removes other names' abandoned clones, and not their live ones.
func TestEvictReapsOtherNames(t *testing.T) {
	s, _ := testStore(t, Limits{TotalBytes: 1})
	_, old := checkout(t, s, "b", 1<<20)
	_, live := checkout(t, s, "b", 1<<20)
	age(t, old, 2*CloneGrace)
	age(t, live, 2*CloneGrace)
	holdFlock(t, live)
	commitWith(t, s, "a", 128<<10, []byte("x"))
	wantGone(t, "b's abandoned clone", old)
	wantThere(t, "b's held clone", live)
}

// TestRemoveTakesAbandoned: cache rm's Remove takes a name's clones,
// abandoned ones with the rest.
func TestRemoveTakesAbandoned(t *testing.T) {
	s, _ := testStore(t, Limits{})
	_, old := checkout(t, s, "go", 1<<20)
	age(t, old, 2*CloneGrace)
	if err := s.Remove("go"); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "the abandoned clone", old)
}
