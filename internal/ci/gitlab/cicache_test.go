package gitlab

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// cacheMark is where the tests write into a cache disk: past its ext4
// head, in what mkfs leaves free.
const cacheMark = 8 << 20

// commitCache checks out the slot's cache in the store under dir, writes
// mark into it and commits it (or, with commit false, leaves the clone
// checked out); it returns the clone.
func commitCache(t *testing.T, dir, slot, mark string, commit bool) cachedisk.Clone {
	t.Helper()
	testenv.NeedMkfs(t)
	store, err := cachedisk.Open(dir, cachedisk.Limits{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := store.Checkout(context.Background(), slot, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	p, err := store.Path(c)
	if err != nil {
		t.Fatal(err)
	}
	writeMark(t, p, mark)
	if commit {
		if _, err := store.Commit(c); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func writeMark(t *testing.T, path, mark string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(mark), cacheMark); err != nil {
		t.Fatal(err)
	}
}

// cacheInfo is List's entry for slot in the store under dir (zero when
// the store has none).
func cacheInfo(t *testing.T, dir, slot string) cachedisk.Info {
	t.Helper()
	store, err := cachedisk.Open(dir, cachedisk.Limits{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range infos {
		if i.Name == slot {
			return i
		}
	}
	return cachedisk.Info{}
}

// nextMark is what the slot's next job finds at the mark.
func nextMark(t *testing.T, dir, slot string, n int) string {
	t.Helper()
	store, err := cachedisk.Open(dir, cachedisk.Limits{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := store.Checkout(context.Background(), slot, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Discard(c)
	p, _ := store.Path(c)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, cacheMark); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCleanupCommitsOrDiscards: cleanup commits the job's cache clone as
// the slot's next version when the job passed, and discards it when a
// stage failed or the step never passed; the next job sees the last
// passing job's writes either way, and no clone is left.
func TestCleanupCommitsOrDiscards(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	cacheDir := t.TempDir()
	commitCache(t, cacheDir, "p-0", "v1", true)
	ciJobEnv(t, "tok", 3, 0, nil)
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		passed, failed bool
		mark           string // what the job writes
		want           string // what the next job sees
		said           string
	}{
		{"passed", true, false, "j1", "j1", "committed version 2"},
		{"step failed", false, true, "j2", "j1", "the job did not pass"},
		{"a later stage failed", true, true, "j3", "j1", "the job did not pass"},
		{"cancelled before the step", false, false, "j4", "j1", "the job did not pass"},
		{"passed again", true, false, "j5", "j5", "committed version 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := commitCache(t, cacheDir, "p-0", tc.mark, false)
			// The VM is gone already: cleanup has only the cache to end.
			rec := ciJobRecord{VM: "gitlab-3-gone", Slot: "p-0", Cache: &jobCache{Dir: cacheDir, Clone: c},
				Passed: tc.passed, Failed: tc.failed}
			if err := createJobRecord(jobRecordPath(vms.StateDir(), id), rec); err != nil {
				t.Fatal(err)
			}
			msgs, err := cleanup()
			if err != nil || !strings.Contains(msgs, "microvm: cache p-0: "+tc.said) {
				t.Errorf("cleanup: %v, %q; want %q", err, msgs, tc.said)
			}
			if got := nextMark(t, cacheDir, "p-0", 2); got != tc.want {
				t.Errorf("the next job finds %q, want %q", got, tc.want)
			}
			if info := cacheInfo(t, cacheDir, "p-0"); info.Clones != 0 {
				t.Errorf("clones left: %+v", info)
			}
			if _, err := os.Stat(jobRecordPath(vms.StateDir(), id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the job record is still there: %v", err)
			}
		})
	}
}

// TestRunRecordsOutcome: run marks the job passed when its step script
// succeeds and failed when a stage's script fails, but not for a failing
// after_script (which fails no job in GitLab).
func TestRunRecordsOutcome(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	hostSh, err := exec.LookPath("sh")
	if err != nil {
		testenv.Missing(t, "no sh on this host: %v", err)
	}
	bin := t.TempDir()
	if err := os.Symlink(hostSh, filepath.Join(bin, "bash")); err != nil {
		t.Fatal(err)
	}
	startJobVM(t, "job-outcome", []string{"PATH=" + bin})
	ciJobEnv(t, "tok-outcome", 4, 0, nil)
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	recPath := jobRecordPath(vms.StateDir(), id)
	if err := createJobRecord(recPath, ciJobRecord{VM: "job-outcome", Slot: "p-0"}); err != nil {
		t.Fatal(err)
	}
	script := func(body string) string {
		p := filepath.Join(t.TempDir(), "s.sh")
		if err := os.WriteFile(p, []byte(body+"\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	state := func() (bool, bool) {
		var rec ciJobRecord
		if err := readJSON(recPath, &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Passed, rec.Failed
	}
	for _, st := range []struct {
		stage, body    string
		passed, failed bool
	}{
		{"get_sources", "exit 0", false, false},
		{"step_script", "exit 0", true, false},
		{"after_script", "exit 3", true, false},
		{"archive_cache", "exit 1", true, true},
	} {
		var bf BuildFailure
		err := fakeVMStarter.Run(script(st.body), st.stage, io.Discard, io.Discard)
		if (st.body == "exit 0") != (err == nil) || (err != nil && !errors.As(err, &bf)) {
			t.Fatalf("%s: %v", st.stage, err)
		}
		if p, f := state(); p != st.passed || f != st.failed {
			t.Errorf("after %s (%s): passed %v, failed %v; want %v, %v", st.stage, st.body, p, f, st.passed, st.failed)
		}
	}
	var rec ciJobRecord
	if rec.stageOutcome("step_script", errors.New("lost the VM")); !rec.Failed || rec.passed() {
		t.Errorf("a step that ended in a system failure: %+v; want the job failed", rec)
	}
}

// TestPrepareFailureDiscardsClone: prepare checks out the job's clone
// before starting the VM and records it; when the VM does not start,
// cleanup discards the clone and commits nothing.
func TestPrepareFailureDiscardsClone(t *testing.T) {
	testenv.NeedMkfs(t)
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	cacheDir := t.TempDir()
	ciJobEnv(t, "tok-prep", 6, 0, nil)
	msgs, err := prepare(t, func(o *PrepareOptions) {
		o.CacheKey, o.CacheSize, o.CacheDir, o.BootTimeout = "p", 16<<20, cacheDir, 100*time.Millisecond
	})
	if err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("prepare with a VM starter that fails: %v, %q", err, msgs)
	}
	if info := cacheInfo(t, cacheDir, "p-0"); info.Clones != 1 || info.Versions != 0 {
		t.Errorf("after prepare: %+v; want one clone, no version", info)
	}
	msgs, err = cleanup()
	if err != nil || !strings.Contains(msgs, "did not pass") {
		t.Errorf("cleanup: %v, %q", err, msgs)
	}
	if info := cacheInfo(t, cacheDir, "p-0"); info.Clones != 0 || info.Versions != 0 {
		t.Errorf("after cleanup: %+v; want nothing", info)
	}
}

// TestCleanupCacheLimit: prepare's --cache-limit, noted in the job's
// record, bounds the whole store when cleanup commits a passing job's
// cache: the oldest versions of every cache in it go (another project's
// and the slot's Docker cache too), each cache's newest stays even where
// the newest alone are over the limit, and a running job's clone of an
// evicted version is untouched and still commits. Without a limit each
// cache keeps its two newest versions.
func TestCleanupCacheLimit(t *testing.T) {
	testenv.NeedMkfs(t)
	for _, tc := range []struct {
		name  string
		limit int64
		kept  int // versions each cache keeps
	}{{"no limit", 0, 2}, {"1 byte", 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
			cacheDir := t.TempDir()
			commitCache(t, cacheDir, "q-0", "q1", true)
			running := commitCache(t, cacheDir, "q-0", "qr", false) // a job of q's, from q1
			commitCache(t, cacheDir, "q-0", "q2", true)
			commitCache(t, cacheDir, "p-0-docker", "d1", true)
			commitCache(t, cacheDir, "p-0-docker", "d2", true)
			commitCache(t, cacheDir, "p-0", "p1", true)
			ciJobEnv(t, "tok-limit", 7, 0, nil)
			id, err := JobIdentity()
			if err != nil {
				t.Fatal(err)
			}
			// fakeVMStarter's VM does not start: the record keeps the clone.
			if _, err := prepare(t, func(o *PrepareOptions) {
				o.CacheKey, o.CacheSize, o.CacheDir, o.CacheLimit = "p", 16<<20, cacheDir, tc.limit
			}); err == nil || !strings.Contains(err.Error(), "did not start") {
				t.Fatalf("prepare with a VM starter that fails: %v", err)
			}
			recPath := jobRecordPath(vms.StateDir(), id)
			var rec ciJobRecord
			if err := readJSON(recPath, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.CacheLimit != tc.limit || rec.Cache == nil {
				t.Fatalf("the job's record: %+v; want cache limit %d and a clone", rec, tc.limit)
			}
			// The job writes its cache and passes (as run records it).
			store, err := cachedisk.Open(cacheDir, cachedisk.Limits{}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			p, err := store.Path(rec.Cache.Clone)
			if err != nil {
				t.Fatal(err)
			}
			writeMark(t, p, "p2")
			rec.Passed = true
			if err := writeJSON(recPath, rec); err != nil {
				t.Fatal(err)
			}
			msgs, err := cleanup()
			if err != nil || !strings.Contains(msgs, "microvm: cache p-0: committed version 2\n") {
				t.Fatalf("cleanup: %v, %q", err, msgs)
			}
			for slot, newest := range map[string]string{"p-0": "p2", "q-0": "q2", "p-0-docker": "d2"} {
				if info := cacheInfo(t, cacheDir, slot); info.Versions != tc.kept {
					t.Errorf("%s: %d versions, want %d", slot, info.Versions, tc.kept)
				}
				if got := nextMark(t, cacheDir, slot, 2); got != newest {
					t.Errorf("%s: the next job finds %q, want the newest version's %q", slot, got, newest)
				}
			}
			// The running job's clone came from q-0's first version, which
			// the 1-byte limit evicted: the clone is its own file.
			rp, err := store.Path(running)
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(rp)
			if err != nil {
				t.Fatalf("the running job's clone: %v", err)
			}
			b := make([]byte, 2)
			_, err = f.ReadAt(b, cacheMark)
			f.Close()
			if err != nil || string(b) != "qr" {
				t.Errorf("the running job's clone reads %q (%v), want qr", b, err)
			}
			if n, err := store.Commit(running); err != nil || n != 3 {
				t.Errorf("committing the running job's clone: version %d, %v; want 3", n, err)
			}
		})
	}
}

// TestFinishDockerCacheLimit: the Docker cache's commit keeps the store
// under the record's limit as the slot cache's does.
func TestFinishDockerCacheLimit(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	cacheDir := t.TempDir()
	commitCache(t, cacheDir, "p-0", "p1", true)
	commitCache(t, cacheDir, "p-0", "p2", true)
	commitCache(t, cacheDir, "p-0-docker", "d1", true)
	c := commitCache(t, cacheDir, "p-0-docker", "d2", false)
	rec := &ciJobRecord{VM: "gone", Slot: "p-0", DockerCache: &jobCache{Dir: cacheDir, Clone: c}, Passed: true, CacheLimit: 1}
	var msgs strings.Builder
	finishDockerCache(rec, nil, &msgs)
	if !strings.Contains(msgs.String(), "microvm: cache p-0-docker: committed version 2") {
		t.Errorf("finishDockerCache said %q", msgs.String())
	}
	for slot, newest := range map[string]string{"p-0": "p2", "p-0-docker": "d2"} {
		if info := cacheInfo(t, cacheDir, slot); info.Versions != 1 {
			t.Errorf("%s: %d versions, want only the newest", slot, info.Versions)
		}
		if got := nextMark(t, cacheDir, slot, 2); got != newest {
			t.Errorf("%s: the next job finds %q, want %q", slot, got, newest)
		}
	}
}

// TestCommitEvictionFails: an eviction that fails after the commit (here
// another cache's lock cannot be opened) leaves the new version
// committed, and cleanup's line says so rather than "not committed".
func TestCommitEvictionFails(t *testing.T) {
	cacheDir := t.TempDir()
	commitCache(t, cacheDir, "p-0", "p1", true)
	if err := os.MkdirAll(filepath.Join(cacheDir, "x-0", "lock"), 0o700); err != nil {
		t.Fatal(err)
	}
	c := commitCache(t, cacheDir, "p-0", "p2", false)
	var msgs strings.Builder
	commitClone(&jobCache{Dir: cacheDir, Clone: c}, "p-0", 1, &msgs)
	if s := msgs.String(); !strings.HasPrefix(s, "microvm: cache p-0: committed version 2, then eviction: ") || strings.Count(s, "\n") != 1 {
		t.Errorf("commitClone said %q; want one line saying version 2 is committed and eviction failed", s)
	}
	if got := nextMark(t, cacheDir, "p-0", 2); got != "p2" {
		t.Errorf("the next job finds %q, want p2", got)
	}
}
