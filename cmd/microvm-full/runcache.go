package main

// `microvm run --image IMAGE --cache NAME=GUESTPATH[,size=S]`: exec's
// cache disks for a VM whose main process is its job. The clones are
// checked out before the boot by the process that owns the VM (the
// detached one's own, for --detach), mounted through the agent before the
// main process (namedvm.Launch.Setup), unmounted in the guest when the
// main process ends 0 (namedvm.Launch.AfterMain), and committed by that
// process once the VM is gone; any other end discards them.

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/internal/namedvm"
)

// runCaches is run's --cache, --cache-dir and --cache-limit, read.
type runCaches struct {
	caches []execvm.Cache
	limits cachedisk.Limits
	dir    string // the store: "" for the default
}

// readRunCaches reads run's --cache, --cache-dir and --cache-limit with exec's parsers
// (the same refusals), and refuses them where run cannot keep a cache:
// without the agent that mounts them, and, with --docker, at Docker's
// data root, which run --docker gives a disk of its own. checkMain
// refuses them without a main process.
func readRunCaches(c *cli.Context, agent, docker bool) (runCaches, error) {
	caches, err := readCaches(listValues(c, "cache"))
	if err != nil {
		return runCaches{}, err
	}
	limits, err := readCacheLimit(c.String("cache-limit"))
	if err != nil {
		return runCaches{}, err
	}
	if clibase.IsSet(c, "cache-limit") && len(caches) == 0 {
		return runCaches{}, clibase.Usagef("--cache-limit is --cache's: give --cache too")
	}
	dir := c.String("cache-dir")
	if clibase.IsSet(c, "cache-dir") && len(caches) == 0 {
		return runCaches{}, clibase.Usagef("--cache-dir is --cache's: give --cache too")
	}
	if clibase.IsSet(c, "cache-dir") {
		// Absolute, for a detached VM's process too.
		if dir == "" || strings.ContainsAny(dir, "\x00\n") {
			return runCaches{}, clibase.Usagef("--cache-dir %q: want a directory", dir)
		}
		if dir, err = filepath.Abs(dir); err != nil {
			return runCaches{}, clibase.Usagef("--cache-dir %q: %v", c.String("cache-dir"), err)
		}
	}
	if len(caches) == 0 {
		return runCaches{}, nil
	}
	if !agent {
		return runCaches{}, clibase.Usagef("--cache needs --image: the caches are mounted through the guest's agent and kept when the image's main process exits 0")
	}
	for _, ca := range caches {
		if docker && ca.GuestPath == dockervm.DataRoot {
			return runCaches{}, clibase.Usagef("--cache %s=%s: run --docker keeps Docker's data root on a disk of the VM's own", ca.Name, ca.GuestPath)
		}
	}
	return runCaches{caches: caches, limits: limits, dir: dir}, nil
}

// checkMain refuses caches for a VM with no main process (--with-agent
// alone, --idle), whose status 0 is what keeps them.
func (rc runCaches) checkMain(hasMain bool) error {
	if len(rc.caches) > 0 && !hasMain {
		return clibase.Usagef("--cache needs the image's main process (not --idle): the caches are kept when it exits 0")
	}
	return nil
}

// cacheNames lists caches' names for a log line.
func cacheNames(caches []execvm.Cache) string {
	names := make([]string, len(caches))
	for i, c := range caches {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}

// checkout opens the store and checks the caches out into cfg's disks,
// before the launch is built. nil when run has no --cache.
func (rc runCaches) checkout(cfg *microvm.Config) (*execvm.VMCaches, error) {
	if len(rc.caches) == 0 {
		return nil, nil
	}
	store, err := cachedisk.OpenDir(rc.dir, rc.limits)
	if err != nil {
		return nil, clibase.Failure{Err: fmt.Errorf("run: %w", err)}
	}
	v, err := execvm.AttachCaches(context.Background(), cfg, store, rc.caches)
	if err != nil {
		return nil, clibase.Failure{Err: err}
	}
	return v, nil
}

// cacheLaunch is l with caches (v's) mounted (before l's own setup, run
// --docker's) once the agent answers, and unmounted when the main process
// ends 0; env is the environment the mounts run with. A main process that
// is not root gets each cache's top directory as its own (chownCaches).
func cacheLaunch(l namedvm.Launch, v *execvm.VMCaches, caches []execvm.Cache, env []string) namedvm.Launch {
	setup := l.Setup
	var owner []string
	if l.Main != nil {
		owner = cacheOwner(l.Main.UID, l.Main.GID)
	}
	l.Setup = func(ctx context.Context, c *agentapi.Client) error {
		r := agentvm.AgentRunner{Client: c, Env: env}
		if err := v.SetUp(ctx, r); err != nil {
			return err
		}
		if err := chownCaches(ctx, r, caches, owner); err != nil {
			return err
		}
		if setup != nil {
			return setup(ctx, c)
		}
		return nil
	}
	if l.SetupStatus == 0 {
		l.SetupStatus = clibase.StatusFailure
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

// finishCaches, once the VM is gone, commits v's caches when the VM ended
// without error (runErr nil: status 0) and the guest unmounted them after
// its main process ended 0, else discards them with one line.
func finishCaches(v *execvm.VMCaches, caches []execvm.Cache, runErr error, log logrus.FieldLogger) error {
	if v == nil {
		return nil
	}
	committed, err := v.Finish(runErr == nil)
	if err != nil {
		return clibase.Failure{Err: err}
	}
	if !committed {
		log.Warnf("run: caches %s not kept: %s", cacheNames(caches), discardReason(runErr))
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
