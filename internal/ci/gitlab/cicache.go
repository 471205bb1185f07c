package gitlab

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/vms"
)

// A job's cache disk (docs/ci.md, "Caches"): the slot's cache is a name in
// an internal/cachedisk store under --cache-dir. prepare checks out a
// private copy-on-write clone of its newest committed version (a fresh
// sparse ext4 image the first time) and gives it to the job's VM; run
// records whether the job passed; cleanup, after the VM is gone, commits
// the clone as the slot's next version when the job passed and discards
// it when it failed, was cancelled or never ran. A warm VM (cipool.go)
// holds a clone of its own, checked out when it is offered, which the job
// that claims it takes over. Prepare's --cache-limit, noted in the job's
// record, bounds the whole store at each of cleanup's commits.

// jobCache is a clone of a slot's cache and the store it belongs to, as
// the job record and a warm VM's offer keep it.
type jobCache struct {
	Dir   string          `json:"dir"`
	Clone cachedisk.Clone `json:"clone"`
}

// cacheStoreDir is --cache-dir, or its default.
func cacheStoreDir(dir string) string {
	if dir == "" {
		return filepath.Join(vms.StateDir(), "ci-cache")
	}
	return dir
}

// checkoutCache checks out a clone of the slot's cache for a job's or a
// warm VM's disk; corrupt versions it skips are reported on stderr.
func checkoutCache(dir, slot string, size uint64, stderr io.Writer) (*jobCache, string, error) {
	store, err := cachedisk.Open(dir, cachedisk.Limits{}, stderr)
	if err != nil {
		return nil, "", err
	}
	c, err := store.Checkout(context.Background(), slot, int64(size))
	if err != nil {
		return nil, "", err
	}
	disk, err := store.Path(c)
	if err != nil {
		return nil, "", err
	}
	return &jobCache{Dir: dir, Clone: c}, disk, nil
}

// discard removes the clone without committing it; a nil jobCache (a
// record or offer without one) has nothing to remove.
func (jc *jobCache) discard() error {
	if jc == nil {
		return nil
	}
	store, err := cachedisk.Open(jc.Dir, cachedisk.Limits{}, io.Discard)
	if err != nil {
		return err
	}
	return store.Discard(jc.Clone)
}

// finishCache ends the job's cache after its VM is gone: the clone is
// committed as the slot's next version when the job passed, else
// discarded. It says which on stderr, in one line; a commit that fails
// (a full disk, a disk the job wrecked) keeps the last good version and
// is not the job's failure. A commit applies the record's CacheLimit to
// the store (commitClone).
func finishCache(rec *ciJobRecord, stderr io.Writer) {
	jc := rec.Cache
	if jc == nil {
		return
	}
	if !rec.passed() {
		if err := jc.discard(); err != nil {
			fmt.Fprintf(stderr, "microvm: cache %s: discarding the failed job's writes: %v\n", rec.Slot, err)
			return
		}
		fmt.Fprintf(stderr, "microvm: cache %s: the job did not pass: its writes are discarded, the last committed version kept\n", rec.Slot)
		return
	}
	commitClone(jc, rec.Slot, rec.CacheLimit, stderr)
}

// commitClone commits a job's clone as its cache's next version, saying
// so on stderr under the cache's name; a commit that fails discards the
// clone and keeps the last good version. The commit then evicts as
// cachedisk does for exec --cache-limit: with limit above 0, the oldest
// versions across the store, never a cache's newest, until all take at
// most limit bytes. Eviction never disturbs a running job (its clone is a
// file of its own) and leaves a cache whose lock another job holds; an
// eviction that fails leaves the new version committed and says so.
func commitClone(jc *jobCache, name string, limit int64, stderr io.Writer) {
	store, err := cachedisk.Open(jc.Dir, cachedisk.Limits{TotalBytes: limit}, stderr)
	if err == nil {
		var n int
		n, err = store.Commit(jc.Clone)
		switch {
		case err == nil:
			fmt.Fprintf(stderr, "microvm: cache %s: committed version %d\n", name, n)
			return
		case n > 0: // committed; the error is the eviction's, and says so
			fmt.Fprintf(stderr, "microvm: %v\n", err)
			return
		}
	}
	_ = jc.discard()
	fmt.Fprintf(stderr, "microvm: cache %s: not committed, the last committed version kept: %v\n", name, err)
}

// flushTimeout bounds cleanup's flush of the cache in the job's VM.
const flushTimeout = 20 * time.Second

// flushCache unmounts the cache in the job's VM (or, where something
// still holds it, syncs it), so that the version cleanup commits is a
// clean file system. It is best effort: a VM that is gone or an image
// without umount leaves a disk as a crash leaves it, which ext4's journal
// recovers on the next mount.
func flushCache(rec *ciJobRecord) error {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	rt := Runtime{Interruptible: func(c context.Context) (context.Context, func()) { return ctx, func() {} }}
	cmd := fmt.Sprintf("umount %s 2>/dev/null || sync", ciCacheDir)
	return rt.runJobCommand(rec.VM, []string{rec.shell(), "-c", cmd}, nil, io.Discard, io.Discard)
}

// stageOutcome records what a stage's end says about the job: a step
// stage (step_script, step_release, ..., or the older build_script) that
// succeeded passes it; any stage but after_script that failed fails it
// (GitLab does not fail a job for its after_script). It says whether
// the record changed.
func (r *ciJobRecord) stageOutcome(stage string, err error) bool {
	switch {
	case err != nil && stage != "after_script" && !r.Failed:
		r.Failed = true
		return true
	case err == nil && isStepStage(stage) && !r.Passed:
		r.Passed = true
		return true
	}
	return false
}

// isStepStage: the stage runs the job's own script.
func isStepStage(stage string) bool {
	return strings.HasPrefix(stage, "step_") || stage == "build_script"
}

// passed: the job's cache is to be committed.
func (r *ciJobRecord) passed() bool { return r.Passed && !r.Failed }
