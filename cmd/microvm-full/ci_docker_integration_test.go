package main

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/testing/testimage"
)

// The project the Docker jobs build: an image FROM the busybox image the
// repository holds as a docker save tarball, with a RUN step, whose
// container says what that step wrote.
const ciDockerfile = `FROM bb:1
RUN echo step-ran > /built
CMD ["sh", "-c", "echo container-says-$(cat /built)"]
`

// The dependency cache the jobs keep in the project's cache, laid out as
// Go's module cache lays out a module's version list.
const ciGoModList = "/cache/go/mod/cache/download/example.com/dep/@v/list"

// TestGitLabExecutorDocker runs two jobs of one project through the GitLab
// executor with prepare --docker --docker-cache, cloning the project from
// a git server on this machine as TestGitLabExecutor does. Job 1 loads a
// busybox image from the repository's docker save tarball, builds an image
// from it with a RUN step, runs it, and writes a Go module cache entry
// under /cache; it passes, so cleanup commits both the slot's cache and
// its Docker cache. Job 2, in a VM of its own, finds the loaded image,
// its build uses the cached RUN step, its container runs, and the module
// cache entry is there. Then the GitHub launcher with DOCKER=1, in the
// same state directory (githubLauncherDocker).
func TestGitLabExecutorDocker(t *testing.T) {
	// The imported image is TestExecDocker's (requireDockerImage); the
	// state directory itself (the VMs' sockets, the job records, the
	// caches) is this run's own, with the image store linked into it.
	images := requireDockerImage(t)
	bin := testenv.Binary(t)
	r := &ciRunner{t: t, bin: bin, kernel: testenv.BzImage(t), agent: testenv.Agent(t),
		state: t.TempDir(), image: "debian-docker:12", scripts: t.TempDir()}
	if err := os.Symlink(filepath.Join(images, "images"), filepath.Join(r.state, "images")); err != nil {
		t.Fatal(err)
	}
	srv := startGitServer(t, map[string]string{"Dockerfile": ciDockerfile, "bb.tar": busyboxSaveTarball(t)})
	repo := "http://host.microvm.internal:" + strconv.Itoa(srv.port) + "/repo.git"
	const project = "/builds/group/proj"
	slot := "project-" + strconv.Itoa(ciTestProject) + "-0"

	job := func(id, step string) string {
		t.Helper()
		j := r.job(id, "0")
		start := time.Now()
		code, out := j.call("prepare", "--kernel", r.kernel, "--agent", r.agent, "--cpus", "2", "--memory", "1536M",
			"--cache-size", "64M", "--net", "user,host-loopback", "--boot-timeout", "5m",
			"--docker", "--docker-cache", "--docker-disk", "2G", "--docker-timeout", dockerTimeout)
		if code != 0 {
			t.Fatalf("job %s: prepare: status %d\n%s%s", id, code, out, j.lastStderr)
		}
		prepared := time.Now()
		j.mustStage("get_sources", "git clone -q "+repo+" "+project)
		out = j.mustStage("step_script", "cd "+project+"\n"+step)
		stepped := time.Now()
		j.cleanup()
		t.Logf("job %s: prepare %v, stages %v, cleanup %v; step_script:\n%s", id, prepared.Sub(start).Round(time.Second),
			stepped.Sub(prepared).Round(time.Second), time.Since(stepped).Round(time.Second), out)
		for _, want := range []string{
			"microvm: cache " + slot + ": committed version " + id,
			"microvm: cache " + slot + "-docker: committed version " + id,
		} {
			if !strings.Contains(j.lastStderr, want) {
				t.Errorf("job %s: cleanup said %q, want %q", id, j.lastStderr, want)
			}
		}
		if err := vmGone(t, r, j.vmName()); err != nil {
			t.Errorf("job %s after cleanup: %v", id, err)
		}
		return out
	}

	out := job("1", strings.Join([]string{
		"docker load -i bb.tar",
		"docker build -t app .",
		"docker run --rm app",
		"mkdir -p " + filepath.Dir(ciGoModList),
		"echo v1.0.0 > " + ciGoModList,
	}, "\n"))
	for _, want := range []string{"Loaded image: bb:1", "container-says-step-ran"} {
		if !strings.Contains(out, want) {
			t.Errorf("job 1's output lacks %q", want)
		}
	}

	out = job("2", strings.Join([]string{
		"docker image ls --format 'image {{.Repository}}:{{.Tag}}'",
		"docker build -t app .",
		"docker run --rm app",
		"cat " + ciGoModList,
	}, "\n"))
	for _, want := range []string{"image bb:1", "container-says-step-ran", "v1.0.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("job 2's output lacks %q", want)
		}
	}
	// The classic builder says "Using cache" for a cached step, BuildKit
	// "CACHED".
	if !strings.Contains(out, "Using cache") && !strings.Contains(out, "CACHED") {
		t.Errorf("job 2's docker build used no cached step")
	}

	// Here rather than in a test of its own: a box of its own, and the
	// Docker image's import, are the costly part.
	t.Run("GitHubLauncher", func(t *testing.T) { githubLauncherDocker(t, r) })
}

// ghaDockerRunner is the stand-in for GitHub's runner in
// githubLauncherDocker: what a job that uses Docker does, each result on
// a line of its own (the VM's console shares the launcher's output, so
// no check spans two lines). The container is busyboxSaveTarball's bb:1,
// whose Env sets PATH=/bin; the first run adds a variable and exits 7,
// the second exits 0. The runner itself exits 0, as a just-in-time
// runner does once it has run its job.
const ghaDockerRunner = `#!/bin/sh
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "runner got [$*] jit=$ACTIONS_RUNNER_INPUT_JITCONFIG"
grep ' /var/lib/docker ' /proc/mounts
docker info --format 'driver={{.Driver}} root={{.DockerRootDir}}' || exit 20
docker load -i /gha/bb.tar || exit 21
o=$(docker run --rm -e JOB=gha-job bb:1 sh -c 'echo "env JOB=$JOB PATH=$PATH"; exit 7'); s=$?
echo "first container: [$o] status $s"
o=$(docker run --rm bb:1 echo hello); s=$?
echo "second container: [$o] status $s"
echo job done
`

// githubLauncherDocker runs examples/github-actions/launch-runner with
// DOCKER=1 in the Docker image (r.image, in r's state directory): the
// VM's dockerd answers before the stand-in runner (ghaDockerRunner)
// starts, on overlay2 on the VM's data disk; the runner loads an image
// and runs its containers, sees their exit statuses and Env, and gets its
// JIT config; the launcher returns the runner's 0; and neither the VM nor
// its data disk is left.
//
// A real runner's image holds the runner; the test cannot add a file to
// the Docker image without importing its 800 MB a second time, so the
// stand-in comes on a cache disk (the launcher's CACHE) that one exec
// fills first, and RUNNER_CMD names it there. That also runs CACHE beside
// DOCKER=1: the cache is committed after the runner's 0.
func githubLauncherDocker(t *testing.T, r *ciRunner) {
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "MICROVM_STATE_DIR="+r.state)
	src := t.TempDir()
	for name, body := range map[string]string{"runner": ghaDockerRunner, "bb.tar": busyboxSaveTarball(t)} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fill := exec.Command(r.bin, "exec", "--kernel", r.kernel, "--agent", r.agent, "--image", r.image,
		"--memory", "512M", "--cpus", "1", "--share", "tag=gha,path="+src, "--cache", "gha=/gha,size=64M",
		"--", "cp", "/run/microvm-shares/gha/runner", "/run/microvm-shares/gha/bb.tar", "/gha/")
	fill.Env = env
	if out, err := fill.CombinedOutput(); err != nil {
		t.Fatalf("exec filling the runner's cache: %v\n%s", err, out)
	}

	start := time.Now()
	launcher := exec.Command("bash", filepath.Join(root, "examples", "github-actions", "launch-runner"), r.image)
	launcher.Env = append(env, "MICROVM="+r.bin, "CPUS=2", "MEMORY=1536M",
		"DOCKER=1", "DOCKER_DISK=2G", "DOCKER_TIMEOUT="+dockerTimeout,
		"CACHE=gha=/gha", "RUNNER_CMD=/gha/runner", "JITCONFIG=JIT-docker-1")
	lines := &lineLogger{t: t, start: start}
	launcher.Stdout, launcher.Stderr = lines, lines
	err = launcher.Run()
	out := lines.String()
	t.Logf("launcher with DOCKER=1: %v", time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("launcher with DOCKER=1: %v", err)
	}
	for _, want := range []string{
		"runner got [] jit=JIT-docker-1",                        // the config, in the environment only
		" /var/lib/docker ext4 ",                                // Docker's data root on its disk
		"driver=overlay2 root=/var/lib/docker",                  // dockerd answered
		"Loaded image: bb:1",                                    // docker load
		"first container: [env JOB=gha-job PATH=/bin] status 7", // -e and the image's Env; the exit status
		"second container: [hello] status 0",
		"job done",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the launcher's output lacks %q", want)
		}
	}
	if strings.Contains(out, "not kept") {
		t.Errorf("the runner exited 0, yet its cache was not kept")
	}
	if err := vmGone(t, r, "gha-"); err != nil {
		t.Errorf("after the launcher: %v", err)
	}
	// The VM's directory, which held the data disk (dockerDiskFile).
	if left, err := filepath.Glob(filepath.Join(r.state, "vms", "gha-*")); err != nil || len(left) > 0 {
		t.Errorf("after the launcher: %q left (%v), want no VM directory and no data disk", left, err)
	}
	ls := exec.Command(r.bin, "cache", "ls", "--json")
	ls.Env = env
	if b, err := ls.CombinedOutput(); err != nil || !strings.Contains(string(b), `"Name": "gha"`) || !strings.Contains(string(b), `"Newest": 2`) {
		t.Errorf("cache ls after the fill and the runner: %v\n%s", err, b)
	}
}

// busyboxSaveTarball is a docker save tarball of a one-layer image bb:1
// holding Debian's static busybox as /bin/busybox and the applets the
// project's Dockerfile runs.
func busyboxSaveTarball(t *testing.T) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "static busybox: %v (apt-get install busybox-static)", err)
	}
	entries := []testimage.Entry{
		{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755}},
		{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, Body: bb},
	}
	for _, applet := range []string{"sh", "echo", "cat"} {
		entries = append(entries, testimage.Entry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777}})
	}
	img := testimage.Of(t, v1.Config{Env: []string{"PATH=/bin"}}, "amd64", testimage.Layer(t, entries))
	tag, err := name.NewTag("bb:1")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tarball.Write(tag, img, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
