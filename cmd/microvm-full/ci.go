package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/ci/gitlab"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/dockervm"
)

// ciCommand is `microvm ci gitlab`, GitLab Runner's custom executor
// (internal/ci/gitlab, docs/ci.md): its flags, and the contract's exit
// statuses (ciExit).

// ciRuntime is what the executor takes from this program.
var ciRuntime = gitlab.Runtime{Executable: os.Executable, Interruptible: clibase.Interruptible}

func ciCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "ci",
		Usage:        ciUsage,
		OnUsageError: onUsageError,
		Subcommands: []*cli.Command{{
			Name:         "gitlab",
			Usage:        "GitLab Runner's custom executor: config, prepare, run SCRIPT STAGE, cleanup (docs/ci.md)",
			OnUsageError: onUsageError,
			Subcommands: []*cli.Command{
				{
					Name: "config", Usage: "print the executor's configuration (config_exec)", OnUsageError: onUsageError,
					Action: func(c *cli.Context) error { return ciExit(gitlab.Config(stdout, Version), stderr) },
				},
				{
					Name: "prepare", Usage: "start the job's VM (prepare_exec)", OnUsageError: onUsageError,
					Flags: []cli.Flag{
						&cli.StringFlag{Name: "default-image", Value: "debian:12", Usage: "the image of a job that names none ($CUSTOM_ENV_CI_JOB_IMAGE)"},
						&cli.IntFlag{Name: "cpus", Value: 2, Usage: "the job VM's vCPUs"},
						&cli.StringFlag{Name: "memory", Value: "2G", Usage: "the job VM's RAM (SIZE); half of it bounds what the job writes outside /cache"},
						&cli.StringFlag{Name: "kernel", Usage: "guest kernel (default: exec's)"},
						&cli.StringFlag{Name: "agent", Usage: "guest agent (default: exec's)"},
						&cli.StringFlag{Name: "cache-dir", Usage: "where the cache disks live (default: $MICROVM_STATE_DIR/ci-cache)"},
						&cli.StringFlag{Name: "cache-size", Value: "4G", Usage: "size of a new cache disk (SIZE; sparse)"},
						&cli.StringFlag{Name: "cache-limit", Usage: "bound the whole cache store (--cache-dir): after cleanup commits a passing job's cache, remove the oldest versions of any cache in it (never a cache's newest) until all versions take at most SIZE on disk (default: no bound)"},
						&cli.DurationFlag{Name: "boot-timeout", Value: 2 * time.Minute, Usage: "how long to wait for the job VM's agent"},
						&cli.StringFlag{Name: "cache-key", Usage: "the cache namespace of every job of this runner, for a runner that serves one project (default: the project id in GitLab Runner's job response; without either, prepare is refused)"},
						&cli.StringFlag{Name: "net", Value: "user", Usage: "the job VM's network: user with its options (docs/net.md), e.g. user,egress=none; the runner's choice, never the job's"},
						&cli.IntFlag{Name: "slots", Value: 64, Usage: "cache slots per project: $CUSTOM_ENV_CI_CONCURRENT_PROJECT_ID must be below it"},
						&cli.IntFlag{Name: "warm-pool", Usage: "keep up to N VMs booted, one per cache slot: a job's cleanup boots its slot's next VM, the next prepare takes it (0: off)"},
						&cli.DurationFlag{Name: "warm-ttl", Value: time.Hour, Usage: "with --warm-pool: remove a warm VM no job took for this long (checked at each cleanup)"},
						&cli.BoolFlag{Name: "docker", Usage: "start the image's dockerd in the job's VM before the job's stages, its data root on a disk of the job's own; a system failure with dockerd's log when Docker does not come up; not with --warm-pool (docs/ci.md)"},
						&cli.StringFlag{Name: "docker-disk", Usage: "the size of --docker's data disk (SIZE, sparse; default 8G)"},
						&cli.DurationFlag{Name: "docker-timeout", Value: dockervm.DefaultTimeout, Usage: "how long --docker waits for dockerd to answer"},
						&cli.BoolFlag{Name: "docker-cache", Usage: "with --docker: keep Docker's data root (images, build cache) per project and slot, as the cache is kept: a clone of the last passing job's, committed when the job passes (docs/ci.md)"},
					},
					Action: func(c *cli.Context) error { return ciExit(gitlabPrepare(c, stderr), stderr) },
				},
				{
					Name: "run", Usage: "run one stage's script in the job's VM (run_exec)", UsageText: "microvm ci gitlab run SCRIPT STAGE",
					OnUsageError: onUsageError,
					Action: func(c *cli.Context) error {
						if c.NArg() != 2 {
							return ciExit(clibase.Usagef("ci gitlab run: want SCRIPT and STAGE (GitLab Runner passes both)"), stderr)
						}
						return ciExit(ciRuntime.Run(c.Args().Get(0), c.Args().Get(1), stdout, stderr), stderr)
					},
				},
				{
					Name: "cleanup", Usage: "remove the job's VM (cleanup_exec); with the warm pool, boot the slot's next one", OnUsageError: onUsageError,
					Action: func(c *cli.Context) error { return ciExit(gitlab.Cleanup(stderr), stderr) },
				},
				{
					Name: "drain", Usage: "remove the warm pool's VMs (when the runner stops)", OnUsageError: onUsageError,
					Flags: []cli.Flag{
						&cli.DurationFlag{Name: "boot-timeout", Value: 2 * time.Minute, Usage: "how long to wait for a warm VM still booting before it is removed"},
					},
					Action: func(c *cli.Context) error { return gitlab.Drain(stdout, c.Duration("boot-timeout")) },
				},
			},
		}},
	}
}

// ciExit is an executor error as the command's end: the status
// gitlab.ExitStatus gives it (GitLab Runner's contract), its message on
// stderr where that says so, else err as it is.
func ciExit(err error, stderr io.Writer) error {
	if err == nil {
		return nil
	}
	status, say, ok := gitlab.ExitStatus(err)
	if !ok {
		return err
	}
	if say {
		fmt.Fprintf(stderr, "microvm: %v\n", err)
	}
	return clibase.StatusError{Status: status}
}

// gitlabPrepare is `ci gitlab prepare`: the job's identity, the flags,
// then gitlab.Runtime.Prepare.
func gitlabPrepare(c *cli.Context, stderr io.Writer) error {
	id, err := gitlab.JobIdentity()
	if err != nil {
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	o, err := readPrepareOptions(c)
	if err != nil {
		return err
	}
	return ciRuntime.Prepare(id, o, stderr)
}

// readPrepareOptions reads and checks prepare's flags: the runner's
// config.toml (prepare_args), never the job's variables. --cache-limit is
// read as exec's is (readCacheLimit), so both refuse the same sizes.
func readPrepareOptions(c *cli.Context) (gitlab.PrepareOptions, error) {
	var none gitlab.PrepareOptions
	mem, err := microvm.ParseSize(c.String("memory"))
	if err != nil {
		return none, clibase.Usagef("--memory: %v", err)
	}
	cacheSize, err := microvm.ParseSize(c.String("cache-size"))
	if err != nil || cacheSize < 16<<20 {
		return none, clibase.Usagef("--cache-size %q: want a SIZE of at least 16M", c.String("cache-size"))
	}
	limits, err := readCacheLimit(c.String("cache-limit"))
	if err != nil {
		return none, err
	}
	pool := c.Int("warm-pool")
	if pool < 0 {
		return none, clibase.Usagef("--warm-pool %d: want 0 (off) or more", pool)
	}
	if k := c.String("cache-key"); k != "" {
		if err := gitlab.CheckCacheKey(k); err != nil {
			return none, clibase.Usagef("%v", err)
		}
	}
	netSpec := c.String("net")
	if netSpec != "user" && !strings.HasPrefix(netSpec, "user,") {
		return none, clibase.Usagef("--net %q: want user or user,OPTIONS (the executor runs without root)", netSpec)
	}
	if n := c.Int("slots"); n < 1 || n > gitlab.MaxSlots {
		return none, clibase.Usagef("--slots %d: want 1 to %d", n, gitlab.MaxSlots)
	}
	d, err := readDockerFlags(c)
	if err != nil {
		return none, err
	}
	var docker *gitlab.DockerOptions
	if d != nil {
		if pool > 0 {
			return none, clibase.Usagef("--docker and --warm-pool %d: a warm VM is booted before its job, without Docker's data disk; give one or the other", pool)
		}
		docker = &gitlab.DockerOptions{DiskSize: d.DiskSize, Timeout: d.Start.Timeout, Cache: c.Bool("docker-cache")}
	} else if c.Bool("docker-cache") {
		return none, clibase.Usagef("--docker-cache is --docker's: give --docker too")
	}
	return gitlab.PrepareOptions{
		DefaultImage: c.String("default-image"), CPUs: c.Int("cpus"), Memory: mem,
		Kernel: c.String("kernel"), Agent: c.String("agent"),
		CacheDir: c.String("cache-dir"), CacheSize: cacheSize, CacheLimit: limits.TotalBytes, BootTimeout: c.Duration("boot-timeout"),
		CacheKey: c.String("cache-key"), Net: netSpec, Slots: c.Int("slots"),
		WarmPool: pool, WarmTTL: c.Duration("warm-ttl"), Docker: docker,
	}, nil
}
