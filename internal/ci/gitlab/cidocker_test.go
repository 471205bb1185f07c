package gitlab

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// runRecorder is a Runtime whose prepare's `run` writes its arguments, one
// a line, to args and the names in the job records' directory to ls, and
// exits 1: what the VM would have been given, without a VM.
func runRecorder(t *testing.T) (rt Runtime, args, ls string) {
	t.Helper()
	dir := t.TempDir()
	args, ls = filepath.Join(dir, "args"), filepath.Join(dir, "ls")
	exe := filepath.Join(dir, "run.sh")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + args + "\nls " + ciJobsDir(vms.StateDir()) + " > " + ls + "\nexit 1\n"
	if err := os.WriteFile(exe, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	rt = Runtime{
		Executable:    func() (string, error) { return exe, nil },
		Interruptible: func(ctx context.Context) (context.Context, func()) { return context.WithCancel(ctx) },
	}
	return rt, args, ls
}

// TestPrepareDockerDisk: prepare --docker makes Docker's data disk beside
// the job's record, named after the job's token hash (a forged CI_JOB_ID
// does not change it), notes it in the record, and gives it to the VM
// after the cache disk with Docker's serial; it never takes a warm VM
// (the slot's offer stays). The VM did not start: prepare removes the
// disk, and cleanup, finding none, is fine.
func TestPrepareDockerDisk(t *testing.T) {
	testenv.NeedMkfs(t)
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	ciJobEnv(t, "tok-docker", 12, 0, map[string]string{"CI_JOB_ID": "../../x"})
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	offer := ciOffer{VM: "warm-p-0", Args: []string{"--image", "debian:12"}, Created: time.Now()}
	if err := writeJSON(offerPath("p-0"), offer); err != nil {
		t.Fatal(err)
	}
	rt, argsFile, lsFile := runRecorder(t)
	var msgs strings.Builder
	err = rt.Prepare(id, PrepareOptions{DefaultImage: "debian:12", CPUs: 2, Memory: 2 << 30,
		CacheKey: "p", CacheDir: t.TempDir(), CacheSize: 16 << 20, BootTimeout: 100 * time.Millisecond,
		Net: "user", Slots: 64, Docker: &DockerOptions{DiskSize: 256 << 20}}, &msgs)
	if err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("prepare with a VM starter that fails: %v, %q", err, msgs.String())
	}
	recPath := jobRecordPath(vms.StateDir(), id)
	want := filepath.Join(ciJobsDir(vms.StateDir()), id.Hash+"-docker.ext4")
	if got := dockerDiskPath(recPath); got != want {
		t.Errorf("docker disk at %s, want %s", got, want)
	}
	var rec ciJobRecord
	if err := readJSON(recPath, &rec); err != nil || rec.DockerDisk != want {
		t.Errorf("the job's record: %+v, %v; want its docker disk %s", rec, err, want)
	}
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSpace(string(b)), "\n")
	i := slices.Index(args, "path="+want+",serial="+dockervm.DiskSerial)
	if i < 1 || args[i-1] != "--disk" || !strings.Contains(args[i-2], "/p-0") {
		t.Errorf("run's arguments %q: want the cache disk, then --disk with the docker disk %s", args, want)
	}
	if b, err := os.ReadFile(lsFile); err != nil || !strings.Contains(string(b), id.Hash+"-docker.ext4") {
		t.Errorf("the docker disk was not there when run started: %q, %v", b, err)
	}
	if _, err := os.Stat(want); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a prepare that failed left its docker disk (%v)", err)
	}
	if _, err := os.Stat(offerPath("p-0")); err != nil || strings.Contains(msgs.String(), "warm pool") {
		t.Errorf("a --docker job touched the slot's warm VM offer (%v): %q", err, msgs.String())
	}
	if out, err := cleanup(); err != nil {
		t.Errorf("cleanup: %v, %q", err, out)
	}
	if _, err := os.Stat(recPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cleanup left the record (%v)", err)
	}
}

// TestCleanupRemovesDockerDisk: a prepare killed after making Docker's
// disk leaves a record naming it; cleanup removes the disk at the path it
// derives from the job's token, never a file an edited record names.
func TestCleanupRemovesDockerDisk(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	ciJobEnv(t, "tok-half", 13, 0, nil)
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	recPath := jobRecordPath(vms.StateDir(), id)
	other := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := createJobRecord(recPath, ciJobRecord{VM: id.VMName(), Slot: "p-0", DockerDisk: other}); err != nil {
		t.Fatal(err)
	}
	disk := dockerDiskPath(recPath)
	if err := os.WriteFile(disk, []byte("ext4"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := cleanup(); err != nil {
		t.Errorf("cleanup: %v, %q", err, out)
	}
	if _, err := os.Stat(disk); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cleanup left the docker disk %s (%v)", disk, err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("cleanup removed %s, a file the record named but not the job's disk (%v)", other, err)
	}
	// Without --docker the record names no disk, and a file at the path
	// is not the job's: it stays.
	if err := createJobRecord(recPath, ciJobRecord{VM: id.VMName(), Slot: "p-0"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(disk, []byte("ext4"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := cleanup(); err != nil {
		t.Errorf("cleanup: %v, %q", err, out)
	}
	if _, err := os.Stat(disk); err != nil {
		t.Errorf("cleanup of a job without --docker removed %s (%v)", disk, err)
	}
}

// TestPrepareDockerRefusesWarmPool: --docker with --warm-pool is refused
// before anything is recorded or made.
func TestPrepareDockerRefusesWarmPool(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	ciJobEnv(t, "tok-pool", 14, 0, nil)
	cacheDir := filepath.Join(t.TempDir(), "cache")
	msgs, err := prepare(t, func(o *PrepareOptions) {
		o.CacheKey, o.CacheDir, o.WarmPool, o.Docker = "p", cacheDir, 2, &DockerOptions{}
	})
	if !errors.Is(err, errDockerWarmPool) || msgs != "" {
		t.Errorf("prepare --docker --warm-pool 2: %v, %q", err, msgs)
	}
	for _, p := range []string{cacheDir, ciJobsDir(vms.StateDir())} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused prepare made %s (%v)", p, err)
		}
	}
}

// TestStartDockerNoDockerd: prepare's Docker step runs through the job
// VM's agent with the image's environment: an image whose PATH has a
// shell but no Docker gives Docker's own error (a system failure of
// prepare), not the agent's.
func TestStartDockerNoDockerd(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	hostSh, err := exec.LookPath("sh")
	if err != nil {
		testenv.Missing(t, "no sh on this host: %v", err)
	}
	dir := t.TempDir()
	if err := os.Symlink(hostSh, filepath.Join(dir, "sh")); err != nil {
		t.Fatal(err)
	}
	startJobVM(t, "jobdocker", []string{"PATH=" + dir})
	err = fakeVMStarter.startDocker("jobdocker", DockerOptions{Timeout: time.Second})
	var de *dockervm.Error
	if !errors.As(err, &de) || !strings.Contains(de.Reason, "the image has no") {
		t.Errorf("startDocker in an image without Docker: %v; want Docker's error", err)
	}
	if err := fakeVMStarter.startDocker("gone", DockerOptions{}); err == nil || errors.As(err, &de) {
		t.Errorf("startDocker in a VM that is not there: %v; want the VM's error", err)
	}
}

// TestDockerCacheName: the Docker cache is keyed on the slot cacheSlot
// proves (the server's project id, or the runner's --cache-key), never
// on the project or cache names the job sets; it is a name of its own in
// the store, apart from every slot's cache, and a valid cache name for
// the longest namespace and slot.
func TestDockerCacheName(t *testing.T) {
	ciJobEnv(t, "tok-dc", 21, 12, map[string]string{"CI_PROJECT_PATH_SLUG": "other-project", "CI_PROJECT_ID": "13"})
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	env := func(n string) string { return os.Getenv(envJobPrefix + n) }
	slot, err := cacheSlot(id, "", 64, env)
	if err != nil {
		t.Fatal(err)
	}
	if got := dockerCacheName(slot); got != "project-12-0-docker" {
		t.Errorf("the Docker cache of project 12's slot 0: %q, want project-12-0-docker", got)
	}
	long := strings.Repeat("k", maxCacheKey)
	t.Setenv(envJobPrefix+"CI_CONCURRENT_PROJECT_ID", "999")
	slot, err = cacheSlot(id, long, MaxSlots, env)
	if err != nil {
		t.Fatal(err)
	}
	name := dockerCacheName(slot)
	if err := cachedisk.CheckName(name); err != nil {
		t.Errorf("the longest Docker cache name: %v", err)
	}
	// A slot's cache name ends in its number; a Docker cache's does not,
	// so no --cache-key makes a slot's cache another slot's Docker cache.
	if c := name[len(name)-1]; c >= '0' && c <= '9' {
		t.Errorf("Docker cache %q ends in a digit, as slot caches do", name)
	}
}

// TestDockerCacheVerdict: a Docker cache clone is committed only when the
// job passed and dockerd was stopped and its data root unmounted.
func TestDockerCacheVerdict(t *testing.T) {
	for _, tc := range []struct {
		passed bool
		flush  error
		commit bool
		why    string
	}{
		{true, nil, true, ""},
		{false, nil, false, "the job did not pass"},
		{false, errors.New("busy"), false, "the job did not pass"},
		{true, errors.New("umount: /var/lib/docker: target is busy"), false, "not cleanly stopped and unmounted (umount: /var/lib/docker: target is busy)"},
	} {
		commit, why := dockerCacheVerdict(tc.passed, tc.flush)
		if commit != tc.commit || !strings.Contains(why, tc.why) || (commit && why != "") {
			t.Errorf("passed %v, flush %v: commit %v, %q; want %v, %q", tc.passed, tc.flush, commit, why, tc.commit, tc.why)
		}
	}
}

// TestPrepareDockerCache: prepare --docker --docker-cache gives the VM a
// clone of the slot's Docker cache as Docker's data disk (its serial),
// checked out of the cache store, and makes no disk of the job's own;
// when the VM does not start, cleanup discards the clone and commits
// nothing.
func TestPrepareDockerCache(t *testing.T) {
	testenv.NeedMkfs(t)
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	ciJobEnv(t, "tok-dcache", 22, 0, nil)
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	cacheDir := t.TempDir()
	rt, argsFile, _ := runRecorder(t)
	var msgs strings.Builder
	err = rt.Prepare(id, PrepareOptions{DefaultImage: "debian:12", CPUs: 2, Memory: 2 << 30,
		CacheKey: "p", CacheDir: cacheDir, CacheSize: 16 << 20, BootTimeout: 100 * time.Millisecond,
		Net: "user", Slots: 64, Docker: &DockerOptions{DiskSize: 256 << 20, Cache: true}}, &msgs)
	if err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("prepare with a VM starter that fails: %v, %q", err, msgs.String())
	}
	recPath := jobRecordPath(vms.StateDir(), id)
	var rec ciJobRecord
	if err := readJSON(recPath, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.DockerDisk != "" || rec.DockerCache == nil || rec.DockerCache.Clone.Name != "p-0-docker" || rec.DockerCache.Dir != cacheDir {
		t.Fatalf("the job's record: %+v; want a clone of p-0-docker in %s and no disk of its own", rec, cacheDir)
	}
	store, err := cachedisk.Open(cacheDir, cachedisk.Limits{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	clone, err := store.Path(rec.DockerCache.Clone)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Contains(args, "path="+clone+",serial="+dockervm.DiskSerial) {
		t.Errorf("run's arguments %q: want the clone %s as Docker's disk", args, clone)
	}
	if _, err := os.Stat(dockerDiskPath(recPath)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("--docker-cache made a disk of the job's own (%v)", err)
	}
	if info := cacheInfo(t, cacheDir, "p-0-docker"); info.Clones != 1 || info.Versions != 0 {
		t.Errorf("after prepare: %+v; want one clone, no version", info)
	}
	out, err := cleanup()
	if err != nil || !strings.Contains(out, "microvm: cache p-0-docker: the job did not pass") {
		t.Errorf("cleanup: %v, %q", err, out)
	}
	if info := cacheInfo(t, cacheDir, "p-0-docker"); info.Clones != 0 || info.Versions != 0 {
		t.Errorf("after cleanup: %+v; want nothing", info)
	}
}

// TestFinishDockerCache: after the job's VM is gone, its Docker cache
// clone becomes the next version only when the job passed and its data
// root was flushed; a passing job whose VM is gone before cleanup could
// stop dockerd (cleanup's flush fails) commits nothing.
func TestFinishDockerCache(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", shortStateDir(t))
	cacheDir := t.TempDir()
	commitCache(t, cacheDir, "p-0-docker", "v1", true)
	for _, tc := range []struct {
		name   string
		passed bool
		flush  error
		mark   string
		want   string
		said   string
	}{
		{"passed and flushed", true, nil, "j1", "j1", "committed version 2"},
		{"failed", false, nil, "j2", "j1", "the job did not pass"},
		{"passed, not flushed", true, errors.New("dockerd did not stop"), "j3", "j1", "Docker's data root was not cleanly stopped and unmounted (dockerd did not stop)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := commitCache(t, cacheDir, "p-0-docker", tc.mark, false)
			rec := &ciJobRecord{VM: "gone", Slot: "p-0", DockerCache: &jobCache{Dir: cacheDir, Clone: c}, Passed: tc.passed}
			var msgs strings.Builder
			finishDockerCache(rec, tc.flush, &msgs)
			if !strings.Contains(msgs.String(), "microvm: cache p-0-docker: "+tc.said) {
				t.Errorf("finishDockerCache said %q, want %q", msgs.String(), tc.said)
			}
			if got := nextMark(t, cacheDir, "p-0-docker", 2); got != tc.want {
				t.Errorf("the next job finds %q, want %q", got, tc.want)
			}
			if info := cacheInfo(t, cacheDir, "p-0-docker"); info.Clones != 0 {
				t.Errorf("clones left: %+v", info)
			}
		})
	}
	// Through cleanup: the job passed, but its VM is gone, so dockerd
	// could not be stopped there: nothing is committed.
	ciJobEnv(t, "tok-gone", 23, 0, nil)
	id, err := JobIdentity()
	if err != nil {
		t.Fatal(err)
	}
	c := commitCache(t, cacheDir, "p-0-docker", "j4", false)
	rec := ciJobRecord{VM: "gitlab-23-gone", Slot: "p-0", DockerCache: &jobCache{Dir: cacheDir, Clone: c}, Passed: true}
	if err := createJobRecord(jobRecordPath(vms.StateDir(), id), rec); err != nil {
		t.Fatal(err)
	}
	out, err := cleanup()
	if err != nil || !strings.Contains(out, "microvm: cache p-0-docker: Docker's data root was not cleanly stopped") {
		t.Errorf("cleanup of a passing job whose VM is gone: %v, %q", err, out)
	}
	if got := nextMark(t, cacheDir, "p-0-docker", 2); got != "j1" {
		t.Errorf("the next job finds %q, want j1", got)
	}
}
