package execvm

import (
	"context"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/cachedisk"
)

// VMCaches are the cache disks of a VM that Run does not make (run
// --cache): the same checkout, mount, write-back and commit as an exec's,
// driven by the VM's owner. Its methods are called by one goroutine at a
// time, in order: SetUp once the agent answers, WriteBack when the main
// process ended 0, Finish once the VM is gone.
type VMCaches struct{ x *extraDisks }

// AttachCaches checks caches out of store and adds them to cfg's disks.
// On error nothing is left behind.
func AttachCaches(ctx context.Context, cfg *microvm.Config, store *cachedisk.Store, caches []Cache) (*VMCaches, error) {
	x, err := attachDisks(ctx, cfg, Options{CacheStore: store, Caches: caches, cmd: "run"})
	if err != nil {
		return nil, err
	}
	return &VMCaches{x: x}, nil
}

// Caches are the caches AttachCaches checked out, in its order.
func (v *VMCaches) Caches() []Cache { return v.x.caches }

// SetUp mounts the caches in the guest r runs commands in.
func (v *VMCaches) SetUp(ctx context.Context, r agentvm.Runner) error { return v.x.setUp(ctx, r) }

// WriteBack unmounts the caches in the guest (which writes them back), so
// that Finish may commit them; a cache that does not unmount makes Finish
// discard them all.
func (v *VMCaches) WriteBack(ctx context.Context, r agentvm.Runner) error {
	return v.x.writeBack(ctx, r)
}

// Finish, once the VM is gone, commits the caches when ok (the VM's main
// process ended 0) and WriteBack succeeded, else discards the clones. It
// reports whether they were committed, and the first commit error.
func (v *VMCaches) Finish(ok bool) (committed bool, err error) {
	committed = ok && v.x.unmounted
	return committed, v.x.finish(ok)
}
