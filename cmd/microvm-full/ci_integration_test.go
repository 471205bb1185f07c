package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/ci/gitlab"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// GitLab's exit-code variables as this scenario sets them: distinct, so
// that a build failure cannot pass for a system failure.
const (
	testBuildFailure  = 11
	testSystemFailure = 12
)

// ciRunner drives `microvm ci gitlab` as GitLab Runner's custom executor
// does: the four programs, the job's variables as CUSTOM_ENV_*, each
// sub-stage's script in a file of its own, and the exit-code variables.
type ciRunner struct {
	t                     *testing.T
	bin, kernel, agent    string
	state, image, scripts string
}

type ciJob struct {
	r          *ciRunner
	id, slot   string
	token      string // default job-token-ID
	lastStderr string
}

func (r *ciRunner) job(id, slot string) *ciJob { return &ciJob{r: r, id: id, slot: slot} }

// ciTestProject is the project id the scenario's "server" gives every job.
const ciTestProject = 42

// response is the job as GitLab's server sent it, which GitLab Runner
// writes to $JOB_RESPONSE_FILE: the id, token and project the executor
// trusts (the CUSTOM_ENV_ variables are the job's to change).
func (j *ciJob) response() gitlab.JobResponse {
	id, _ := strconv.ParseInt(j.id, 10, 64)
	resp := gitlab.JobResponse{ID: id, Token: "job-token-" + j.id}
	if j.token != "" {
		resp.Token = j.token
	}
	resp.JobInfo.ProjectID = ciTestProject
	return resp
}

// vmName is the name the executor gives the job's own VM.
func (j *ciJob) vmName() string {
	resp := j.response()
	id, err := gitlab.JobIdentityFrom(&resp, func(string) string { return "" })
	if err != nil {
		j.r.t.Fatal(err)
	}
	return id.VMName()
}

func (j *ciJob) env() []string {
	resp := j.response()
	b, err := json.Marshal(resp)
	if err != nil {
		j.r.t.Fatal(err)
	}
	respFile := filepath.Join(j.r.scripts, "job"+j.id+"-response.json")
	if err := os.WriteFile(respFile, b, 0o600); err != nil {
		j.r.t.Fatal(err)
	}
	return append(os.Environ(),
		"MICROVM_STATE_DIR="+j.r.state,
		"BUILD_FAILURE_EXIT_CODE=11", "SYSTEM_FAILURE_EXIT_CODE=12",
		gitlab.EnvJobResponse+"="+respFile,
		"CUSTOM_ENV_CI_RUNNER_ID=7", "CUSTOM_ENV_CI_JOB_ID="+j.id,
		"CUSTOM_ENV_CI_JOB_TOKEN="+resp.Token,
		"CUSTOM_ENV_CI_JOB_IMAGE="+j.r.image,
		"CUSTOM_ENV_CI_PROJECT_PATH_SLUG=group-proj",
		"CUSTOM_ENV_CI_CONCURRENT_PROJECT_ID="+j.slot)
}

// call runs one executor program and returns its status and output.
func (j *ciJob) call(args ...string) (int, string) {
	j.r.t.Helper()
	cmd := exec.Command(j.r.bin, append([]string{"ci", "gitlab"}, args...)...)
	cmd.Env = j.env()
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	j.lastStderr = errOut.String()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		j.r.t.Fatal(err)
	}
	return 0, out.String()
}

func (j *ciJob) prepare(extra ...string) {
	j.r.t.Helper()
	// host-loopback: the job clones from and uploads to a server on this
	// machine's loopback.
	if code, out := j.call(append([]string{"prepare", "--kernel", j.r.kernel, "--agent", j.r.agent, "--cpus", "1", "--memory", "512M",
		"--cache-size", "64M", "--net", "user,host-loopback"}, extra...)...); code != 0 {
		j.r.t.Fatalf("job %s: prepare: status %d\n%s%s", j.id, code, out, j.lastStderr)
	}
}

// script writes a stage's script as the runner does (bash, set -e).
func (j *ciJob) script(stage, body string) string {
	p := filepath.Join(j.r.scripts, "job"+j.id+"-"+stage+".sh")
	if err := os.WriteFile(p, []byte("#!/usr/bin/env bash\nset -eo pipefail\n"+body+"\n"), 0o700); err != nil {
		j.r.t.Fatal(err)
	}
	return p
}

func (j *ciJob) stage(stage, body string) (int, string) {
	j.r.t.Helper()
	return j.call("run", j.script(stage, body), stage)
}

func (j *ciJob) mustStage(stage, body string) string {
	j.r.t.Helper()
	code, out := j.stage(stage, body)
	if code != 0 {
		j.r.t.Fatalf("job %s: %s: status %d\nstdout:\n%s\nstderr:\n%s", j.id, stage, code, out, j.lastStderr)
	}
	return out
}

func (j *ciJob) cleanup() {
	j.r.t.Helper()
	if code, out := j.call("cleanup"); code != 0 {
		j.r.t.Errorf("job %s: cleanup: status %d\n%s%s", j.id, code, out, j.lastStderr)
	}
}

// gitServer serves a bare git repository over git's dumb HTTP protocol
// and takes artefact uploads (PUT /upload/NAME), on this machine's
// loopback: the guest reaches it as host.microvm.internal.
type gitServer struct {
	port    int
	mu      sync.Mutex
	uploads map[string][]byte
}

func startGitServer(t *testing.T, files map[string]string) *gitServer {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		testenv.Missing(t, "git: %v (apt-get install git)", err)
	}
	work := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(work, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bare := filepath.Join(t.TempDir(), "repo.git")
	for _, args := range [][]string{
		{"-C", work, "init", "-q", "-b", "main"},
		{"-C", work, "add", "."},
		{"-C", work, "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "commit", "-q", "-m", "a small C program"},
		{"clone", "-q", "--bare", work, bare},
		{"-C", bare, "update-server-info"},
	} {
		if out, err := exec.Command(git, args...).CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	s := &gitServer{uploads: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.Handle("/repo.git/", http.StripPrefix("/repo.git/", http.FileServer(http.Dir(bare))))
	mux.HandleFunc("/upload/", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.uploads[strings.TrimPrefix(r.URL.Path, "/upload/")] = b
		s.mu.Unlock()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s.port = ln.Addr().(*net.TCPAddr).Port
	return s
}

// TestGitLabExecutor drives microvm's GitLab custom executor through a
// real job as GitLab Runner would (no GitLab server: the four programs,
// their environment, script files, stage names and exit-code variables):
// clone a repository served over HTTP from this machine, build and test a
// C program with the image's gcc, archive the cache and upload an
// artefact. Then a job whose test fails (a build failure, not a system
// failure) and that finds the first job's cache, a job cancelled mid-step
// (SIGTERM: its VM is gone after cleanup), two jobs at once, and a stage
// run without a VM (a system failure).
func TestGitLabExecutor(t *testing.T) {
	images := hostImport(t, "ci-build", "ci-build:1", testenv.DebianBuildImage(t))
	r := &ciRunner{t: t, bin: testenv.Binary(t), kernel: testenv.BzImage(t), agent: testenv.Agent(t),
		state: t.TempDir(), image: "ci-build:1", scripts: t.TempDir()}
	linkImages(t, r.state, images)
	srv := startGitServer(t, map[string]string{
		"hello.c":  "#include <stdio.h>\n#include <string.h>\nint main(int c, char **v) {\n  if (c > 1 && !strcmp(v[1], \"fail\")) return 3;\n  puts(\"hello from the job\");\n  return 0;\n}\n",
		"Makefile": "hello: hello.c\n\tgcc -O2 -o hello hello.c\ntest: hello\n\t./hello | grep -q 'hello from the job'\n",
	})
	repo := "http://host.microvm.internal:" + strconv.Itoa(srv.port) + "/repo.git"
	upload := "http://host.microvm.internal:" + strconv.Itoa(srv.port) + "/upload/"
	const project = "/builds/group/proj"

	// config_exec.
	code, out := r.job("0", "0").call("config")
	var cfg struct {
		BuildsDir string `json:"builds_dir"`
		CacheDir  string `json:"cache_dir"`
		Driver    struct{ Name string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &cfg) != nil || cfg.BuildsDir != "/builds" || cfg.CacheDir != "/cache" || cfg.Driver.Name != "microvm" {
		t.Fatalf("config: status %d, %q", code, out)
	}

	// Job 1: the whole job, successful.
	j1 := r.job("1", "0")
	j1.prepare()
	// A job that names job 1's id (its CUSTOM_ENV_CI_JOB_ID and the
	// server's id alike) with its own token does not reach job 1's VM.
	forger := &ciJob{r: r, id: "1", slot: "0", token: "another-token"}
	forger.cleanup()
	if vmGone(t, r, j1.vmName()) == nil {
		t.Fatal("a cleanup with job 1's id and another token removed job 1's VM")
	}
	j1.mustStage("prepare_script", "echo on $(uname -n) $(cat /etc/debian_version)")
	j1.mustStage("get_sources", "git clone -q "+repo+" "+project+" && git -C "+project+" log -1 --format=%s")
	if out := j1.mustStage("restore_cache", "cat /cache/counter 2>/dev/null || echo none"); !strings.Contains(out, "none") {
		t.Errorf("job 1 restore_cache: %q, want an empty cache", out)
	}
	if out := j1.mustStage("step_script", "cd "+project+" && make -s hello test && ./hello"); !strings.Contains(out, "hello from the job") {
		t.Errorf("job 1 step_script: %q", out)
	}
	j1.mustStage("archive_cache", "n=$(cat /cache/counter 2>/dev/null || echo 0); echo $((n+1)) > /cache/counter; cp "+project+"/hello /cache/; sync")
	j1.mustStage("upload_artifacts_on_success", "cd "+project+" && tar czf /tmp/artifacts.tgz hello && curl -fsS -T /tmp/artifacts.tgz "+upload+"job1.tgz")
	j1.mustStage("cleanup_file_variables", "true")
	j1.cleanup()
	srv.mu.Lock()
	art := srv.uploads["job1.tgz"]
	srv.mu.Unlock()
	if names := tgzNames(t, art); !strings.Contains(names, "hello") {
		t.Errorf("job 1's artefact holds %q, want the built program", names)
	}
	if vmGone(t, r, j1.vmName()) != nil {
		t.Error("job 1's VM is still there after cleanup")
	}

	// Job 2: finds job 1's cache (the counter and the program it kept);
	// its step fails: a build failure.
	j2 := r.job("2", "0")
	j2.prepare()
	if out := j2.mustStage("restore_cache", "cat /cache/counter"); strings.TrimSpace(out) != "1" {
		t.Errorf("job 2 restore_cache: %q, want job 1's counter 1", out)
	}
	if code, out := j2.stage("step_script", "/cache/hello && /cache/hello fail"); code != testBuildFailure {
		t.Errorf("job 2 failing step_script: status %d, want the build failure %d\n%s%s", code, testBuildFailure, out, j2.lastStderr)
	}
	j2.cleanup()

	// Job 3: cancelled in the middle of a step.
	j3 := r.job("3", "0")
	j3.prepare()
	cmd := exec.Command(r.bin, "ci", "gitlab", "run", j3.script("step_script", "echo started; sleep 600"), "step_script")
	cmd.Env = j3.env()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 8)
	if _, err := io.ReadFull(stdout, line); err != nil || string(line) != "started\n" {
		t.Fatalf("job 3: %q, %v", line, err)
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != testSystemFailure || time.Since(start) > 30*time.Second {
		t.Errorf("job 3 cancelled: %v after %v; want status %d at once", err, time.Since(start), testSystemFailure)
	}
	j3.cleanup()
	if err := vmGone(t, r, j3.vmName()); err != nil {
		t.Errorf("job 3 after cleanup: %v", err)
	}

	// Jobs 4 and 5 at once, in two concurrency slots.
	var wg sync.WaitGroup
	outs := make([]string, 2)
	for i, id := range []string{"4", "5"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := r.job(id, strconv.Itoa(i))
			code, _ := j.call("prepare", "--kernel", r.kernel, "--agent", r.agent, "--cpus", "1", "--memory", "512M", "--cache-size", "64M", "--net", "user,host-loopback")
			if code != 0 {
				t.Errorf("job %s: prepare: status %d: %s", id, code, j.lastStderr)
				return
			}
			defer j.call("cleanup")
			code, outs[i] = j.stage("step_script", "echo job "+id+" on $(uname -n); mount | grep -c ' /cache '")
			if code != 0 {
				t.Errorf("job %s: step_script: status %d: %s", id, code, j.lastStderr)
			}
		}()
	}
	wg.Wait()
	for i, id := range []string{"4", "5"} {
		if !strings.Contains(outs[i], "job "+id) {
			t.Errorf("job %s at once: %q", id, outs[i])
		}
	}

	// Jobs 6 and 7 with the warm pool, in a slot of their own: job 6
	// boots its VM, its cleanup boots the slot's next one, job 7 takes
	// that VM (with the slot's cache mounted), and drain removes the one
	// job 7's cleanup booted.
	j6 := r.job("6", "2")
	t.Cleanup(func() { r.job("0", "0").call("drain") })
	start = time.Now()
	j6.prepare("--warm-pool", "1")
	cold := time.Since(start)
	if !strings.Contains(j6.lastStderr, "starting VM "+j6.vmName()) {
		t.Errorf("job 6, the slot's first: prepare said %q, want a VM of its own booted", j6.lastStderr)
	}
	j6.mustStage("step_script", "echo from-job-6 > /cache/warm-marker; sync")
	j6.cleanup()
	warm := gitlab.WarmVMName("project-" + strconv.Itoa(ciTestProject) + "-2")
	if !strings.Contains(j6.lastStderr, "booting VM "+warm) {
		t.Errorf("job 6 cleanup said %q, want the slot's next VM booted", j6.lastStderr)
	}
	if vmGone(t, r, j6.vmName()) != nil {
		t.Error("job 6's VM is still there after cleanup")
	}
	j7 := r.job("7", "2")
	start = time.Now()
	j7.prepare("--warm-pool", "1")
	t.Logf("prepare: %v cold (job 6), %v taking the warm VM (job 7, its boot included when still under way)", cold, time.Since(start))
	if !strings.Contains(j7.lastStderr, "took VM "+warm) {
		t.Errorf("job 7: prepare said %q, want the warm VM taken", j7.lastStderr)
	}
	if out := j7.mustStage("step_script", "cat /cache/warm-marker; cat /etc/debian_version"); !strings.Contains(out, "from-job-6") {
		t.Errorf("job 7 in the warm VM: %q, want job 6's cache", out)
	}
	j7.cleanup()
	if !strings.Contains(j7.lastStderr, "booting VM "+warm) {
		t.Errorf("job 7 cleanup said %q, want the slot's next VM booted", j7.lastStderr)
	}
	if code, out := r.job("0", "0").call("drain"); code != 0 || !strings.Contains(out, "removed warm VM "+warm) {
		t.Errorf("drain: status %d, %q", code, out)
	}
	if err := vmGone(t, r, warm); err != nil {
		t.Errorf("after drain: %v", err)
	}

	// A stage with no VM to run in: a system failure, one line.
	if code, _ := r.job("99", "0").stage("step_script", "true"); code != testSystemFailure {
		t.Errorf("a stage without a VM: status %d, want %d", code, testSystemFailure)
	}
}

// TestGitLabExecutorShOnly: a job in a busybox image, which has sh and
// no bash, runs its stages with sh and says so in its log; in an image
// with neither (its sh whited out) prepare is a system failure with one
// line and leaves no VM.
func TestGitLabExecutorShOnly(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	r := &ciRunner{t: t, bin: testenv.Binary(t), kernel: testenv.BzImage(t), agent: testenv.Agent(t),
		state: t.TempDir(), scripts: t.TempDir()}
	mkdir := tarEntry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/mkdir", Linkname: "busybox", Mode: 0o777}}
	noSh := tarEntry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "bin/.wh.sh", Mode: 0o644}}
	for name, oci := range map[string]string{"busybox-ci:1": writeBusyboxImage(t, mkdir), "no-shell:1": writeBusyboxImage(t, mkdir, noSh)} {
		imp := exec.Command(r.bin, "image", "import", "--name", name, oci)
		imp.Env = append(os.Environ(), "MICROVM_STATE_DIR="+r.state)
		if out, err := imp.CombinedOutput(); err != nil {
			t.Fatalf("image import %s: %v\n%s", name, err, out)
		}
	}

	r.image = "busybox-ci:1"
	j := r.job("1", "0")
	j.prepare()
	if !strings.Contains(j.lastStderr, "microvm: running the job with sh (the image has no bash)\n") {
		t.Errorf("prepare said %q, want the shell named", j.lastStderr)
	}
	// Scripts for sh: no bash header.
	shStage := func(stage, body string) (int, string) {
		script := filepath.Join(r.scripts, "job1-"+stage+".sh")
		if err := os.WriteFile(script, []byte("set -e\n"+body+"\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		return j.call("run", script, stage)
	}
	if code, out := shStage("step_script", `echo "shell=${BASH_VERSION:-none}"; echo kept > /cache/kept; cat /cache/kept`); code != 0 || out != "shell=none\nkept\n" {
		t.Errorf("step_script: status %d, %q\n%s", code, out, j.lastStderr)
	}
	if code, _ := shStage("after_script", "exit 3"); code != testBuildFailure {
		t.Errorf("a failing script under sh: status %d, want the build failure %d\n%s", code, testBuildFailure, j.lastStderr)
	}
	j.cleanup()

	r.image = "no-shell:1"
	j2 := r.job("2", "0")
	code, _ := j2.call("prepare", "--kernel", r.kernel, "--agent", r.agent, "--cpus", "1", "--memory", "256M", "--cache-size", "64M")
	if code != testSystemFailure || !strings.HasSuffix(j2.lastStderr, ": neither bash nor sh found in the job's image\n") {
		t.Errorf("prepare in an image without a shell: status %d, %q; want %d and a last line naming both shells", code, j2.lastStderr, testSystemFailure)
	}
	if err := vmGone(t, r, j2.vmName()); err != nil {
		t.Errorf("after a prepare without a shell: %v", err)
	}
	j2.cleanup()
}

// vmGone says nil when no VM of that name is listed.
func vmGone(t *testing.T, r *ciRunner, name string) error {
	t.Helper()
	cmd := exec.Command(r.bin, "ls", "--json")
	cmd.Env = append(os.Environ(), "MICROVM_STATE_DIR="+r.state)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(`"name": "`+name)) {
		return errors.New(name + " is listed: " + string(out))
	}
	return nil
}

// tgzNames lists a gzipped tar's entries.
func tgzNames(t *testing.T, b []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return "(not gzip: " + err.Error() + ")"
	}
	var names []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	return strings.Join(names, " ")
}

// TestGitHubRunnerLauncher runs examples/github-actions/launch-runner with
// a stand-in for GitHub's runner in a busybox image: the runner gets its
// JIT config, its job runs, and the VM is gone when the launcher returns;
// a launcher stopped with SIGTERM in the middle of a job leaves no VM
// either; with DOCKER=1 in an image without dockerd it exits 122, says
// why, and leaves no VM.
func TestGitHubRunnerLauncher(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	runner := func(name, body string) tarEntry {
		return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "home/runner/" + name, Mode: 0o755, Uid: 1000, Gid: 1000},
			Body: []byte("#!/bin/sh\n" + body + "\n")}
	}
	oci := writeBusyboxImage(t,
		tarEntry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: "home/", Mode: 0o755}},
		tarEntry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: "home/runner/", Mode: 0o755, Uid: 1000, Gid: 1000}},
		runner("run.sh", `echo "runner got [$*] jit=$ACTIONS_RUNNER_INPUT_JITCONFIG"; echo job done`),
		runner("slow.sh", "echo started; sleep 600"))
	r := &ciRunner{t: t, bin: testenv.Binary(t), state: t.TempDir()}
	imp := exec.Command(r.bin, "image", "import", "--name", "runner:1", oci)
	imp.Env = append(os.Environ(), "MICROVM_STATE_DIR="+r.state)
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("image import: %v\n%s", err, out)
	}
	launcher := func(runnerCmd string) *exec.Cmd {
		cmd := exec.Command("bash", filepath.Join(root, "examples", "github-actions", "launch-runner"), "runner:1")
		cmd.Env = append(os.Environ(), "MICROVM="+r.bin, "MICROVM_STATE_DIR="+r.state, "CPUS=1", "MEMORY=256M",
			"RUNNER_CMD="+runnerCmd, "JITCONFIG=JIT-abc123")
		return cmd
	}

	out, err := launcher("/home/runner/run.sh").CombinedOutput()
	// The config reaches the runner through its environment: on no
	// command line (microvm's, or the runner's) that ps would show.
	if err != nil || !strings.Contains(string(out), "runner got [] jit=JIT-abc123") || !strings.Contains(string(out), "job done") {
		t.Errorf("launcher: %v\n%s", err, out)
	}
	if err := vmGone(t, r, "gha-"); err != nil {
		t.Errorf("after the job: %v", err)
	}

	// DOCKER=1 with an image that has no dockerd: Docker's status and
	// reason, the launcher's line, no runner started and no VM left.
	dl := launcher("/home/runner/run.sh")
	dl.Env = append(dl.Env, "DOCKER=1", "DOCKER_DISK=256M")
	var dout, derr bytes.Buffer
	dl.Stdout, dl.Stderr = &dout, &derr
	err = dl.Run()
	var dee *exec.ExitError
	if !errors.As(err, &dee) || dee.ExitCode() != 122 || !strings.Contains(derr.String(), "docker: the image has no dockerd") ||
		!strings.Contains(derr.String(), "launch-runner: Docker did not come up") || strings.Contains(dout.String(), "runner got") {
		t.Errorf("DOCKER=1 without dockerd: %v\nstdout:\n%s\nstderr:\n%s", err, &dout, &derr)
	}
	if err := vmGone(t, r, "gha-"); err != nil {
		t.Errorf("after Docker failed: %v", err)
	}

	cmd := launcher("/home/runner/slow.sh")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	var seen bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(seen.String(), "started") && time.Now().Before(deadline) {
		n, err := stdout.Read(buf)
		seen.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if !strings.Contains(seen.String(), "started") {
		cmd.Process.Kill()
		t.Fatalf("the slow runner never started: %q", seen.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	go io.Copy(io.Discard, stdout)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 143 {
			t.Errorf("launcher after SIGTERM: %v, want status 143", err)
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the launcher did not end within 60 s of SIGTERM")
	}
	if err := vmGone(t, r, "gha-"); err != nil {
		t.Errorf("after SIGTERM: %v", err)
	}
}
