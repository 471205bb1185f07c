// Command ci-bench measures what a CI job pays for running in a microVM
// through `microvm ci gitlab` (docs/ci.md), against the same job's scripts
// run directly on this host with bash, in one run:
//
//	ci-bench -microvm BIN -kernel K -agent A -image TAR [-jobs 3] [-json F]
//
// The job is the one TestGitLabExecutor runs: clone a repository over
// HTTP from a server on the loopback, build and test a small C program with
// gcc, archive the cache, upload an artefact. Each of -jobs jobs is timed
// stage by stage (prepare, the run stages, cleanup) and whole; the host
// runs the same scripts with /builds, /cache and the server's address
// mapped to a temporary directory and 127.0.0.1. The image (TAR, a root
// file system tarball with bash, git, gcc, make and curl: make
// debian-build-image) is imported once, timed apart. Then the same jobs
// run with prepare --warm-pool 1 (docs/ci.md): after a first job whose
// cleanup boots the slot's next VM, each job's prepare takes a warm VM;
// the table shows prepare, cleanup and the whole job that way too, and how
// long the background boot took from cleanup until the warm VM answered.
//
// Linux cannot boot on a PVM-backed /dev/kvm, and some hosts have none:
// make bench-ci runs it in the nested-KVM box there, at the speed of QEMU
// TCG: read the overheads as TCG's.
//
// Exit status: 0 when every job ran, 1 when one failed (the message says
// which stage), 2 for a bad command line.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

const prog = "ci-bench"

// stages are the job's sub-stages, in GitLab's order, with their scripts;
// $BUILDS, $CACHE and $GITHOST are set by the side that runs them.
var stages = []struct{ name, script string }{
	{"prepare_script", "echo on $(uname -n)"},
	{"get_sources", "rm -rf $BUILDS/proj && git clone -q http://$GITHOST/repo.git $BUILDS/proj"},
	{"restore_cache", "cat $CACHE/counter 2>/dev/null || echo 0"},
	{"step_script", "cd $BUILDS/proj && make -s hello test"},
	{"archive_cache", "n=$(cat $CACHE/counter 2>/dev/null || echo 0); echo $((n+1)) > $CACHE/counter; sync"},
	{"upload_artifacts_on_success", "cd $BUILDS/proj && tar czf $BUILDS/art.tgz hello && curl -fsS -T $BUILDS/art.tgz http://$GITHOST/upload/art.tgz"},
}

func main() {
	bin := flag.String("microvm", "bin/microvm", "the microvm binary")
	kernel := flag.String("kernel", "build/kernel/bzImage", "guest kernel")
	agent := flag.String("agent", "bin/microvm-agent", "guest agent")
	imageTar := flag.String("image", "build/images/debian-12-build.tar", "the job image: a root file system tarball")
	jobs := flag.Int("jobs", 3, "jobs to time")
	jsonOut := flag.String("json", "", "write the results as JSON here")
	flag.Parse()
	if *jobs < 1 {
		fmt.Fprintf(os.Stderr, "%s: -jobs must be at least 1\n", prog)
		os.Exit(2)
	}
	if err := run(*bin, *kernel, *agent, *imageTar, *jobs, *jsonOut); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(1)
	}
}

func run(bin, kernel, agent, imageTar string, jobs int, jsonOut string) error {
	state, err := os.MkdirTemp("", "ci-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	port, stop, err := serveRepo(state)
	if err != nil {
		return err
	}
	defer stop()
	env := append(os.Environ(), "MICROVM_STATE_DIR="+filepath.Join(state, "microvm"),
		"BUILD_FAILURE_EXIT_CODE=11", "SYSTEM_FAILURE_EXIT_CODE=12",
		"CUSTOM_ENV_CI_RUNNER_ID=1", "CUSTOM_ENV_CI_JOB_IMAGE=ci-bench:1", "CUSTOM_ENV_CI_PROJECT_PATH_SLUG=bench")
	start := time.Now()
	if out, err := command(env, bin, "image", "import", "--rootfs", "--name", "ci-bench:1", imageTar); err != nil {
		return fmt.Errorf("image import: %v\n%s", err, out)
	}
	importTime := time.Since(start)

	scripts := filepath.Join(state, "scripts")
	if err := os.MkdirAll(scripts, 0o755); err != nil {
		return err
	}
	for _, st := range stages {
		p := filepath.Join(scripts, st.name+".sh")
		body := fmt.Sprintf("#!/usr/bin/env bash\nset -eo pipefail\nBUILDS=/builds CACHE=/cache GITHOST=host.microvm.internal:%d\n%s\n", port, st.script)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			return err
		}
	}
	prepare := []string{"ci", "gitlab", "prepare", "--kernel", kernel, "--agent", agent,
		"--cpus", "1", "--memory", "512M", "--cache-size", "64M",
		// The runner's own word for the project (no job response here), and
		// the job clones from a server on this host's loopback.
		"--cache-key", "bench", "--net", "user,host-loopback"}
	vmTimes := map[string][]time.Duration{}
	hostTimes := map[string][]time.Duration{}
	for j := 1; j <= jobs; j++ {
		jenv := append(slices.Clone(env), "CUSTOM_ENV_CI_JOB_ID="+strconv.Itoa(j),
			"CUSTOM_ENV_CI_JOB_TOKEN=bench-token-"+strconv.Itoa(j))
		fmt.Fprintf(os.Stderr, "%s: job %d of %d in a VM\n", prog, j, jobs)
		if err := vmJob(jenv, bin, prepare, scripts, vmTimes, ""); err != nil {
			return fmt.Errorf("job %d: %w", j, err)
		}

		// The same scripts on the host.
		hostDir := filepath.Join(state, "host")
		for _, d := range []string{"builds", "cache"} {
			if err := os.MkdirAll(filepath.Join(hostDir, d), 0o755); err != nil {
				return err
			}
		}
		total := time.Now()
		for _, s := range stages {
			body := fmt.Sprintf("set -eo pipefail\nBUILDS=%s CACHE=%s GITHOST=127.0.0.1:%d\n%s\n",
				filepath.Join(hostDir, "builds"), filepath.Join(hostDir, "cache"), port, s.script)
			t := time.Now()
			if out, err := command(os.Environ(), "bash", "-c", body); err != nil {
				return fmt.Errorf("host job %d: %s: %v\n%s", j, s.name, err, out)
			}
			hostTimes[s.name] = append(hostTimes[s.name], time.Since(t))
		}
		hostTimes["job"] = append(hostTimes["job"], time.Since(total))
	}

	// The warm pool: job 100 boots the slot's first VM (not counted); its
	// cleanup boots the next one, and each counted job waits until that
	// one answers (a job arriving later than the boot takes) and takes it.
	warm := append(slices.Clone(prepare), "--warm-pool", "1")
	warmEnv := append(slices.Clone(env), "CUSTOM_ENV_CI_CONCURRENT_PROJECT_ID=9")
	defer command(warmEnv, bin, "ci", "gitlab", "drain")
	for j := 100; j <= 100+jobs; j++ {
		jenv := append(slices.Clone(warmEnv), "CUSTOM_ENV_CI_JOB_ID="+strconv.Itoa(j))
		times := vmTimes
		if j == 100 {
			times = map[string][]time.Duration{}
		} else {
			fmt.Fprintf(os.Stderr, "%s: job %d of %d with the warm pool\n", prog, j-100, jobs)
		}
		if err := vmJob(jenv, bin, warm, scripts, times, " (warm pool)"); err != nil {
			return fmt.Errorf("warm-pool job %d: %w", j, err)
		}
		t := time.Now()
		if err := waitWarm(warmEnv, bin, "warm-bench-9", 5*time.Minute); err != nil {
			return err
		}
		times["warm VM boot, after cleanup (background)"] = append(times["warm VM boot, after cleanup (background)"], time.Since(t))
	}

	fmt.Printf("one CI job (git clone over HTTP, gcc build and test, cache, artefact upload), %d jobs, medians\n\n", jobs)
	fmt.Printf("%-42s %12s %12s %14s\n", "stage", "host ms", "microvm ms", "overhead ms")
	rows := append([]string{"prepare"}, func() []string {
		var n []string
		for _, s := range stages {
			n = append(n, s.name)
		}
		return n
	}()...)
	rows = append(rows, "cleanup", "job", "prepare (warm pool)", "cleanup (warm pool)", "job (warm pool)",
		"warm VM boot, after cleanup (background)")
	type row struct {
		Stage     string  `json:"stage"`
		HostMS    float64 `json:"host_ms"`
		MicrovmMS float64 `json:"microvm_ms"`
	}
	var out []row
	for _, r := range rows {
		h, v := benchenv.MS(benchenv.MedianDuration(hostTimes[r])), benchenv.MS(benchenv.MedianDuration(vmTimes[r]))
		if len(hostTimes[r]) == 0 {
			fmt.Printf("%-42s %12s %12.1f %14s\n", r, "-", v, "-")
		} else {
			fmt.Printf("%-42s %12.1f %12.1f %14.1f\n", r, h, v, v-h)
		}
		out = append(out, row{r, h, v})
	}
	fmt.Printf("\nimage import (once, %s): %.1f s\n", filepath.Base(imageTar), importTime.Seconds())
	if jsonOut != "" {
		return benchenv.WriteJSON(jsonOut, map[string]any{"host": benchenv.HostInfo(), "jobs": jobs,
			"import_ms": benchenv.MS(importTime), "stages": out})
	}
	return nil
}

// vmJob runs one job through the executor: prepare (the argv given), the
// stages' scripts from dir, cleanup, each timed into times under its name
// plus suffix for prepare, cleanup and the whole job.
func vmJob(env []string, bin string, prepare []string, dir string, times map[string][]time.Duration, suffix string) error {
	fmt.Fprintf(os.Stderr, "%s:   prepare\n", prog)
	total := time.Now()
	t := time.Now()
	if out, err := command(env, bin, prepare...); err != nil {
		return fmt.Errorf("prepare: %v\n%s", err, out)
	}
	times["prepare"+suffix] = append(times["prepare"+suffix], time.Since(t))
	for _, s := range stages {
		fmt.Fprintf(os.Stderr, "%s:   %s\n", prog, s.name)
		t := time.Now()
		if out, err := command(env, bin, "ci", "gitlab", "run", filepath.Join(dir, s.name+".sh"), s.name); err != nil {
			command(env, bin, "ci", "gitlab", "cleanup")
			return fmt.Errorf("%s: %v\n%s", s.name, err, out)
		}
		if suffix == "" {
			times[s.name] = append(times[s.name], time.Since(t))
		}
	}
	fmt.Fprintf(os.Stderr, "%s:   cleanup\n", prog)
	t = time.Now()
	if out, err := command(env, bin, "ci", "gitlab", "cleanup"); err != nil {
		return fmt.Errorf("cleanup: %v\n%s", err, out)
	}
	times["cleanup"+suffix] = append(times["cleanup"+suffix], time.Since(t))
	times["job"+suffix] = append(times["job"+suffix], time.Since(total))
	return nil
}

// waitWarm waits until the named warm VM's agent runs a command.
func waitWarm(env []string, bin, name string, limit time.Duration) error {
	for end := time.Now().Add(limit); ; time.Sleep(100 * time.Millisecond) {
		out, err := command(env, bin, "exec", "--vm", name, "--", "true")
		if err == nil {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("warm VM %s did not answer within %v: %v\n%s", name, limit, err, out)
		}
	}
}

// serveRepo makes a git repository of a small C program, serves it (git's
// dumb HTTP) and takes uploads on the loopback; it returns the port.
func serveRepo(dir string) (int, func(), error) {
	work := filepath.Join(dir, "work")
	bare := filepath.Join(dir, "repo.git")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return 0, nil, err
	}
	files := map[string]string{
		"hello.c":  "#include <stdio.h>\nint main(void) { puts(\"hello from the job\"); return 0; }\n",
		"Makefile": "hello: hello.c\n\tgcc -O2 -o hello hello.c\ntest: hello\n\t./hello | grep -q 'hello from the job'\n",
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(work, n), []byte(b), 0o644); err != nil {
			return 0, nil, err
		}
	}
	for _, args := range [][]string{
		{"-C", work, "init", "-q", "-b", "main"},
		{"-C", work, "add", "."},
		{"-C", work, "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "commit", "-q", "-m", "bench"},
		{"clone", "-q", "--bare", work, bare},
		{"-C", bare, "update-server-info"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			return 0, nil, fmt.Errorf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/repo.git/", http.StripPrefix("/repo.git/", http.FileServer(http.Dir(bare))))
	mux.HandleFunc("/upload/", func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	return ln.Addr().(*net.TCPAddr).Port, func() { srv.Close() }, nil
}

// commandTimeout bounds one executor call or host stage: a hung one
// fails the benchmark instead of stalling it.
const commandTimeout = 10 * time.Minute

func command(env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
