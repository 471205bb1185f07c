package execvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/vms"
)

// Cache is one cache disk of an exec (--cache NAME=GUESTPATH[,size=S]):
// a private copy-on-write clone of NAME's newest committed version,
// mounted at GuestPath before the command runs and committed as NAME's
// next version when the command exits 0.
type Cache struct {
	Name      string
	GuestPath string
	// Size is a new cache's size in bytes (a version keeps the size it
	// was made with).
	Size int64
}

// Docker is exec --docker: Docker started in the guest before the
// command, its data root on a disk of the VM's own (or on a Cache whose
// GuestPath is dockervm.DataRoot, where it outlives the VM).
type Docker struct {
	// DiskSize is the data disk's size (0: dockervm.DefaultDiskSize).
	DiskSize uint64
	// Start is how dockerd is started and waited for.
	Start dockervm.Options
}

// cacheSerial is the serial of the i-th cache disk, by which the guest
// finds it; the cache whose guest path is Docker's data root gets
// Docker's instead, so that dockervm.Start finds it mounted there.
func cacheSerial(c Cache, i int) string {
	if filepath.Clean(c.GuestPath) == dockervm.DataRoot {
		return dockervm.DiskSerial
	}
	return "microvm-cache-" + strconv.Itoa(i)
}

// extraDisks are the disks an exec adds to its VM for its caches and
// Docker, from checkout to commit. The owner is Run's goroutine.
type extraDisks struct {
	store  *cachedisk.Store
	caches []Cache
	clones []cachedisk.Clone
	docker *Docker
	// dockerDisk is the data disk made for this VM (none when a cache
	// holds the data root), removed with the VM.
	dockerDisk *dockervm.Disk
	// unmounted: the guest wrote the caches back and unmounted them, so
	// their files are whole once the VM is gone.
	unmounted bool
	// cmd is the command its errors name: exec, or run (VMCaches).
	cmd string
}

// attachDisks checks out o's caches and makes Docker's data disk, adding
// them to cfg's disks. On error nothing is left behind.
func attachDisks(ctx context.Context, cfg *microvm.Config, o Options) (*extraDisks, error) {
	x := &extraDisks{store: o.CacheStore, caches: o.Caches, docker: o.Docker, cmd: "exec"}
	if o.cmd != "" {
		x.cmd = o.cmd
	}
	if len(o.Caches) > 0 && o.CacheStore == nil {
		return nil, fmt.Errorf("%s: caches given without a cache store", x.cmd)
	}
	dataRootCached := false
	for i, c := range o.Caches {
		cl, err := x.store.Checkout(ctx, c.Name, c.Size)
		if err != nil {
			x.release()
			return nil, fmt.Errorf("%s: cache %s: %w", x.cmd, c.Name, err)
		}
		x.clones = append(x.clones, cl)
		p, err := x.store.Path(cl)
		if err != nil {
			x.release()
			return nil, fmt.Errorf("%s: cache %s: %w", x.cmd, c.Name, err)
		}
		serial := cacheSerial(c, i)
		dataRootCached = dataRootCached || serial == dockervm.DiskSerial
		cfg.Disks = append(cfg.Disks, microvm.DiskConfig{Path: p, Serial: serial})
	}
	if o.Docker != nil && !dataRootCached {
		dir := filepath.Join(vms.StateDir(), "docker-disks")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			x.release()
			return nil, fmt.Errorf("%s: docker disk: %w", x.cmd, err)
		}
		f, err := os.CreateTemp(dir, "disk-*.ext4")
		if err != nil {
			x.release()
			return nil, fmt.Errorf("%s: docker disk: %w", x.cmd, err)
		}
		f.Close()
		os.Remove(f.Name()) // CreateDisk makes it, refusing one that exists
		size := o.Docker.DiskSize
		if size == 0 {
			size = dockervm.DefaultDiskSize
		}
		d, err := dockervm.CreateDisk(ctx, f.Name(), size)
		if err != nil {
			x.release()
			return nil, fmt.Errorf("%s: %w", x.cmd, err)
		}
		x.dockerDisk = &d
		cfg.Disks = append(cfg.Disks, d.Config())
	}
	return x, nil
}

// setUp mounts the caches and starts Docker in the guest r runs commands
// in, before the command.
func (x *extraDisks) setUp(ctx context.Context, r agentvm.Runner) error {
	if x == nil {
		return nil
	}
	for i, c := range x.caches {
		st, out, err := agentvm.MountDisk(ctx, r, cacheSerial(c, i), c.GuestPath)
		if err != nil {
			return fmt.Errorf("%s: cache %s: mounting it at %s: %w", x.cmd, c.Name, c.GuestPath, err)
		}
		if st != 0 {
			return fmt.Errorf("%s: cache %s: mounting it at %s failed (status %d): %s", x.cmd, c.Name, c.GuestPath, st, strings.TrimSpace(out))
		}
	}
	if x.docker != nil {
		return dockervm.Start(ctx, r, x.docker.Start)
	}
	return nil
}

// writeBack, after a command that exited 0, stops Docker (when a cache
// holds its data root) and unmounts the caches in the guest, so that
// their files hold everything the job wrote. A cache that does not
// unmount is not committed.
func (x *extraDisks) writeBack(ctx context.Context, r agentvm.Runner) error {
	if x == nil || len(x.caches) == 0 {
		return nil
	}
	if x.docker != nil {
		if err := dockervm.Stop(ctx, r); err != nil {
			return fmt.Errorf("%s: caches not kept: %w", x.cmd, err)
		}
	}
	for _, c := range x.caches {
		st, out, err := agentvm.UnmountDisk(ctx, r, c.GuestPath)
		if err != nil {
			return fmt.Errorf("%s: cache %s not kept: unmounting %s: %w", x.cmd, c.Name, c.GuestPath, err)
		}
		if st != 0 {
			return fmt.Errorf("%s: cache %s not kept: unmounting %s failed: %s", x.cmd, c.Name, c.GuestPath, out)
		}
	}
	x.unmounted = true
	return nil
}

// finish, once the VM is gone, commits the caches when the command
// exited 0 and the guest unmounted them, else discards them, and removes
// Docker's data disk. It returns the first commit error.
func (x *extraDisks) finish(ok bool) error {
	var err error
	if ok && x.unmounted {
		for i, cl := range x.clones {
			if _, cerr := x.store.Commit(cl); cerr != nil && err == nil {
				err = fmt.Errorf("%s: cache %s: committing: %w", x.cmd, x.caches[i].Name, cerr)
			}
		}
		x.clones = nil
	}
	x.release()
	return err
}

// release discards the clones not committed and removes Docker's data
// disk.
func (x *extraDisks) release() {
	for _, cl := range x.clones {
		x.store.Discard(cl)
	}
	x.clones = nil
	if x.dockerDisk != nil {
		x.dockerDisk.Remove()
		x.dockerDisk = nil
	}
}
