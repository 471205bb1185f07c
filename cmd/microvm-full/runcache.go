package main

// `microvm run --image IMAGE --cache NAME=GUESTPATH[,size=S]`: exec's
// cache disks for a VM whose main process is its job. The clones are
// checked out before the boot by the process that owns the VM (the
// detached one's own, for --detach), mounted through the agent before the
// main process and unmounted in the guest when it ends 0
// (namedvm.WithCaches), and committed by that process once the VM is gone
// (namedvm.FinishCaches); any other end discards them. This file reads
// the flags.

import (
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/execvm"
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
