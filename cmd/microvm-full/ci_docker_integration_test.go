package main

import (
	"archive/tar"
	"bytes"
	"os"
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
// cache entry is there.
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
