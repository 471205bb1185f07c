package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/testing/testimage"
)

// TestExecDocker runs Docker inside a VM with `microvm exec --docker`,
// its data root on a cache disk, twice. The first exec builds a busybox
// image FROM scratch (COPY, RUN) and a two-stage image from it, round-trips
// one through docker save and docker load, runs a container (its Env,
// WorkingDir and exit status passed through), reaches a server on this
// machine's loopback from a container on Docker's bridge (through --net
// user), serves a container's port to this machine (docker run -p, then
// --publish), and finds one container from another by name on a
// user-defined network. It exits 0, so the cache is committed; the second
// exec finds the images there and its docker build uses the cached steps.
// Then run --docker starts a named VM with Docker, which exec --vm
// reaches. Nothing leaves this machine.
func TestExecDocker(t *testing.T) {
	state := requireDockerImage(t)
	bin := testenv.Binary(t)
	env := append(os.Environ(), "MICROVM_STATE_DIR="+state)
	if _, err := exec.LookPath("busybox"); err != nil {
		testenv.Missing(t, "busybox (Debian's busybox-static, which scripts/deps installs): %v", err)
		return
	}
	// The cache store where sparse files stay sparse when copied (the
	// box's 9p mount of the repository reads holes as data), this run's
	// own.
	caches := filepath.Join(t.TempDir(), "caches")
	if err := os.Mkdir(caches, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(state, "caches")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink(caches, filepath.Join(state, "caches")); err != nil {
		t.Fatal(err)
	}
	// The build context (testimage.WriteDockerContext), its base image
	// with an environment variable of its own.
	ctxDir := t.TempDir()
	if err := testimage.WriteDockerContext(ctxDir, "ENV FOO=bar\n"); err != nil {
		t.Fatal(err)
	}

	// A server on this machine's loopback, which a container reaches.
	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "host-served\n")
	})}
	go srv.Serve(web)
	defer srv.Close()
	pub := testenv.FreePort(t, "tcp")

	execArgs := func(script string) []string {
		return []string{"exec", "--kernel", testenv.BzImage(t), "--agent", testenv.Agent(t),
			"--image", "debian-docker:12", "--memory", "1536M", "--cpus", "2",
			"--docker", "--docker-timeout", dockerTimeout, "--cache", "dock=/var/lib/docker,size=4G",
			"--share", "tag=ctx,path=" + ctxDir,
			"--net", "user,host-loopback", "--publish", fmt.Sprintf("%d:8080", pub),
			"--timeout", "20m", "--", "sh", "-c", script}
	}
	script1 := strings.Join([]string{
		"set -e",
		"cd /run/microvm-shares/ctx",
		"docker build -q -t bb -f Dockerfile.base .",
		"docker build -t app -f Dockerfile.app .",
		"docker save bb -o /tmp/bb.tar && docker rmi bb >/dev/null && docker load -i /tmp/bb.tar",
		`set +e; docker run --rm bb sh -c 'echo "env FOO=$FOO pwd=$(pwd)"; exit 7'; echo "run-status=$?"; set -e`,
		"docker run --rm app",
		fmt.Sprintf("docker run --rm bb wget -qO- http://192.168.127.254:%d/", web.Addr().(*net.TCPAddr).Port),
		"docker network create jobnet >/dev/null",
		`docker run -d --name srv --network jobnet bb sh -c 'mkdir -p /www && echo from-srv > /www/index.html && exec httpd -f -p 80 -h /www' >/dev/null`,
		`docker run --rm --network jobnet bb sh -c 'i=0; until wget -qO- http://srv/; do i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.2; done'`,
		`docker run -d --name pub -p 8080:80 bb sh -c 'mkdir -p /www && echo from-published > /www/index.html && exec httpd -f -p 80 -h /www' >/dev/null`,
		"echo PUBLISHED",
		"i=0; while [ ! -e fetched ]; do i=$((i+1)); [ $i -lt 3000 ] || exit 1; sleep 0.2; done",
		"docker rm -f srv pub >/dev/null",
	}, "\n")
	vm := exec.Command(bin, execArgs(script1)...)
	vm.Env = env
	stdout, err := vm.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	vm.Stderr = &stderr
	start := time.Now()
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	defer vm.Process.Kill()
	var out strings.Builder
	var outMu sync.Mutex
	published := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			// Streamed with -v: in the box each step takes tens of seconds.
			t.Logf("%6.1fs guest: %s", time.Since(start).Seconds(), sc.Text())
			outMu.Lock()
			out.WriteString(sc.Text() + "\n")
			outMu.Unlock()
			if sc.Text() == "PUBLISHED" {
				close(published)
			}
		}
	}()
	output := func() string { outMu.Lock(); defer outMu.Unlock(); return out.String() }
	select {
	case <-published:
	case <-scanned:
		vm.Wait()
		t.Fatalf("exec ended before publishing\nstdout:\n%s\nstderr:\n%s", output(), &stderr)
	case <-time.After(20 * time.Minute):
		t.Fatalf("the guest did not get to publishing\nstdout:\n%s\nstderr:\n%s", output(), &stderr)
	}
	// The published container's httpd may not answer yet: ask until it
	// does, bounded.
	page := ""
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", pub))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if page = strings.TrimSpace(string(b)); page == "from-published" {
				break
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	if page != "from-published" {
		t.Errorf("GET of docker run -p through --publish: %q, want from-published", page)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "fetched"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = vm.Wait()
	<-scanned
	o := output()
	t.Logf("first exec: %v", time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("first exec: %v\nstderr:\n%s", err, &stderr)
	}
	for _, want := range []string{
		"Loaded image: bb:latest",                       // docker load of docker save's tarball
		"env FOO=bar pwd=/work",                         // the image's Env and WorkingDir
		"run-status=7",                                  // the container's exit status
		"built-in-stage-one\n" + testimage.HelloContext, // both stages and the COPY
		"host-served",                                   // bridge -> guest -> --net user -> host loopback
		"from-srv",                                      // by name on a user-defined network
	} {
		if !strings.Contains(o, want) {
			t.Errorf("first exec's output lacks %q", want)
		}
	}

	// The second exec finds the first one's images in the committed cache,
	// and docker build its cached steps.
	start = time.Now()
	vm2 := exec.Command(bin, execArgs(strings.Join([]string{
		"set -e",
		"cd /run/microvm-shares/ctx",
		"docker image ls --format 'image {{.Repository}}'",
		"docker build -t app -f Dockerfile.app .",
	}, "\n"))...)
	vm2.Env = env
	lines := &lineLogger{t: t, start: start}
	vm2.Stdout, vm2.Stderr = lines, lines
	err = vm2.Run()
	out2 := lines.String()
	t.Logf("second exec: %v", time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("second exec: %v", err)
	}
	for _, want := range []string{"image bb", "image app", "Using cache"} {
		if !strings.Contains(out2, want) {
			t.Errorf("second exec's output lacks %q", want)
		}
	}
	ls := exec.Command(bin, "cache", "ls", "--json")
	ls.Env = env
	if b, err := ls.CombinedOutput(); err != nil || !strings.Contains(string(b), `"Name": "dock"`) || !strings.Contains(string(b), `"Newest": 2`) {
		t.Errorf("cache ls after two passing execs: %v\n%s", err, b)
	}

	// run --docker: a named VM whose dockerd starts once its agent
	// answers, before run --detach returns, on a data disk in the VM's
	// own directory; exec --vm reaches it; rm takes the disk with it. The
	// VMs' directories hold Unix sockets, which the box's 9p mount of
	// the repository refuses: they go to this run's temporary directory.
	vmsDir := filepath.Join(t.TempDir(), "vms")
	if err := os.Mkdir(vmsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(state, "vms")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink(vmsDir, filepath.Join(state, "vms")); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (string, error) {
		c := exec.Command(bin, args...)
		c.Env = env
		b, err := c.CombinedOutput()
		return string(b), err
	}
	start = time.Now()
	if out, err := cli("run", "--name", "dk", "--with-agent", "--image", "debian-docker:12", "--kernel", testenv.BzImage(t),
		"--agent", testenv.Agent(t), "--memory", "1G", "--cpus", "2", "--docker", "--docker-disk", "2G",
		"--docker-timeout", dockerTimeout, "--detach"); err != nil {
		t.Fatalf("run --docker --detach: %v\n%s", err, out)
	}
	defer cli("rm", "-f", "dk")
	t.Logf("run --docker --detach returned after %v", time.Since(start).Round(time.Second))
	if out, err := cli("exec", "--vm", "dk", "--", "docker", "info", "--format", "driver={{.Driver}} root={{.DockerRootDir}}"); err != nil ||
		!strings.Contains(out, "driver=overlay2 root=/var/lib/docker") {
		t.Errorf("exec --vm dk docker info: %v\n%s", err, out)
	}
	disk := filepath.Join(vmsDir, "dk", namedvm.DockerDiskFile)
	if _, err := os.Stat(disk); err != nil {
		t.Errorf("the named VM's data disk: %v", err)
	}
	if out, err := cli("stop", "dk"); err != nil {
		t.Errorf("stop dk: %v\n%s", err, out)
	}
	if out, err := cli("rm", "dk"); err != nil {
		t.Errorf("rm dk: %v\n%s", err, out)
	}
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Errorf("the data disk after rm: %v, want it gone", err)
	}
}

// dockerTimeout is the Docker tests' --docker-timeout: dockerd answers
// in about a minute in the box; a dockerd that does not come up fails with
// its log tail well before the box's quiet timeout (8 minutes without
// output) would end the box and lose it.
const dockerTimeout = "5m"

// lineLogger is an io.Writer for a command's output that logs each line
// as it comes, with the time since start (in the box a Docker step takes
// tens of seconds, and a silent test is one the box's quiet timeout ends),
// and keeps all of it for String.
type lineLogger struct {
	t     *testing.T
	start time.Time
	mu    sync.Mutex
	part  []byte // the last line's start, until its newline
	all   strings.Builder
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			break
		}
		l.t.Logf("%6.1fs guest: %s", time.Since(l.start).Seconds(), l.part[:i])
		l.part = l.part[i+1:]
	}
	return len(p), nil
}

// String is everything written so far.
func (l *lineLogger) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

// requireDockerImage imports the Docker CI image (make
// debian-docker-image) as debian-docker:12 with hostImport and returns
// that state directory, build/test-state/docker, which the Docker tests
// share.
func requireDockerImage(t *testing.T) string {
	t.Helper()
	return hostImport(t, "docker", "debian-docker:12", testenv.DebianDockerImage(t))
}

// hostImport imports the root file system tarball (image import --rootfs)
// as name into the state directory build/test-state/KEY on the host, before
// testenv.RequireKVMAlone queues the test for a box of its own, and returns
// that directory. In the box, /tmp is memory and an import is slow (the
// build image's 440 MB took 58 s there against 5.5 s on the host): the
// box uses the host's import, read through its 9p mount of the repository,
// and imports only when it is missing (a box run without the host's). The
// same tarball gives the same image, so the host's import replaces its own
// earlier one.
func hostImport(t *testing.T, key, name, tarball string) string {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(root, "build", "test-state", key)
	bin := testenv.Binary(t)
	env := append(os.Environ(), "MICROVM_STATE_DIR="+state)
	importImage := func() {
		if err := os.MkdirAll(state, 0o700); err != nil {
			t.Fatal(err)
		}
		imp := exec.Command(bin, "image", "import", "--rootfs", "--name", name, tarball)
		imp.Env = env
		if out, err := imp.CombinedOutput(); err != nil {
			t.Fatalf("image import: %v\n%s", err, out)
		}
	}
	if !testenv.InBox() {
		importImage()
	}
	testenv.RequireKVMAlone(t, testenv.NeedLinux) // minutes in the box: a box of its own
	if testenv.InBox() {
		ls := exec.Command(bin, "image", "ls")
		ls.Env = env
		if out, err := ls.CombinedOutput(); err != nil || !strings.Contains(string(out), name) {
			importImage()
		}
	}
	return state
}

// linkImages makes state's image store the one in from (a hostImport
// directory), so that a test whose VMs' directories must live elsewhere
// (their Unix sockets, which the box's 9p mount of the repository refuses,
// go to a temporary directory) still boots the host's import.
func linkImages(t *testing.T, state, from string) {
	t.Helper()
	if err := os.Symlink(filepath.Join(from, "images"), filepath.Join(state, "images")); err != nil {
		t.Fatal(err)
	}
}
