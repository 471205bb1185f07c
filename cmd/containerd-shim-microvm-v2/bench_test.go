package main

import (
	"archive/tar"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/containerdshim"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/testing/testimage"
)

// EnvBench turns TestContainerdBench on: its value is where the JSON goes
// (make bench-containerd sets it). It is a measurement, not a test: it
// fails only when a container does not run.
const EnvBench = "MICROVM_BENCH_CONTAINERD"

// benchVariant is one way of running a container, compared in one run,
// interleaved: microvm's shim with each root file system method (the
// pod's annotation picks it) and runc (Debian's containerd ships
// io.containerd.runc.v2 and runc).
type benchVariant struct {
	Name    string
	Runtime string
	Args    []string // ctr run's extra flags
}

var benchVariants = []benchVariant{
	{"microvm-ext4", runtimeName, []string{"--annotation", containerdshim.RootfsAnnotation + "=" + string(containerdshim.RootfsExt4)}},
	{"microvm-9p", runtimeName, []string{"--annotation", containerdshim.RootfsAnnotation + "=" + string(containerdshim.Rootfs9p)}},
	{"runc", "io.containerd.runc.v2", nil},
}

// benchImage is an image the bench starts containers from, with the
// command that reads every byte of it (the read column: how fast the root
// file system method reads an image the guest has not seen).
type benchImage struct {
	Name string
	Ref  string
	Read string
}

// benchResult is one variant's figures on one image.
type benchResult struct {
	Variant    string    `json:"variant"`
	Runtime    string    `json:"runtime"`
	Image      string    `json:"image"`
	ImageMiB   float64   `json:"image_mib"`
	StartMS    []float64 `json:"start_ms"`       // ctr run -d: create and start, until running
	ExecMS     []float64 `json:"exec_ms"`        // ctr task exec of true, until its exit
	ReadMS     []float64 `json:"read_ms"`        // ctr task exec that reads every file of the image once
	StopMS     []float64 `json:"stop_ms"`        // kill, wait and delete
	HostRSSKiB []int64   `json:"host_rss_kib"`   // the shim and its children while the container sleeps
	StartP50   float64   `json:"start_p50_ms"`   //
	StartP99   float64   `json:"start_p99_ms"`   //
	ExecP50    float64   `json:"exec_p50_ms"`    //
	ExecP99    float64   `json:"exec_p99_ms"`    //
	ReadP50    float64   `json:"read_p50_ms"`    //
	RSSMedian  int64     `json:"rss_median_kib"` //
	// CreatePhasesP50 splits microvm's start (the shim's log, one line per
	// Create): snapshot mount, ext4 build, boot to agent, root bound or
	// copied, volumes, in ms.
	CreatePhasesP50 map[string]float64 `json:"create_phases_p50_ms,omitempty"`
}

// TestContainerdBench: container start (ctr run -d, until the task runs),
// exec latency, the time to read the whole image from inside the
// container, and host memory per container, for microvm with each root
// file system method and runc, on the small busybox image and on one with
// MICROVM_BENCH_BIG_MIB (default 64) MiB more in 64 files, in the same
// run, N rounds (MICROVM_BENCH_N, default 10); then microvm pods started 4
// at a time and kept running until the machine's memory is spent (or
// MICROVM_BENCH_PODS run), none failing before. Prints a table and writes
// JSON to $MICROVM_BENCH_CONTAINERD. Where this host's KVM cannot run
// Linux, make bench-containerd runs it in the nested-KVM box, and the
// table says so: those are TCG figures.
func TestContainerdBench(t *testing.T) {
	out := os.Getenv(EnvBench)
	if out == "" {
		t.Skipf("a benchmark: set $%s to a JSON path (make bench-containerd)", EnvBench)
	}
	n := envInt(t, "MICROVM_BENCH_N", 10)
	bigMiB := envInt(t, "MICROVM_BENCH_BIG_MIB", 64)
	e := startContainerd(t)
	e.importBusybox()
	images := []benchImage{{"busybox", testImage, "cat /bin/busybox /etc/passwd > /dev/null"}}
	if bigMiB > 0 {
		const big = "microvm.test/busybox-big:1"
		e.importImageWith(big, []string{"sh"}, padding(t, bigMiB, 64))
		images = append(images, benchImage{fmt.Sprintf("busybox+%dMiB", bigMiB), big, "cat /bin/busybox /etc/passwd /pad/* > /dev/null"})
	}
	imageMiB := map[string]float64{}
	for _, im := range images {
		imageMiB[im.Name] = e.imageMiB(im.Ref)
	}
	var list []*benchResult
	res := map[string]*benchResult{}
	key := func(v benchVariant, im benchImage) string { return v.Name + "/" + im.Name }
	for _, im := range images {
		for _, v := range benchVariants {
			r := &benchResult{Variant: v.Name, Runtime: v.Runtime, Image: im.Name, ImageMiB: imageMiB[im.Name]}
			res[key(v, im)] = r
			list = append(list, r)
		}
	}
	ids := map[string]string{} // container id -> result key, for the shim's phase lines
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for i := 0; i < n; i++ {
		for ii, im := range images {
			for _, v := range benchVariants {
				r := res[key(v, im)]
				id := fmt.Sprintf("b%d-%s-%d", i, v.Name, ii)
				ids[id] = key(v, im)
				t0 := time.Now()
				e.must(append(append([]string{"run", "-d", "--runtime", v.Runtime}, v.Args...), im.Ref, id, "sleep", "600")...)
				r.StartMS = append(r.StartMS, ms(time.Since(t0)))
				t0 = time.Now()
				e.must("task", "exec", "--exec-id", "x", id, "true")
				r.ExecMS = append(r.ExecMS, ms(time.Since(t0)))
				t0 = time.Now()
				e.must("task", "exec", "--exec-id", "r", id, "sh", "-c", im.Read)
				r.ReadMS = append(r.ReadMS, ms(time.Since(t0)))
				r.HostRSSKiB = append(r.HostRSSKiB, e.taskRSS(id))
				t0 = time.Now()
				e.must("task", "kill", "-s", "SIGKILL", id)
				e.waitStopped(id)
				e.must("task", "delete", id)
				r.StopMS = append(r.StopMS, ms(time.Since(t0)))
				e.must("containers", "delete", id)
				// Progress on stderr, as it happens: a run is long in the box.
				fmt.Fprintf(os.Stderr, "bench-containerd: round %d/%d %s on %s: start %.0f ms, exec %.0f ms, read %.0f ms, stop %.0f ms\n",
					i+1, n, v.Name, im.Name, r.StartMS[i], r.ExecMS[i], r.ReadMS[i], r.StopMS[i])
			}
		}
	}
	where := "natively"
	if testenv.InBox() {
		where = "in the nested-KVM box (QEMU TCG: not hardware speed)"
	}
	fmt.Printf("containerd: %d rounds, %s\n", n, where)
	fmt.Printf("%-14s %-26s %10s %10s %10s %10s %10s %10s %10s\n", "variant", "image", "start p50", "start p99",
		"exec p50", "exec p99", "read p50", "stop p50", "RSS (MiB)")
	for _, r := range list {
		r.StartP50, r.StartP99 = pct(r.StartMS, 50), pct(r.StartMS, 99)
		r.ExecP50, r.ExecP99 = pct(r.ExecMS, 50), pct(r.ExecMS, 99)
		r.ReadP50 = pct(r.ReadMS, 50)
		r.RSSMedian = medianInt(r.HostRSSKiB)
		fmt.Printf("%-14s %-26s %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %10.1f\n", r.Variant,
			fmt.Sprintf("%s (%.1f MiB)", r.Image, r.ImageMiB), r.StartP50, r.StartP99,
			r.ExecP50, r.ExecP99, r.ReadP50, pct(r.StopMS, 50), float64(r.RSSMedian)/1024)
	}
	phases := map[string][]map[string]float64{}
	for _, p := range e.createPhases() {
		if k, ok := ids[p.id]; ok {
			phases[k] = append(phases[k], p.ms)
		}
	}
	for _, r := range list {
		ps := phases[r.Variant+"/"+r.Image]
		if len(ps) == 0 {
			continue
		}
		split := map[string]float64{}
		for _, k := range []string{"mount_ms", "ext4_ms", "boot_ms", "copy_ms", "volumes_ms"} {
			var v []float64
			for _, p := range ps {
				v = append(v, p[k])
			}
			split[k] = pct(v, 50)
		}
		r.CreatePhasesP50 = split
		fmt.Printf("%s on %s: start p50 %.1f ms = snapshot mount %.1f + ext4 built %.1f + boot until the agent answers %.1f + root bound %.1f + volumes %.1f + the rest (ctr, containerd, the shim's start, Start) %.1f\n",
			r.Variant, r.Image, r.StartP50, split["mount_ms"], split["ext4_ms"], split["boot_ms"], split["copy_ms"], split["volumes_ms"],
			r.StartP50-split["mount_ms"]-split["ext4_ms"]-split["boot_ms"]-split["copy_ms"]-split["volumes_ms"])
	}
	d := e.density(envInt(t, "MICROVM_BENCH_PODS", 1000), 4)
	fmt.Printf("density (%s, ext4 roots): %d pods running at once, stopped by %s; %d failed; host RSS %.1f MiB per pod (%.1f MiB in all); MemAvailable %d -> %d MiB\n",
		runtimeName, d.Pods, d.StoppedBy, d.Failed, float64(d.RSSPerPodKiB)/1024, float64(d.RSSTotalKiB)/1024,
		d.MemAvailableBeforeKiB/1024, d.MemAvailableAfterKiB/1024)
	if d.Failed > 0 && d.StoppedBy != "memory" {
		t.Errorf("%d pods failed to start before memory ran out: %s", d.Failed, d.FirstError)
	}
	b, err := json.MarshalIndent(map[string]any{"where": where, "rounds": n, "results": list, "density": d}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// padding is a layer of files MiB MiB in all, spread over files files
// under /pad, of random bytes (nothing below can compress or share them).
func padding(t *testing.T, mib, files int) []testimage.Entry {
	t.Helper()
	entries := []testimage.Entry{{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: "pad/", Mode: 0o755}}}
	size := mib << 20 / files
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < files; i++ {
		body := make([]byte, size)
		for j := 0; j+8 <= len(body); j += 8 {
			binary.LittleEndian.PutUint64(body[j:], rng.Uint64())
		}
		entries = append(entries, testimage.Entry{
			Hdr:  tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("pad/%03d", i), Mode: 0o644},
			Body: body,
		})
	}
	return entries
}

// imageMiB is an image's size as ctr images ls reports it: its content,
// compressed (the padding is random, so about its size on disk).
func (e *ctrEnv) imageMiB(ref string) float64 {
	e.t.Helper()
	var mib float64
	for _, l := range strings.Split(e.must("images", "ls"), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && f[0] == ref {
			// REF TYPE DIGEST SIZE UNIT PLATFORMS LABELS; SIZE is the content's (compressed)
			v, err := strconv.ParseFloat(f[3], 64)
			if err == nil {
				switch f[4] {
				case "KiB":
					mib = v / 1024
				case "MiB":
					mib = v
				case "GiB":
					mib = v * 1024
				}
			}
		}
	}
	return mib
}

// densityResult is how many microvm pods run at once on this machine.
type densityResult struct {
	Pods                  int    `json:"pods"`       // running at once when the run stopped
	StoppedBy             string `json:"stopped_by"` // "memory", "limit" or "failure"
	Failed                int    `json:"failed"`     // starts that failed
	FirstError            string `json:"first_error,omitempty"`
	RSSTotalKiB           int64  `json:"rss_total_kib"`
	RSSPerPodKiB          int64  `json:"rss_per_pod_kib"`
	MemAvailableBeforeKiB int64  `json:"mem_available_before_kib"`
	MemAvailableAfterKiB  int64  `json:"mem_available_after_kib"`
}

// density starts microvm pods (one container each, sleeping) wave pods at
// a time, concurrently, and keeps them running, until limit run, a start
// fails, or the machine's MemAvailable is under twice what one pod costs
// (the memory is spent: one more pod could push the host into reclaim or
// the OOM killer, which measures the host, not microvm). Then it stops
// them all.
func (e *ctrEnv) density(limit, wave int) densityResult {
	t := e.t
	d := densityResult{MemAvailableBeforeKiB: memAvailableKiB(), StoppedBy: "limit"}
	var ids []string
	defer func() {
		for _, id := range ids {
			e.run("task", "kill", "-s", "SIGKILL", id)
		}
		for _, id := range ids {
			e.waitStopped(id)
			e.run("task", "delete", id)
			e.run("containers", "delete", id)
		}
	}()
	perPod := int64(0)
	for len(ids) < limit {
		if perPod > 0 && memAvailableKiB() < 2*perPod {
			d.StoppedBy = "memory"
			break
		}
		type started struct {
			id   string
			code int
			err  string
		}
		n := min(wave, limit-len(ids))
		res := make(chan started, n)
		for j := 0; j < n; j++ {
			id := fmt.Sprintf("d%d", len(ids)+j)
			go func() {
				_, errOut, code := e.run("run", "-d", "--runtime", runtimeName, testImage, id, "sleep", "3600")
				res <- started{id, code, errOut}
			}()
		}
		for j := 0; j < n; j++ {
			r := <-res
			if r.code != 0 {
				d.Failed++
				if d.FirstError == "" {
					d.FirstError = strings.TrimSpace(r.err)
				}
				e.run("containers", "delete", r.id)
				continue
			}
			ids = append(ids, r.id)
		}
		if d.Failed > 0 {
			d.StoppedBy = "failure"
			if memAvailableKiB() < 2*max(perPod, 1) {
				d.StoppedBy = "memory"
			}
			break
		}
		d.RSSTotalKiB = 0
		for _, id := range ids {
			d.RSSTotalKiB += e.taskRSS(id)
		}
		perPod = d.RSSTotalKiB / int64(len(ids))
		t.Logf("density: %d pods, %d MiB host RSS, MemAvailable %d MiB", len(ids), d.RSSTotalKiB/1024, memAvailableKiB()/1024)
	}
	d.Pods = len(ids)
	d.RSSPerPodKiB = perPod
	d.MemAvailableAfterKiB = memAvailableKiB()
	return d
}

// memAvailableKiB is the machine's MemAvailable.
func memAvailableKiB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

// envInt reads a positive integer from the environment, def when unset.
func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// taskRSS is the host memory a running container costs: the resident
// set of its shim and of everything below the shim (runc's container
// processes; microvm's VM is inside the shim), in KiB.
func (e *ctrEnv) taskRSS(id string) int64 {
	e.t.Helper()
	shim := e.shimOf(id)
	if shim == 0 {
		e.t.Fatalf("no shim process found for %s", id)
	}
	var total int64
	for _, pid := range append([]int{shim}, descendants(shim)...) {
		total += rssKiB(pid)
	}
	return total
}

// shimOf finds the shim process of container id: the one whose command
// line names it after -id.
func (e *ctrEnv) shimOf(id string) int {
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.Contains(args[0], "containerd-shim") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-id" && args[i+1] == id {
				return pid
			}
		}
	}
	return 0
}

// descendants lists pid's children, grandchildren, ...
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		p, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; split after ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			if pp, err := strconv.Atoi(f[1]); err == nil {
				children[pp] = append(children[pp], p)
			}
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, children[p]...)
		queue = append(queue, children[p]...)
	}
	return out
}

// rssKiB is a process's VmRSS.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

// waitStopped waits until the task is no longer running.
func (e *ctrEnv) waitStopped(id string) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		l := e.must("task", "ls")
		running := false
		for _, line := range strings.Split(l, "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == id && f[2] != "STOPPED" {
				running = true
			}
		}
		if !running {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("task %s did not stop within a minute", id)
}

// pct is the p-th percentile of v (nearest rank).
func pct(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := (p*len(s)+99)/100 - 1
	if i < 0 {
		i = 0
	}
	return s[i]
}

func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// createPhase is one Create's phases, from the shim's log line.
type createPhase struct {
	id string
	ms map[string]float64
}

// createPhases reads the shim's "microvm create phases" lines from
// containerd's log.
func (e *ctrEnv) createPhases() []createPhase {
	b, err := os.ReadFile(e.log)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []createPhase
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `msg="microvm create phases"`) {
			continue
		}
		p := createPhase{ms: map[string]float64{}}
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			switch {
			case !ok:
			case k == "id":
				p.id = strings.Trim(v, `"`)
			case strings.HasSuffix(k, "_ms"):
				if x, err := strconv.ParseFloat(v, 64); err == nil {
					p.ms[k] = x
				}
			}
		}
		out = append(out, p)
	}
	return out
}
