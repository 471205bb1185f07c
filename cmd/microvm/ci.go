//go:build !microvm_lean

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/vms"
)

// The GitLab Runner custom executor (docs/ci.md): GitLab Runner calls
// `microvm ci gitlab config`, then `prepare` once per job, `run SCRIPT
// STAGE` once per sub-stage (prepare_script, get_sources, restore_cache,
// step_script, after_script, archive_cache, upload_artifacts_on_*, ...),
// and `cleanup` at the end, whatever happened. The job's variables come as
// CUSTOM_ENV_*; a failure of the job's own script exits
// $BUILD_FAILURE_EXIT_CODE, a failure of microvm or the VM
// $SYSTEM_FAILURE_EXIT_CODE, so GitLab tells a failed job from a broken
// runner.
//
// One named VM per job (gitlab-JOB-HASH, HASH from the job's token: see
// cijob.go for what keys isolation) from the job's image (or
// --default-image) with --net user, and a cache disk per project and
// concurrency slot, an ext4 image kept under --cache-dir and mounted at
// /cache, so that caches survive from one job to the next. With
// --warm-pool, the slot's next VM is booted by cleanup and taken by the
// next prepare (cipool.go).

// ciGitLab names the environment variables of GitLab's custom executor
// contract.
const (
	envBuildFailure  = "BUILD_FAILURE_EXIT_CODE"
	envSystemFailure = "SYSTEM_FAILURE_EXIT_CODE"
	envJobPrefix     = "CUSTOM_ENV_"
)

// In the guest: where jobs build, where the cache disk is mounted, and
// where run puts each stage's script.
const (
	ciBuildsDir = "/builds"
	ciCacheDir  = "/cache"
	ciScriptDir = "/tmp/microvm-ci"
)

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
					Action: func(c *cli.Context) error { return ciExit(gitlabConfig(stdout), stderr) },
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
						&cli.DurationFlag{Name: "boot-timeout", Value: 2 * time.Minute, Usage: "how long to wait for the job VM's agent"},
						&cli.StringFlag{Name: "cache-key", Usage: "the cache namespace of every job of this runner, for a runner that serves one project (default: the project id in GitLab Runner's job response; without either, prepare is refused)"},
						&cli.StringFlag{Name: "net", Value: "user", Usage: "the job VM's network: user with its options (docs/net.md), e.g. user,egress=none; the runner's choice, never the job's"},
						&cli.IntFlag{Name: "slots", Value: 64, Usage: "cache slots per project: $CUSTOM_ENV_CI_CONCURRENT_PROJECT_ID must be below it"},
						&cli.IntFlag{Name: "warm-pool", Usage: "keep up to N VMs booted, one per cache slot: a job's cleanup boots its slot's next VM, the next prepare takes it (0: off)"},
						&cli.DurationFlag{Name: "warm-ttl", Value: time.Hour, Usage: "with --warm-pool: remove a warm VM no job took for this long (checked at each cleanup)"},
					},
					Action: func(c *cli.Context) error { return ciExit(gitlabPrepare(c, stderr), stderr) },
				},
				{
					Name: "run", Usage: "run one stage's script in the job's VM (run_exec)", UsageText: "microvm ci gitlab run SCRIPT STAGE",
					OnUsageError: onUsageError,
					Action: func(c *cli.Context) error {
						if c.NArg() != 2 {
							return ciExit(usagef("ci gitlab run: want SCRIPT and STAGE (GitLab Runner passes both)"), stderr)
						}
						return ciExit(gitlabRun(c.Args().Get(0), c.Args().Get(1), stdout, stderr), stderr)
					},
				},
				{
					Name: "cleanup", Usage: "remove the job's VM (cleanup_exec); with the warm pool, boot the slot's next one", OnUsageError: onUsageError,
					Action: func(c *cli.Context) error { return ciExit(gitlabCleanup(stderr), stderr) },
				},
				{
					Name: "drain", Usage: "remove the warm pool's VMs (when the runner stops)", OnUsageError: onUsageError,
					Flags: []cli.Flag{
						&cli.DurationFlag{Name: "boot-timeout", Value: 2 * time.Minute, Usage: "how long to wait for a warm VM still booting before it is removed"},
					},
					Action: func(c *cli.Context) error { return drainPool(stdout, c.Duration("boot-timeout")) },
				},
			},
		}},
	}
}

// ciExit maps an executor error to the contract's statuses: a build
// failure (the job's script failed) to $BUILD_FAILURE_EXIT_CODE, anything
// else to $SYSTEM_FAILURE_EXIT_CODE; without the variables (not run by
// GitLab Runner) microvm's own statuses stay.
func ciExit(err error, stderr io.Writer) error {
	if err == nil {
		return nil
	}
	var bf buildFailure
	code, ok := exitCodeEnv(envSystemFailure)
	if errors.As(err, &bf) {
		code, ok = exitCodeEnv(envBuildFailure)
	}
	if !ok {
		if errors.As(err, &bf) {
			return statusError{bf.status}
		}
		return err
	}
	if !errors.As(err, &bf) { // a failed script's own output says why
		fmt.Fprintf(stderr, "microvm: %v\n", err)
	}
	return statusError{code}
}

// buildFailure: the job's script ran and failed.
type buildFailure struct {
	stage  string
	status int
}

func (b buildFailure) Error() string {
	return fmt.Sprintf("stage %s: the script exited with status %d", b.stage, b.status)
}

func exitCodeEnv(name string) (int, bool) {
	n, err := strconv.Atoi(os.Getenv(name))
	return n, err == nil && n > 0 && n < 256
}

// jobEnv is a variable of the job (CUSTOM_ENV_NAME), or def.
func jobEnv(name, def string) string {
	if v := os.Getenv(envJobPrefix + name); v != "" {
		return v
	}
	return def
}

// gitlabConfig prints config_exec's JSON.
func gitlabConfig(stdout io.Writer) error {
	host, _ := os.Hostname()
	cfg := map[string]any{
		"builds_dir":           ciBuildsDir,
		"cache_dir":            ciCacheDir,
		"builds_dir_is_shared": false,
		"hostname":             "microvm-" + host,
		"driver":               map[string]string{"name": "microvm", "version": Version},
	}
	return json.NewEncoder(stdout).Encode(cfg)
}

// gitlabPrepare starts the job's VM (run --name --detach --image --idle
// --net user, with the cache disk) and mounts the cache and makes the
// builds directory in it. It first records the job (createJobRecord):
// run and cleanup act only on the VM a record names, and prepare removes
// a VM only when it made it or claimed it. A VM that did not come up is
// removed.
func gitlabPrepare(c *cli.Context, stderr io.Writer) error {
	id, err := jobIdentity()
	if err != nil {
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	mem, err := microvm.ParseSize(c.String("memory"))
	if err != nil {
		return usagef("--memory: %v", err)
	}
	cacheSize, err := microvm.ParseSize(c.String("cache-size"))
	if err != nil || cacheSize < 16<<20 {
		return usagef("--cache-size %q: want a SIZE of at least 16M", c.String("cache-size"))
	}
	pool := c.Int("warm-pool")
	if pool < 0 {
		return usagef("--warm-pool %d: want 0 (off) or more", pool)
	}
	if k := c.String("cache-key"); k != "" {
		if err := checkCacheKey(k); err != nil {
			return usagef("%v", err)
		}
	}
	netSpec := c.String("net")
	if netSpec != "user" && !strings.HasPrefix(netSpec, "user,") {
		return usagef("--net %q: want user or user,OPTIONS (the executor runs without root)", netSpec)
	}
	if n := c.Int("slots"); n < 1 || n > maxSlots {
		return usagef("--slots %d: want 1 to %d", n, maxSlots)
	}
	key, err := cacheSlot(id, c.String("cache-key"), c.Int("slots"), func(n string) string { return os.Getenv(envJobPrefix + n) })
	if err != nil {
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	// The job records, the pool's offers and the default cache directory
	// live in the state directory: it must be this user's own.
	if err := vms.CheckStateDir(vms.StateDir()); err != nil {
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	cacheDir := c.String("cache-dir")
	if cacheDir == "" {
		cacheDir = filepath.Join(vms.StateDir(), "ci-cache")
	}
	disk := cacheDiskPath(cacheDir, key)
	img := jobEnv("CI_JOB_IMAGE", c.String("default-image"))
	exe, err := ciExecutable()
	if err != nil {
		return err
	}
	// run's arguments for the job's VM, --name aside: a warm VM made with
	// the same ones will do.
	args := []string{"--detach", "--image", img, "--idle", "--net", netSpec,
		"--cpus", strconv.Itoa(c.Int("cpus")), "--memory", microvm.FormatSize(mem),
		"--disk", "path=" + disk, "--boot-timeout", c.Duration("boot-timeout").String()}
	if k := c.String("kernel"); k != "" {
		args = append(args, "--kernel", k)
	}
	if a := c.String("agent"); a != "" {
		args = append(args, "--agent", a)
	}
	name := id.vmName()
	rec := ciJobRecord{VM: name, Slot: key, Args: args, Pool: pool, TTL: c.Duration("warm-ttl")}
	recPath := jobRecordPath(vms.StateDir(), id)
	if err := createJobRecord(recPath, rec); err != nil {
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	// A VM of the job's name that is there already was not made by this
	// job: it is neither used nor removed, here or by cleanup.
	if there, err := vmExists(name); err != nil || there {
		os.Remove(recPath)
		if err == nil {
			err = fmt.Errorf("VM %s exists and was not made by this job's prepare: refusing to use or remove it", name)
		}
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	if err := ensureCacheDisk(disk, cacheSize); err != nil {
		return fmt.Errorf("ci gitlab prepare: cache disk: %w", err)
	}
	if pool > 0 {
		if warm := claimWarm(id.Hash, key, args, c.Duration("boot-timeout"), stderr); warm != "" {
			rec.VM = warm
			if err := writeJSON(recPath, rec); err != nil {
				_ = discardVM(warm)
				return fmt.Errorf("ci gitlab prepare: %w", err)
			}
		}
	}
	if rec.VM == name {
		fmt.Fprintf(stderr, "microvm: starting VM %s from %s (%d CPUs, %s, cache %s)\n", name, img, c.Int("cpus"), microvm.FormatSize(mem), key)
		cmd := exec.Command(exe, append([]string{"run", "--name", name}, args...)...)
		cmd.Stdout, cmd.Stderr = stderr, stderr
		if err := cmd.Run(); err != nil {
			_ = discardVM(name) // the name was free: what is there, this run made
			return fmt.Errorf("ci gitlab prepare: VM %s did not start (%w)", name, err)
		}
	}
	// The cache disk is the second disk (/dev/vdb: the image is the first).
	setup := fmt.Sprintf("mkdir -p %s %s && mount /dev/vdb %s", ciBuildsDir, ciCacheDir, ciCacheDir)
	if err := runJobCommand(rec.VM, []string{"sh", "-c", setup}, nil, io.Discard, stderr); err != nil {
		_ = discardVM(rec.VM)
		return fmt.Errorf("ci gitlab prepare: VM %s: mounting the cache: %w", rec.VM, err)
	}
	return nil
}

// ciExecutable is the program prepare starts the job's VM with: this one.
// Tests replace it, so that prepare's checks run without a VM.
var ciExecutable = os.Executable

// vmExists says whether a VM of that name is in the store, running or not.
func vmExists(name string) (bool, error) {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return false, err
	}
	_, err = store.Get(name)
	if errors.Is(err, vms.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// ensureCacheDisk makes a sparse ext4 image at path unless one is there:
// written beside it and renamed, so that two jobs never see half a disk.
func ensureCacheDisk(path string, size uint64) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	empty, err := os.MkdirTemp(filepath.Dir(path), ".empty-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(empty)
	tmp := path + ".new"
	if err := mkfs(tmp, empty, size, "microvm-cache"); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// gitlabRun copies the stage's script into the job's VM and runs it with
// bash, its output streamed: the script's own failure is a build failure.
func gitlabRun(script, stage string, stdout, stderr io.Writer) error {
	rec, _, err := jobVM()
	if err != nil {
		return fmt.Errorf("ci gitlab run: %w", err)
	}
	if rec == nil {
		return errors.New("ci gitlab run: no VM was prepared for this job (its prepare failed or did not run)")
	}
	name := rec.VM
	f, err := os.Open(script)
	if err != nil {
		return fmt.Errorf("ci gitlab run: %w", err)
	}
	defer f.Close()
	guestScript := stageScriptPath(stage)
	if err := putJobFile(name, guestScript, f); err != nil {
		return fmt.Errorf("ci gitlab run: %s: %w", stage, err)
	}
	err = runJobCommand(name, []string{"bash", guestScript}, nil, stdout, stderr)
	var se statusError
	if errors.As(err, &se) {
		return buildFailure{stage: stage, status: se.status}
	}
	if err != nil {
		return fmt.Errorf("ci gitlab run: %s: %w", stage, err)
	}
	return nil
}

// gitlabCleanup removes the VM the job's prepare recorded, stopping it
// first; a VM that is already gone is fine, and a job with no record (its
// prepare never began) has nothing to remove. With the warm pool it then
// boots the slot's next VM in the background (refillPool).
func gitlabCleanup(stderr io.Writer) error {
	rec, recPath, err := jobVM()
	if err != nil {
		return fmt.Errorf("ci gitlab cleanup: %w", err)
	}
	if rec == nil {
		return nil
	}
	if err := discardVM(rec.VM); err != nil {
		return fmt.Errorf("ci gitlab cleanup: %w", err)
	}
	if err := os.Remove(recPath); err != nil {
		return fmt.Errorf("ci gitlab cleanup: %w", err)
	}
	if rec.Pool > 0 {
		refillPool(rec, stderr)
	}
	return nil
}

// jobAgent dials the job VM's agent and returns the environment a job's
// commands get (jobEnvironment).
func jobAgent(ctx context.Context, name string) (*agentapi.Client, []string, func(), error) {
	e, err := namedvm.Live(name)
	if err != nil {
		return nil, nil, nil, err
	}
	cc, err := vmAgentAddr(e, 10*time.Second).Dial(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("VM %s: %w", name, err)
	}
	return agentapi.NewClient(cc), jobEnvironment(e.Process), func() { cc.Close() }, nil
}

// jobEnvironment is what a job's scripts run with, as GitLab's docker
// executor gives them: the image's environment (its PATH, GOPATH, ...),
// with a usual PATH when it names none, and root's HOME. The scripts set
// the job's own variables themselves.
func jobEnvironment(p *vms.Process) []string {
	var env []string
	if p != nil {
		env = mergeEnv(p.Env, nil)
	}
	if _, ok := lookupEnv(env, "PATH"); !ok {
		env = append(env, "PATH="+ciPath)
	}
	return mergeEnv(env, []string{"HOME=/root"})
}

// putJobFile writes r to path in the job's VM (mode 0755, parents made).
func putJobFile(name, path string, r io.Reader) error {
	ctx, stop := interruptible(context.Background())
	defer stop()
	c, _, done, err := jobAgent(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	_, err = c.PutFile(ctx, path, 0o755, true, r)
	return err
}

// runJobCommand runs argv in the job's VM as root in / with the image's
// environment (jobEnvironment), its output
// streamed; SIGINT or SIGTERM (GitLab cancelling the job) ends it, killing
// its process group in the guest. A command that ran and failed is a
// statusError; a missing program or a lost VM is another error.
func runJobCommand(name string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	ctx, stop := interruptible(context.Background())
	defer stop()
	c, env, done, err := jobAgent(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	st, err := c.Exec(ctx, &agentapi.Cmd{Argv: argv, Env: env,
		Stdin: stdin, Stdout: stdout, Stderr: stderr})
	var cs caughtSignal
	if errors.As(context.Cause(ctx), &cs) {
		return fmt.Errorf("cancelled by %v", cs.sig)
	}
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return fmt.Errorf("%s: not found in the job's image", argv[0])
		}
		return errors.New(agentvm.Message(err))
	}
	return exitError(st)
}

// ciPath is a job's PATH: the usual one of a Debian-like image.
const ciPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
