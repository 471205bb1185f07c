package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/execvm"
)

// defaultCacheSize is a new cache disk's size when --cache names none:
// the file is sparse, so the host pays only for what the jobs write.
const defaultCacheSize = 4 << 30

// cacheCommand is `microvm cache ls|rm`: the cache disks that exec
// --cache keeps (internal/cachedisk), by name.
func cacheCommand(stdout io.Writer) *cli.Command {
	dirFlag := &cli.StringFlag{Name: "dir", Usage: "the cache store (default $MICROVM_STATE_DIR/caches; the GitLab executor's is $MICROVM_STATE_DIR/ci-cache)"}
	return &cli.Command{
		Name:         "cache",
		Usage:        "list or remove the cache disks that exec --cache keeps",
		OnUsageError: onUsageError,
		Subcommands: []*cli.Command{
			{
				Name:         "ls",
				Usage:        "list the caches: committed versions, size, when last committed, clones in use and abandoned by killed jobs",
				UsageText:    "microvm cache ls [--dir DIR] [--json]",
				OnUsageError: onUsageError,
				Flags:        []cli.Flag{dirFlag, &cli.BoolFlag{Name: "json", Usage: "one JSON array of the caches, for machines"}},
				Action: func(c *cli.Context) error {
					if c.NArg() > 0 {
						return clibase.Usagef("cache ls takes no arguments")
					}
					s, err := cachedisk.OpenDir(c.String("dir"), cachedisk.Limits{})
					if err != nil {
						return clibase.Failure{Err: err}
					}
					list, err := s.List()
					if err != nil {
						return clibase.Failure{Err: err}
					}
					return printCaches(stdout, list, c.Bool("json"))
				},
			},
			{
				Name:         "rm",
				Usage:        "remove caches, all their versions and clones (jobs running with one keep their open clone, and commit nothing)",
				UsageText:    "microvm cache rm [--dir DIR] NAME...",
				OnUsageError: onUsageError,
				Flags:        []cli.Flag{dirFlag},
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return clibase.Usagef("cache rm: want at least one cache name")
					}
					s, err := cachedisk.OpenDir(c.String("dir"), cachedisk.Limits{})
					if err != nil {
						return clibase.Failure{Err: err}
					}
					var errs []error
					for _, name := range c.Args().Slice() {
						if err := s.Remove(name); err != nil {
							errs = append(errs, fmt.Errorf("cache rm: %w", err))
						}
					}
					if err := errors.Join(errs...); err != nil {
						return clibase.Failure{Err: err}
					}
					return nil
				},
			},
		},
	}
}

// readCacheLimit reads --cache-limit SIZE, exec's and ci gitlab
// prepare's: the bound on what all the store's versions take on disk,
// which a commit enforces by evicting the oldest versions that are not a
// cache's newest.
func readCacheLimit(v string) (cachedisk.Limits, error) {
	if v == "" {
		return cachedisk.Limits{}, nil
	}
	n, err := microvm.ParseSize(v)
	if err != nil || n == 0 || n > 1<<50 {
		return cachedisk.Limits{}, clibase.Usagef("--cache-limit %q: want a size from 1B to 1024T (a bare number is MiB)", v)
	}
	return cachedisk.Limits{TotalBytes: int64(n)}, nil
}

// printCaches is cache ls's output: a table, or JSON (cachedisk.Info).
// Clones in use are those running jobs hold or have just checked out;
// abandoned ones (killed jobs') go at the name's next checkout.
func printCaches(w io.Writer, list []cachedisk.Info, asJSON bool) error {
	if asJSON {
		if list == nil {
			list = []cachedisk.Info{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSIONS\tNEWEST\tSIZE\tON DISK\tCOMMITTED\tCLONES IN USE\tABANDONED")
	for _, in := range list {
		committed := "never"
		if !in.Committed.IsZero() {
			committed = time.Since(in.Committed).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%d\n", in.Name, in.Versions, in.Newest,
			microvm.FormatSize(uint64(in.Size)), microvm.FormatSize(uint64(in.Allocated)), committed,
			in.Clones-in.Abandoned, in.Abandoned)
	}
	return tw.Flush()
}

// parseCache reads one --cache NAME=GUESTPATH[,size=SIZE].
func parseCache(v string) (execvm.Cache, error) {
	spec, opts, _ := strings.Cut(v, ",")
	name, guestPath, ok := strings.Cut(spec, "=")
	if !ok {
		return execvm.Cache{}, clibase.Usagef("--cache %q: want NAME=GUESTPATH[,size=SIZE]", v)
	}
	if err := cachedisk.CheckName(name); err != nil {
		return execvm.Cache{}, clibase.Usagef("--cache %q: %v", v, err)
	}
	if !path.IsAbs(guestPath) || path.Clean(guestPath) == "/" || strings.ContainsAny(guestPath, "\x00\n") {
		return execvm.Cache{}, clibase.Usagef("--cache %q: the guest path must be an absolute directory other than /", v)
	}
	c := execvm.Cache{Name: name, GuestPath: path.Clean(guestPath), Size: defaultCacheSize}
	for opts != "" {
		var o string
		o, opts, _ = strings.Cut(opts, ",")
		k, val, _ := strings.Cut(o, "=")
		if k != "size" {
			return execvm.Cache{}, clibase.Usagef("--cache %q: unknown option %q (want size=SIZE)", v, k)
		}
		n, err := microvm.ParseSize(val)
		if err != nil || n < 16<<20 || n > 1<<40 {
			return execvm.Cache{}, clibase.Usagef("--cache %q: size %q: want 16M to 1T", v, val)
		}
		c.Size = int64(n)
	}
	return c, nil
}

// readCaches reads exec's --cache flags; two caches at one guest path or
// of one name are refused.
func readCaches(vals []string) ([]execvm.Cache, error) {
	var out []execvm.Cache
	names, paths := map[string]bool{}, map[string]bool{}
	for _, v := range vals {
		c, err := parseCache(v)
		if err != nil {
			return nil, err
		}
		if names[c.Name] || paths[c.GuestPath] {
			return nil, clibase.Usagef("--cache %q: a cache of that name or at that path is given twice", v)
		}
		names[c.Name], paths[c.GuestPath] = true, true
		out = append(out, c)
	}
	return out, nil
}

// readDockerFlags reads --docker, --docker-disk and --docker-timeout, as
// exec and ci gitlab prepare take them: nil without --docker, whose two
// others are refused alone.
func readDockerFlags(c *cli.Context) (*execvm.Docker, error) {
	if !c.Bool("docker") {
		if clibase.IsSet(c, "docker-disk") || clibase.IsSet(c, "docker-timeout") {
			return nil, clibase.Usagef("--docker-disk and --docker-timeout are --docker's: give --docker too")
		}
		return nil, nil
	}
	d := &execvm.Docker{}
	if d.Start.Timeout = c.Duration("docker-timeout"); d.Start.Timeout <= 0 {
		return nil, clibase.Usagef("--docker-timeout %v: want a positive duration", d.Start.Timeout)
	}
	if v := c.String("docker-disk"); v != "" {
		n, err := microvm.ParseSize(v)
		if err != nil || n < 256<<20 || n > 1<<40 {
			return nil, clibase.Usagef("--docker-disk %q: want 256M to 1T", v)
		}
		d.DiskSize = n
	}
	return d, nil
}

// readCacheFlags reads exec's --cache, --cache-limit, --docker,
// --docker-disk and --docker-timeout. Both
// keep files in microvm's state directory after the VM is gone, so
// neither goes with --chroot (which hides it) or --snapshot's warm start.
func (o *execOpts) readCacheFlags(c *cli.Context) error {
	caches, err := readCaches(listValues(c, "cache"))
	if err != nil {
		return err
	}
	limits, err := readCacheLimit(c.String("cache-limit"))
	if err != nil {
		return err
	}
	if clibase.IsSet(c, "cache-limit") && len(caches) == 0 {
		return clibase.Usagef("--cache-limit is --cache's: give --cache too")
	}
	if o.docker, err = readDockerFlags(c); err != nil {
		return err
	}
	if len(caches) == 0 && o.docker == nil {
		return nil
	}
	switch {
	case o.root != "":
		return clibase.Usagef("--cache and --docker keep disks in microvm's state directory, which --chroot hides")
	case c.String("snapshot") != "":
		return clibase.Usagef("--cache and --docker are not for a warm start (--snapshot)")
	}
	o.caches = caches
	if len(caches) > 0 {
		if o.cacheStore, err = cachedisk.OpenDir("", limits); err != nil {
			return err
		}
	}
	return nil
}
