package gitlab

import (
	"context"
	"errors"
	"fmt"
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

// DockerOptions are prepare's --docker flags.
type DockerOptions struct {
	// DiskSize is the data disk's size (0: dockervm.DefaultDiskSize).
	DiskSize uint64
	// Timeout bounds the wait for dockerd to answer (0:
	// dockervm.DefaultTimeout).
	Timeout time.Duration
}

// errDockerWarmPool refuses --docker with --warm-pool.
var errDockerWarmPool = errors.New("--docker is not for the warm pool (--warm-pool): a warm VM is booted before its job, without Docker's data disk; give one or the other")

// dockerDiskPath is where the job whose record is at recPath keeps
// Docker's data disk: beside the record, named after the same hash.
func dockerDiskPath(recPath string) string {
	return strings.TrimSuffix(recPath, ".json") + "-docker.ext4"
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
