package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/testing/testimage"
)

// runs is how many `docker run --rm` each exec times (the median is
// reported).
const runs = 3

// daemonUp is the guest's first line: `docker info` answered.
const daemonUp = "daemon up"

// guestScript is each exec's command. Its lines "BENCH KEY=NANOSECONDS"
// are the guest's timings.
var guestScript = strings.Join([]string{
	"set -e",
	"docker info >/dev/null",
	"echo '" + daemonUp + "'",
	"cd /run/microvm-shares/ctx",
	"t0=$(date +%s%N)",
	"docker build -t bb -f Dockerfile.base .",
	"docker build -t app -f Dockerfile.app .",
	"t1=$(date +%s%N)",
	`echo "BENCH build=$((t1-t0))"`,
	fmt.Sprintf("for i in $(seq %d); do", runs),
	"  t0=$(date +%s%N); docker run --rm bb true; t1=$(date +%s%N)",
	`  echo "BENCH run=$((t1-t0))"`,
	"done",
	"docker run --rm app",
}, "\n")

// execResult is one exec's figures.
type execResult struct {
	// DaemonUp is from the exec's start (this side) to the guest's first
	// line, printed once `docker info` answered.
	DaemonUp time.Duration
	// Build is both docker builds, in the guest.
	Build time.Duration
	// Run is the median `docker run --rm bb true`, in the guest.
	Run time.Duration
	// Total is the whole exec, the cache's commit included.
	Total time.Duration
	// UsedCache: the build's output says "Using cache".
	UsedCache bool
}

func vmMain(args []string) error {
	fs := flag.NewFlagSet(prog+" vm", flag.ContinueOnError)
	state := fs.String("state", "build/bench/docker-state", "a directory for microvm's state (the imported image, the caches)")
	bin := fs.String("microvm", "bin/microvm", "the microvm binary")
	kernel := fs.String("kernel", "build/kernel/bzImage", "guest kernel")
	agent := fs.String("agent", "bin/microvm-agent", "guest agent")
	imageTar := fs.String("image", "build/images/debian-12-docker.tar", "the Docker image: a root file system tarball (make debian-docker-image)")
	memory := fs.String("memory", "1536M", "the VM's memory")
	cpus := fs.Int("cpus", 2, "the VM's vCPUs")
	dockerTimeout := fs.Duration("docker-timeout", 8*time.Minute, "exec --docker-timeout: how long dockerd may take to come up")
	jsonOut := fs.String("json", "", "write the results as JSON here")
	hostCheck := fs.Bool("host-check", false, "only say whether Linux guests can boot on this host's KVM: exit 0 if so, 1 if not")
	force := fs.Bool("force", false, "run even where this host's KVM cannot boot Linux")
	importOnly := fs.Bool("import-only", false, "only import the image into -state where it is not there yet, and exit (make bench-docker does it on this host, before the box)")
	parse(fs, args)
	if !*importOnly {
		benchenv.GateLinuxKVM(prog, *hostCheck, *force, "the figures show that it works, not its speed")
	}

	if _, err := exec.LookPath("busybox"); err != nil {
		return fmt.Errorf("busybox (Debian's busybox-static) for the image built in the VM: %w", err)
	}
	if err := os.MkdirAll(*state, 0o755); err != nil {
		return err
	}
	env := append(os.Environ(), "MICROVM_STATE_DIR="+*state)
	importTime, err := importImage(env, *bin, *imageTar)
	if err != nil {
		return err
	}
	if *importOnly {
		return nil
	}
	// Each run starts on an empty cache store. In the box the repository
	// is a 9p mount that reads sparse holes as data: the store goes to a
	// directory of the box's own (its /tmp), where a copy stays sparse.
	inBox := os.Getenv(testenv.EnvInBox) == "1"
	caches := filepath.Join(*state, "caches")
	if err := os.RemoveAll(caches); err != nil {
		return err
	}
	defer os.RemoveAll(caches)
	if inBox {
		tmp, err := os.MkdirTemp("", "docker-bench-caches-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := os.Symlink(tmp, caches); err != nil {
			return err
		}
	} else if err := os.Mkdir(caches, 0o700); err != nil {
		return err
	}
	ctxDir, err := os.MkdirTemp("", "docker-bench-ctx-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(ctxDir)
	// The small project built in the VM (testimage.WriteDockerContext).
	if err := testimage.WriteDockerContext(ctxDir, ""); err != nil {
		return err
	}

	argv := []string{"exec", "--kernel", *kernel, "--agent", *agent, "--image", imageName,
		"--memory", *memory, "--cpus", strconv.Itoa(*cpus), "--net", "user",
		"--docker", "--docker-timeout", dockerTimeout.String(), "--cache", "dock=/var/lib/docker",
		"--share", "tag=ctx,path=" + ctxDir, "--timeout", "30m", "--", "sh", "-c", guestScript}
	var res [2]execResult
	for i, what := range []string{"empty cache", "cache holding the first exec's data root"} {
		fmt.Fprintf(os.Stderr, "%s: exec %d of 2, %s\n", prog, i+1, what)
		r, err := timeExec(env, *bin, argv)
		if err != nil {
			return fmt.Errorf("exec %d (%s): %w", i+1, what, err)
		}
		res[i] = r
	}
	if !res[1].UsedCache {
		return fmt.Errorf("the second exec's docker build did not report \"Using cache\": its data root was not kept")
	}

	kvm := "this host's KVM (" + testenv.Host().String() + ")"
	if inBox {
		kvm = "the nested-KVM box (QEMU TCG L1: the figures show that it works, not its speed)"
	}
	report(os.Stdout, res, kvm, *memory, *cpus)
	if importTime > 0 {
		fmt.Printf("\nimage import (once, %s): %.1f s\n", filepath.Base(*imageTar), importTime.Seconds())
	}
	if *jsonOut == "" {
		return nil
	}
	type row struct {
		Exec        string  `json:"exec"`
		DaemonUpMS  float64 `json:"daemon_up_ms"`
		BuildMS     float64 `json:"build_ms"`
		RunMS       float64 `json:"run_ms"`
		ExecTotalMS float64 `json:"exec_total_ms"`
		UsedCache   bool    `json:"build_used_cache"`
	}
	var rows []row
	for i, name := range []string{"empty cache", "cached"} {
		r := res[i]
		rows = append(rows, row{name, benchenv.MS(r.DaemonUp), benchenv.MS(r.Build), benchenv.MS(r.Run), benchenv.MS(r.Total), r.UsedCache})
	}
	// The import's time, null where the image was imported already.
	imported := benchenv.Num(math.NaN())
	if importTime > 0 {
		imported = benchenv.Num(benchenv.MS(importTime))
	}
	return benchenv.WriteJSON(*jsonOut, map[string]any{
		"host": benchenv.HostInfo(), "kvm": kvm, "in_box": inBox, "memory": *memory, "cpus": *cpus,
		"import_ms": imported, "execs": rows,
	})
}

// imageName is the Docker image's name in microvm's image store.
const imageName = "docker-bench:1"

// importImage imports tar as imageName unless the store (env's
// MICROVM_STATE_DIR) has it; it returns how long the import took, 0 when
// there was none.
func importImage(env []string, bin, tar string) (time.Duration, error) {
	ls := exec.Command(bin, "image", "ls")
	ls.Env = env
	out, err := ls.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("image ls: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == imageName {
			fmt.Fprintf(os.Stderr, "%s: %s is imported already\n", prog, imageName)
			return 0, nil
		}
	}
	fmt.Fprintf(os.Stderr, "%s: importing %s\n", prog, tar)
	t := time.Now()
	imp := exec.Command(bin, "image", "import", "--rootfs", "--name", imageName, tar)
	imp.Env = env
	if out, err := imp.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("image import: %v\n%s", err, out)
	}
	d := time.Since(t)
	fmt.Fprintf(os.Stderr, "%s: imported in %.1f s\n", prog, d.Seconds())
	return d, nil
}

// report prints the table: one column per exec.
func report(w *os.File, res [2]execResult, kvm, memory string, cpus int) {
	fmt.Fprintf(w, "Docker in a microVM: exec --docker, data root on a --cache (%s, %d vCPUs), on %s\n\n", memory, cpus, kvm)
	fmt.Fprintf(w, "%-48s %14s %14s\n", "", "empty cache", "cached")
	line := func(name string, f func(execResult) string) {
		fmt.Fprintf(w, "%-48s %14s %14s\n", name, f(res[0]), f(res[1]))
	}
	sec := func(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
	line("VM start to docker info answering (host)", func(r execResult) string { return sec(r.DaemonUp) })
	line("docker build, busybox + two-stage app (guest)", func(r execResult) string { return sec(r.Build) })
	line(fmt.Sprintf("docker run --rm, median of %d (guest)", runs), func(r execResult) string {
		return fmt.Sprintf("%.0f ms", benchenv.MS(r.Run))
	})
	line("whole exec, cache commit included (host)", func(r execResult) string { return sec(r.Total) })
	line("docker build reported \"Using cache\"", func(r execResult) string {
		if r.UsedCache {
			return "yes"
		}
		return "no"
	})
}

// timeExec runs one exec and reads its figures from its output: the
// guest's command prints daemonUp first.
func timeExec(env []string, bin string, argv []string) (execResult, error) {
	var r execResult
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Env = env
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return r, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	var out strings.Builder
	var runTimes []time.Duration
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l := sc.Text()
		if l == daemonUp && r.DaemonUp == 0 {
			r.DaemonUp = time.Since(start)
		}
		out.WriteString(l + "\n")
		if strings.Contains(l, "Using cache") {
			r.UsedCache = true
		}
		kv, ok := strings.CutPrefix(l, "BENCH ")
		if !ok {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		ns, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "build":
			r.Build = time.Duration(ns)
		case "run":
			runTimes = append(runTimes, time.Duration(ns))
		}
	}
	err = cmd.Wait()
	r.Total = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("%v\nstdout:\n%s\nstderr:\n%s", err, &out, &stderr)
	}
	if r.DaemonUp == 0 {
		return r, fmt.Errorf("the guest never printed %q\nstdout:\n%s\nstderr:\n%s", daemonUp, &out, &stderr)
	}
	if r.Build == 0 || len(runTimes) != runs {
		return r, fmt.Errorf("the guest's timings are missing\nstdout:\n%s\nstderr:\n%s", &out, &stderr)
	}
	if !strings.Contains(out.String(), "built-in-stage-one\n"+testimage.HelloContext) {
		return r, fmt.Errorf("docker run of the built image printed the wrong thing\nstdout:\n%s", &out)
	}
	r.Run = benchenv.MedianDuration(runTimes)
	fmt.Fprintf(os.Stderr, "%s:   daemon up after %.1f s, exec done after %.1f s\n", prog, r.DaemonUp.Seconds(), r.Total.Seconds())
	return r, nil
}
