package gitlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/dockervm"
)

// Docker in the job's VM (docs/ci.md, "Jobs that build containers"): with
// prepare --docker, prepare makes Docker's data root, a sparse ext4 file
// of the job's own next to its record (ci-jobs/HASH-docker.ext4, HASH
// from the job's token: never a name the job chose), notes it in the
// record, gives it to the VM as one more disk (dockervm.DiskSerial) and,
// once the cache is mounted, starts dockerd through the agent
// (dockervm.Start) before the job's stages run. A Docker that does not
// come up fails prepare with dockerd's log tail, and the VM and the disk
// are removed; cleanup removes the disk of every job whose record names
// one, whatever happened, so that no disk outlives its job. --docker is
// not for the warm pool: a warm VM booted without a job has no data disk.
//
// With --docker-cache the data disk is instead a clone of the slot's
// Docker cache (dockerCacheName: the slot's name, from what cicache.go
// proves of the project, and "-docker"; never a name the job chose),
// checked out from the same store as the slot's cache and noted in the
// record as DockerCache. Cleanup of a job that passed first stops dockerd
// and unmounts the data root in the VM (flushDocker); the clone is
// committed as the Docker cache's next version only when the job passed
// and that flush succeeded (dockerCacheVerdict), and discarded otherwise,
// so that a failed job or a data root that was not cleanly unmounted
// leaves the last good version. Each job writes a clone of its own:
// concurrent jobs of a slot never share a writable disk.

// DockerOptions are prepare's --docker flags.
type DockerOptions struct {
	// DiskSize is the data disk's size (0: dockervm.DefaultDiskSize).
	DiskSize uint64
	// Timeout bounds the wait for dockerd to answer (0:
	// dockervm.DefaultTimeout).
	Timeout time.Duration
	// Cache keeps Docker's data root (images, build cache) per project
	// and slot: the data disk is a clone of the slot's Docker cache,
	// committed when the job passes (--docker-cache).
	Cache bool
}

// dockerCacheSuffix ends the name of a slot's Docker cache. A slot's own
// cache name ends in digits (cacheSlot), so the two never meet.
const dockerCacheSuffix = "-docker"

// dockerCacheName is the name of the slot's Docker cache in the store.
func dockerCacheName(slot string) string { return slot + dockerCacheSuffix }

// dockerFlushTimeout bounds cleanup's stop of dockerd and unmount of its
// data root: dockerd gives its containers ten seconds, then dockerd and
// containerd thirty each.
const dockerFlushTimeout = 2 * time.Minute

// errDockerWarmPool refuses --docker with --warm-pool.
var errDockerWarmPool = errors.New("--docker is not for the warm pool (--warm-pool): a warm VM is booted before its job, without Docker's data disk; give one or the other")

// dockerDiskPath is where the job whose record is at recPath keeps
// Docker's data disk: beside the record, named after the same hash.
func dockerDiskPath(recPath string) string {
	return strings.TrimSuffix(recPath, ".json") + "-docker.ext4"
}

// checkoutDockerCache checks out a clone of the slot's Docker cache (a
// fresh sparse ext4 of the data disk's size the first time) for the job's
// data disk.
func checkoutDockerCache(dir, slot string, o DockerOptions, stderr io.Writer) (*jobCache, dockervm.Disk, error) {
	size := o.DiskSize
	if size == 0 {
		size = dockervm.DefaultDiskSize
	}
	name := dockerCacheName(slot)
	jc, path, err := checkoutCache(dir, name, size, stderr)
	if err != nil {
		return nil, dockervm.Disk{}, fmt.Errorf("docker cache %s: %w", name, err)
	}
	if strings.ContainsRune(path, ',') {
		_ = jc.discard()
		return nil, dockervm.Disk{}, fmt.Errorf("docker cache %s: the cache directory's path %s has a comma, which run --disk cannot take", name, path)
	}
	return jc, dockervm.Disk{Path: path}, nil
}

// flushDocker stops dockerd in the job's VM and unmounts its data root,
// so that the clone cleanup commits is a clean file system with nothing
// of Docker's in flight. An error (dockerd did not stop, the data root is
// still busy, the VM is gone) means the clone is not to be committed.
func flushDocker(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), dockerFlushTimeout)
	defer cancel()
	c, env, done, err := jobAgent(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	r := agentvm.AgentRunner{Client: c, Env: env}
	if err := dockervm.Stop(ctx, r); err != nil {
		return err
	}
	st, out, err := agentvm.UnmountDisk(ctx, r, dockervm.DataRoot)
	if err != nil {
		return fmt.Errorf("unmounting %s: %w", dockervm.DataRoot, err)
	}
	if st != 0 {
		return fmt.Errorf("unmounting %s failed: %s", dockervm.DataRoot, strings.TrimSpace(out))
	}
	return nil
}

// dockerCacheVerdict says whether cleanup commits the job's Docker cache
// clone: only when the job passed and flushDocker stopped dockerd and
// unmounted the data root (flushErr nil). Otherwise it says why not.
func dockerCacheVerdict(passed bool, flushErr error) (commit bool, why string) {
	switch {
	case !passed:
		return false, "the job did not pass"
	case flushErr != nil:
		return false, "Docker's data root was not cleanly stopped and unmounted (" + flushErr.Error() + ")"
	}
	return true, ""
}

// finishDockerCache ends the job's Docker cache clone after its VM is
// gone: committed or discarded as dockerCacheVerdict says, in one line on
// stderr. A commit that fails keeps the last good version.
func finishDockerCache(rec *ciJobRecord, flushErr error, stderr io.Writer) {
	jc := rec.DockerCache
	if jc == nil {
		return
	}
	name := jc.Clone.Name
	if commit, why := dockerCacheVerdict(rec.passed(), flushErr); !commit {
		if err := jc.discard(); err != nil {
			fmt.Fprintf(stderr, "microvm: cache %s: discarding the job's writes: %v\n", name, err)
			return
		}
		fmt.Fprintf(stderr, "microvm: cache %s: %s: its writes are discarded, the last committed version kept\n", name, why)
		return
	}
	commitClone(jc, name, rec.CacheLimit, stderr)
}

// makeDockerDisk makes the job's Docker data disk at dockerDiskPath.
func makeDockerDisk(recPath string, o DockerOptions) (dockervm.Disk, error) {
	path := dockerDiskPath(recPath)
	if strings.ContainsRune(path, ',') {
		// run --disk splits its value at commas.
		return dockervm.Disk{}, fmt.Errorf("docker disk %s: the state directory's path has a comma, which run --disk cannot take", path)
	}
	size := o.DiskSize
	if size == 0 {
		size = dockervm.DefaultDiskSize
	}
	return dockervm.CreateDisk(context.Background(), path, size)
}

// removeDockerDisk removes the data disk of a job whose record names one.
// The file removed is the one dockerDiskPath derives from the record's own
// path, not the path written in it, so that an edited record cannot name
// another file; a disk that is already gone is fine.
func removeDockerDisk(rec *ciJobRecord, recPath string) error {
	if rec.DockerDisk == "" {
		return nil
	}
	return dockervm.Disk{Path: dockerDiskPath(recPath)}.Remove()
}

// startDocker starts Docker in the job's VM through its agent, with the
// image's environment (jobEnvironment), and waits until dockerd answers;
// SIGINT or SIGTERM (GitLab cancelling the job) ends the wait. Docker's
// own failures are a *dockervm.Error.
func (rt Runtime) startDocker(name string, o DockerOptions) error {
	ctx, stop := rt.Interruptible(context.Background())
	defer stop()
	c, env, done, err := jobAgent(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	return dockervm.Start(ctx, agentvm.AgentRunner{Client: c, Env: env}, dockervm.Options{Timeout: o.Timeout})
}
