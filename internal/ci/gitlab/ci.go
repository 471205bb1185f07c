package gitlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/vms"
)

// envJobPrefix starts the names of the job's variables in GitLab's
// custom executor contract.
const envJobPrefix = "CUSTOM_ENV_"

// In the guest: where jobs build, where the cache disk is mounted, and
// where run puts each stage's script.
const (
	ciBuildsDir = "/builds"
	ciCacheDir  = "/cache"
	ciScriptDir = "/tmp/microvm-ci"
)

// BuildFailure: the job's script ran and failed (the contract's
// $BUILD_FAILURE_EXIT_CODE, where other errors are the runner's).
type BuildFailure struct {
	Stage  string
	Status int
}

func (b BuildFailure) Error() string {
	return fmt.Sprintf("stage %s: the script exited with status %d", b.Stage, b.Status)
}

// exitStatusError is a job command that ran and exited with a status
// other than 0.
type exitStatusError struct{ status int }

func (e exitStatusError) Error() string { return fmt.Sprintf("exit status %d", e.status) }

// Runtime is what the executor takes from the program it runs in, the
// microvm CLI.
type Runtime struct {
	// Executable is the microvm program prepare starts the job's VM with
	// (run --name --detach ...).
	Executable func() (string, error)
	// Interruptible derives the context of one call into the job's VM
	// that SIGINT or SIGTERM (GitLab cancelling the job) cancels, with a
	// cause that has a Signal method; it returns what stops it.
	Interruptible func(context.Context) (context.Context, func())
}

// jobEnv is a variable of the job (CUSTOM_ENV_NAME), or def.
func jobEnv(name, def string) string {
	if v := os.Getenv(envJobPrefix + name); v != "" {
		return v
	}
	return def
}

// Config prints config_exec's JSON; version is microvm's.
func Config(stdout io.Writer, version string) error {
	host, _ := os.Hostname()
	cfg := map[string]any{
		"builds_dir":           ciBuildsDir,
		"cache_dir":            ciCacheDir,
		"builds_dir_is_shared": false,
		"hostname":             "microvm-" + host,
		"driver":               map[string]string{"name": "microvm", "version": version},
	}
	return json.NewEncoder(stdout).Encode(cfg)
}

// PrepareOptions are prepare's flags, checked.
type PrepareOptions struct {
	// DefaultImage is the image of a job that names none.
	DefaultImage string
	CPUs         int
	Memory       uint64
	// Kernel and Agent are the job VM's (empty: exec's defaults).
	Kernel, Agent string
	// CacheDir holds the cache store (internal/cachedisk; empty:
	// $MICROVM_STATE_DIR/ci-cache); CacheSize is a new cache's size.
	CacheDir    string
	CacheSize   uint64
	BootTimeout time.Duration
	// CacheLimit bounds the allocated bytes of all versions in the cache
	// store (0: no bound): after each commit, cleanup evicts the oldest
	// versions of any cache, never a cache's newest, until they fit.
	CacheLimit int64
	// CacheKey is the cache namespace of a runner that serves one project
	// (CheckCacheKey), or empty.
	CacheKey string
	// Net is the job VM's --net (user, with options).
	Net string
	// Slots is the number of cache slots per project (1 to MaxSlots).
	Slots int
	// WarmPool is the warm pool's size (0: off); WarmTTL how long an
	// offered VM may wait.
	WarmPool int
	WarmTTL  time.Duration
	// Docker starts Docker in the job's VM before its stages (cidocker.go);
	// nil: off. Not with WarmPool.
	Docker *DockerOptions
}

// Prepare starts the job's VM (run --name --detach --image --idle --net
// user, with a clone of the slot's cache as its disk: cicache.go) and
// mounts the cache and makes the builds directory in it; with o.Docker it
// gives the VM Docker's data disk (with o.Docker.Cache a clone of the
// slot's Docker cache) and starts Docker in it (cidocker.go).
// It first records the job (createJobRecord): run and cleanup act only on
// the VM a record names, and prepare removes a VM only when it made it or
// claimed it. A VM that did not come up, or in which Docker did not, is
// removed with its Docker disk; the clone stays in the record for cleanup
// to discard.
func (rt Runtime) Prepare(id Identity, o PrepareOptions, stderr io.Writer) error {
	if o.Docker != nil && o.WarmPool > 0 {
		return fmt.Errorf("ci gitlab prepare: %w", errDockerWarmPool)
	}
	if o.CacheLimit < 0 {
		return fmt.Errorf("ci gitlab prepare: a negative cache limit %d", o.CacheLimit)
	}
	key, err := cacheSlot(id, o.CacheKey, o.Slots, func(n string) string { return os.Getenv(envJobPrefix + n) })
	if err != nil {
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	// The job records, the pool's offers and the default cache directory
	// live in the state directory: it must be this user's own.
	if err := vms.CheckStateDir(vms.StateDir()); err != nil {
		return fmt.Errorf("ci gitlab prepare: %w", err)
	}
	cacheDir := cacheStoreDir(o.CacheDir)
	img := jobEnv("CI_JOB_IMAGE", o.DefaultImage)
	mem, pool := o.Memory, o.WarmPool
	exe, err := rt.Executable()
	if err != nil {
		return err
	}
	// run's arguments for the job's VM, --name and the cache disk aside: a
	// warm VM made with the same ones will do.
	args := []string{"--detach", "--image", img, "--idle", "--net", o.Net,
		"--cpus", strconv.Itoa(o.CPUs), "--memory", microvm.FormatSize(mem),
		"--boot-timeout", o.BootTimeout.String()}
	if k := o.Kernel; k != "" {
		args = append(args, "--kernel", k)
	}
	if a := o.Agent; a != "" {
		args = append(args, "--agent", a)
	}
	name := id.VMName()
	rec := ciJobRecord{VM: name, Slot: key, Args: args, Pool: pool, TTL: o.WarmTTL, CacheSize: o.CacheSize, CacheLimit: o.CacheLimit}
	recPath := jobRecordPath(vms.StateDir(), id)
	if o.Docker != nil && !o.Docker.Cache {
		// Noted before the disk is made: a prepare killed half-way leaves
		// cleanup a record that names it.
		rec.DockerDisk = dockerDiskPath(recPath)
	}
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
	// abandon removes what prepare made for a job that will not run: the
	// VM, then Docker's data disk (cleanup removes the disk too).
	abandon := func() {
		_ = discardVM(rec.VM)
		_ = removeDockerDisk(&rec, recPath)
	}
	if pool > 0 {
		if warm, cache := claimWarm(id.Hash, key, args, o.BootTimeout, stderr); warm != "" {
			rec.VM, rec.Cache = warm, cache
			if err := writeJSON(recPath, rec); err != nil {
				discardOffered(ciOffer{VM: warm, Cache: cache})
				return fmt.Errorf("ci gitlab prepare: %w", err)
			}
		}
	}
	if rec.VM == name {
		cache, disk, err := checkoutCache(cacheDir, key, o.CacheSize, stderr)
		if err != nil {
			return fmt.Errorf("ci gitlab prepare: cache %s: %w", key, err)
		}
		rec.Cache = cache
		if err := writeJSON(recPath, rec); err != nil {
			_ = cache.discard()
			return fmt.Errorf("ci gitlab prepare: %w", err)
		}
		runArgs := withDisk(args, disk)
		switch {
		case o.Docker != nil && o.Docker.Cache:
			// The clone stays in the record for cleanup to discard when
			// the job does not get to pass.
			dc, d, err := checkoutDockerCache(cacheDir, key, *o.Docker, stderr)
			if err != nil {
				return fmt.Errorf("ci gitlab prepare: %w", err)
			}
			rec.DockerCache = dc
			if err := writeJSON(recPath, rec); err != nil {
				_ = dc.discard()
				return fmt.Errorf("ci gitlab prepare: %w", err)
			}
			runArgs = append(runArgs, "--disk", d.Arg())
		case o.Docker != nil:
			d, err := makeDockerDisk(recPath, *o.Docker)
			if err != nil {
				_ = removeDockerDisk(&rec, recPath)
				return fmt.Errorf("ci gitlab prepare: %w", err)
			}
			runArgs = append(runArgs, "--disk", d.Arg())
		}
		fmt.Fprintf(stderr, "microvm: starting VM %s from %s (%d CPUs, %s, cache %s)\n", name, img, o.CPUs, microvm.FormatSize(mem), key)
		cmd := exec.Command(exe, append([]string{"run", "--name", name}, runArgs...)...)
		cmd.Stdout, cmd.Stderr = stderr, stderr
		if err := cmd.Run(); err != nil {
			abandon() // the name was free: what is there, this run made
			return fmt.Errorf("ci gitlab prepare: VM %s did not start (%w)", name, err)
		}
	}
	shell, err := jobShell(func(argv []string) error { return rt.runJobCommand(rec.VM, argv, nil, io.Discard, stderr) })
	if err == nil && shell != jobShells[0] {
		fmt.Fprintf(stderr, "microvm: running the job with %s (the image has no %s)\n", shell, jobShells[0])
		rec.Shell = shell
		err = writeJSON(recPath, rec)
	}
	if err != nil {
		abandon()
		return fmt.Errorf("ci gitlab prepare: VM %s: %w", rec.VM, err)
	}
	// The cache disk is the second disk (/dev/vdb: the image is the first).
	setup := fmt.Sprintf("mkdir -p %s %s && mount /dev/vdb %s", ciBuildsDir, ciCacheDir, ciCacheDir)
	if err := rt.runJobCommand(rec.VM, []string{shell, "-c", setup}, nil, io.Discard, stderr); err != nil {
		abandon()
		return fmt.Errorf("ci gitlab prepare: VM %s: mounting the cache: %w", rec.VM, err)
	}
	if o.Docker != nil {
		fmt.Fprintf(stderr, "microvm: starting Docker in VM %s\n", rec.VM)
		if err := rt.startDocker(rec.VM, *o.Docker); err != nil {
			abandon()
			return fmt.Errorf("ci gitlab prepare: VM %s: %w", rec.VM, err)
		}
	}
	return nil
}

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

// withDisk is run's arguments with the cache disk added (the second
// disk, /dev/vdb: the image is the first).
func withDisk(args []string, disk string) []string {
	return append(slices.Clip(args), "--disk", "path="+disk)
}

// Run copies the stage's script into the job's VM and runs it with the
// shell Prepare chose (jobShell), its output streamed: the script's own
// failure is a BuildFailure. What the stage's end says about the job
// (stageOutcome) goes into the record, for cleanup's cache commit.
func (rt Runtime) Run(script, stage string, stdout, stderr io.Writer) error {
	rec, recPath, err := jobVM()
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
	err = rt.putJobFile(name, guestScript, f)
	if err == nil {
		err = rt.runJobCommand(name, []string{rec.shell(), guestScript}, nil, stdout, stderr)
	}
	if rec.stageOutcome(stage, err) {
		if werr := writeJSON(recPath, rec); werr != nil {
			fmt.Fprintf(stderr, "microvm: recording the job's state for its cache: %v\n", werr)
		}
	}
	var se exitStatusError
	if errors.As(err, &se) {
		return BuildFailure{Stage: stage, Status: se.status}
	}
	if err != nil {
		return fmt.Errorf("ci gitlab run: %s: %w", stage, err)
	}
	return nil
}

// Cleanup removes the VM the job's prepare recorded, stopping it
// first; a VM that is already gone is fine, and a job with no record (its
// prepare never began) has nothing to remove. It then commits the job's
// cache clone when the job passed, or discards it (finishCache), and
// removes Docker's data disk when the record names one; a Docker cache
// clone is committed only when the job passed and dockerd was stopped
// and its data root unmounted first (finishDockerCache). Each commit
// then keeps the store under the record's CacheLimit (commitClone). With
// the warm pool it then boots the slot's next VM in the background
// (refillPool).
func Cleanup(stderr io.Writer) error {
	rec, recPath, err := jobVM()
	if err != nil {
		return fmt.Errorf("ci gitlab cleanup: %w", err)
	}
	if rec == nil {
		return nil
	}
	// Docker's data root is flushed first: a container may hold the
	// slot's cache too.
	dockerFlush := errors.New("not flushed")
	if rec.DockerCache != nil && rec.passed() {
		dockerFlush = flushDocker(rec.VM)
	}
	if rec.Cache != nil && rec.passed() {
		_ = flushCache(rec) // best effort: see flushCache
	}
	if err := discardVM(rec.VM); err != nil {
		// The VM may still be writing its clones: commit none of them. Its
		// Docker disk goes too (a file it holds open is freed when it ends).
		_ = rec.Cache.discard()
		_ = rec.DockerCache.discard()
		_ = removeDockerDisk(rec, recPath)
		return fmt.Errorf("ci gitlab cleanup: %w", err)
	}
	finishCache(rec, stderr)
	finishDockerCache(rec, dockerFlush, stderr)
	if err := removeDockerDisk(rec, recPath); err != nil {
		fmt.Fprintf(stderr, "microvm: %v\n", err)
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
	cc, err := namedvm.AgentAddr(e, 10*time.Second).Dial(ctx)
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
		env = agentvm.MergeEnv(p.Env, nil)
	}
	if _, ok := agentvm.LookupEnv(env, "PATH"); !ok {
		env = append(env, "PATH="+ciPath)
	}
	return agentvm.MergeEnv(env, []string{"HOME=/root"})
}

// putJobFile writes r to path in the job's VM (mode 0755, parents made).
func (rt Runtime) putJobFile(name, path string, r io.Reader) error {
	ctx, stop := rt.Interruptible(context.Background())
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
// exitStatusError; a missing program or a lost VM is another error.
func (rt Runtime) runJobCommand(name string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	ctx, stop := rt.Interruptible(context.Background())
	defer stop()
	c, env, done, err := jobAgent(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	st, err := c.Exec(ctx, &agentapi.Cmd{Argv: argv, Env: env,
		Stdin: stdin, Stdout: stdout, Stderr: stderr})
	var sig interface{ Signal() syscall.Signal }
	if errors.As(context.Cause(ctx), &sig) {
		return fmt.Errorf("cancelled by %v", sig.Signal())
	}
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return fmt.Errorf("%s: %w", argv[0], errNotInImage)
		}
		return errors.New(agentvm.Message(err))
	}
	if n := agentvm.ShellStatus(st); n != 0 {
		return exitStatusError{n}
	}
	return nil
}

// errNotInImage: the agent found no program of a job command's name in
// the image's PATH.
var errNotInImage = errors.New("not found in the job's image")

// jobShells are the shells a job's scripts may run with, the one
// preferred first: GitLab writes its scripts to run under either, and its
// docker executor picks between them in this order.
var jobShells = [...]string{"bash", "sh"}

// jobShell is the first of jobShells that the job's image has. run runs
// argv in the job's VM (runJobCommand): each shell is looked for there,
// in the image's PATH by the guest agent, never in the image's files on
// this host, whose links the image's author chose. A shell that is there
// but does not run is an error, not a reason to try the next.
func jobShell(run func(argv []string) error) (string, error) {
	for _, sh := range jobShells {
		err := run([]string{sh, "-c", ":"})
		if err == nil {
			return sh, nil
		}
		if !errors.Is(err, errNotInImage) {
			return "", fmt.Errorf("trying %s: %w", sh, err)
		}
	}
	return "", errors.New("neither bash nor sh found in the job's image")
}

// ciPath is a job's PATH: the usual one of a Debian-like image.
const ciPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
