package namedvm

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/execvm"
)

// CheckoutCaches opens the cache store in dir (cachedisk.OpenDir: ""
// is the default one) with limits, and checks caches out into cfg's
// disks, before the VM's Launch is built (run --cache). The process that
// owns the VM calls it, and FinishCaches once the VM is gone.
func CheckoutCaches(ctx context.Context, cfg *microvm.Config, dir string, limits cachedisk.Limits, caches []execvm.Cache) (*execvm.VMCaches, error) {
	store, err := cachedisk.OpenDir(dir, limits)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	return execvm.AttachCaches(ctx, cfg, store, caches)
}

// WithCaches is l with v's caches mounted (before l's own setup, run
// --docker's) once the agent answers, and unmounted when the main process
// ends 0; env is the environment the mounts run with. A main process that
// is not root gets each cache's top directory as its own (chownCaches).
// setupStatus is the VM's status when the mounts fail, whatever l's own
// setup's status (a cache that does not mount is not Docker's failure:
// the mounts' errors are SetupErrors of their own); it is also l's
// SetupStatus where l has none.
func WithCaches(l Launch, v *execvm.VMCaches, env []string, setupStatus int) Launch {
	setup, caches := l.Setup, v.Caches()
	var owner []string
	if l.Main != nil {
		owner = cacheOwner(l.Main.UID, l.Main.GID)
	}
	l.Setup = withStep(func(ctx context.Context, c *agentapi.Client) error {
		r := agentvm.AgentRunner{Client: c, Env: env}
		if err := v.SetUp(ctx, r); err != nil {
			return err
		}
		return chownCaches(ctx, r, caches, owner)
	}, setupStatus, setup)
	if l.SetupStatus == 0 {
		l.SetupStatus = setupStatus
	}
	l.AfterMain = func(ctx context.Context, c *agentapi.Client) error {
		return v.WriteBack(ctx, agentvm.AgentRunner{Client: c, Env: env})
	}
	return l
}

// cacheOwner is chown's OWNER[:GROUP] argument for the main process's
// user, nil for root (a cache's top directory is root's already).
func cacheOwner(uid, gid *uint32) []string {
	if uid == nil || *uid == 0 {
		return nil
	}
	o := strconv.FormatUint(uint64(*uid), 10)
	if gid != nil {
		o += ":" + strconv.FormatUint(uint64(*gid), 10)
	}
	return []string{o}
}

// chownCaches gives the main process's user (owner, from cacheOwner) the
// top directory of each mounted cache, as a fresh cache's is root's: only
// that directory, never what a job left in it.
func chownCaches(ctx context.Context, r agentvm.Runner, caches []execvm.Cache, owner []string) error {
	if owner == nil {
		return nil
	}
	for _, ca := range caches {
		st, out, err := r.Run(ctx, []string{"chown", owner[0], ca.GuestPath})
		if err != nil {
			return fmt.Errorf("run: cache %s: giving %s to the main process's user: %w", ca.Name, ca.GuestPath, err)
		}
		if st != 0 {
			return fmt.Errorf("run: cache %s: giving %s to the main process's user failed (status %d): %s", ca.Name, ca.GuestPath, st, strings.TrimSpace(out))
		}
	}
	return nil
}

// FinishCaches, once the VM is gone, commits v's caches when the VM ended
// without error (runErr nil: status 0) and the guest unmounted them after
// its main process ended 0, else discards them with one line to log. v
// nil (no caches) does nothing.
func FinishCaches(v *execvm.VMCaches, runErr error, log logrus.FieldLogger) error {
	if v == nil {
		return nil
	}
	committed, err := v.Finish(runErr == nil)
	if err != nil {
		return err
	}
	if !committed {
		log.Warnf("run: caches %s not kept: %s", cacheNames(v.Caches()), discardReason(runErr))
	}
	return nil
}

// discardReason says why a run's caches were discarded.
func discardReason(runErr error) string {
	if runErr != nil {
		return "the VM did not end with its main process's status 0 (" + runErr.Error() + ")"
	}
	return "the VM ended before its main process ended 0 and the guest unmounted them"
}

// cacheNames lists caches' names for a log line.
func cacheNames(caches []execvm.Cache) string {
	names := make([]string, len(caches))
	for i, c := range caches {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}
