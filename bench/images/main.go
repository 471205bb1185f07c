// Command images-bench measures what an OCI image costs a VM, in two steps
// that may run on different machines (make bench-images runs the first on
// this host and the second where Linux boots: here, or the nested-KVM box):
//
//	images-bench prepare -state DIR [-json F]
//	    pushes two images to a registry in this process (loopback only): a
//	    small one (a static busybox and 16 MiB of random bytes) and a large
//	    one (the same and 1 GiB), pulls each into a fresh image store in DIR
//	    and times the download and the conversion to ext4 apart (the store's
//	    progress phases);
//	images-bench boot -state DIR -microvm BIN -kernel K -agent A [-n 3] [-execs 10] [-json F]
//	    for each image: `microvm run --name --detach --image` (returns when
//	    the agent answers: VM start to agent ready), -n times; then in one
//	    such VM `microvm exec --vm -- true` -execs times against `microvm
//	    exec --image -- true` (a fresh VM each) -n times.
//
// The question is whether starting a VM grows with the image's size (the
// goal is that it does not: the image is a shared read-only disk, the
// writable layer a tmpfs); the 16 MiB/1 GiB ratios answer it in one run. In
// the box, times are QEMU TCG's: read the ratios.
//
// Exit status: 0 when everything was measured, 1 when a step failed (the
// message says which), 2 for a bad command line.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/microvm/microvm/bench/internal/benchenv"
	"github.com/microvm/microvm/internal/image"
)

const prog = "images-bench"

// sizes are the images measured: a name and the random payload beside
// busybox.
var sizes = []struct {
	name  string
	bytes int64
}{{"16MiB", 16 << 20}, {"1GiB", 1 << 30}}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "prepare":
		err = prepare(os.Args[2:])
	case "boot":
		err = boot(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s prepare -state DIR [-json F] | boot -state DIR -microvm BIN -kernel K -agent A [-n N] [-execs N] [-json F]\n", prog)
	os.Exit(2)
}

// prepareResult is one image's pull, in the JSON.
type prepareResult struct {
	Image      string        `json:"image"`
	Payload    int64         `json:"payload_bytes"`
	Ext4Bytes  int64         `json:"ext4_bytes"`
	Download   time.Duration `json:"download_ns"`
	Convert    time.Duration `json:"convert_ns"`
	Total      time.Duration `json:"total_ns"`
	LayerBytes int64         `json:"compressed_bytes"`
}

func prepare(args []string) error {
	fs := flag.NewFlagSet("prepare", flag.ExitOnError)
	state := fs.String("state", "", "image store directory to fill (removed first)")
	jsonOut := fs.String("json", "", "write the results as JSON here")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox for the images")
	fs.Parse(args)
	if *state == "" {
		usage()
	}
	bb, err := os.ReadFile(*busybox)
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	if err := os.RemoveAll(*state); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(discardLogger()))}
	go srv.Serve(ln)
	defer srv.Close()
	store, err := image.Open(filepath.Join(*state, "images"))
	if err != nil {
		return err
	}
	var results []prepareResult
	fmt.Printf("%-6s %10s %10s %16s %8s %8s\n", "image", "layers MiB", "ext4 MiB", "fetch+unpack s", "ext4 s", "total s")
	for _, sz := range sizes {
		ref := fmt.Sprintf("%s/bench/%s:1", ln.Addr(), strings.ToLower(sz.name))
		fmt.Fprintf(os.Stderr, "%s: building and pushing the %s image\n", prog, sz.name)
		layers, err := push(ref, bb, sz.bytes)
		if err != nil {
			return fmt.Errorf("%s image: %w", sz.name, err)
		}
		var mu sync.Mutex
		phaseAt := map[string]time.Time{}
		start := time.Now()
		im, err := store.Pull(context.Background(), ref, image.Options{Progress: func(p image.Progress) {
			mu.Lock()
			if _, ok := phaseAt[p.Phase]; !ok {
				phaseAt[p.Phase] = time.Now()
			}
			mu.Unlock()
		}})
		if err != nil {
			return fmt.Errorf("pull %s: %w", ref, err)
		}
		end := time.Now()
		mu.Lock()
		conv := phaseAt[image.PhaseConvert]
		mu.Unlock()
		if conv.IsZero() {
			conv = end
		}
		r := prepareResult{Image: sz.name, Payload: sz.bytes, Ext4Bytes: im.Size, LayerBytes: layers,
			Download: conv.Sub(start), Convert: end.Sub(conv), Total: end.Sub(start)}
		results = append(results, r)
		fmt.Printf("%-6s %10.1f %10.1f %16.2f %8.2f %8.2f\n", sz.name, float64(layers)/(1<<20), float64(im.Size)/(1<<20),
			r.Download.Seconds(), r.Convert.Seconds(), r.Total.Seconds())
		if err := os.WriteFile(filepath.Join(*state, sz.name+".ref"), []byte(ref), 0o644); err != nil {
			return err
		}
	}
	fmt.Println("(fetch+unpack: from a registry on this host's loopback (gzip at BestSpeed), verified, flattened and unpacked as it streams; ext4: mke2fs -d and debugfs)")
	if *jsonOut != "" {
		return benchenv.WriteJSON(*jsonOut, map[string]any{"host": benchenv.HostInfo(), "prepare": results})
	}
	return nil
}

// push builds the image (busybox with its sh link, and payload random
// bytes in 64 MiB files) and pushes it to ref; it returns the compressed
// size of its layers.
func push(ref string, bb []byte, payload int64) (int64, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	add := func(h *tar.Header, body []byte) error {
		h.ModTime = now
		h.Size = int64(len(body))
		if h.Typeflag == tar.TypeSymlink || h.Typeflag == tar.TypeDir {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "data/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
		{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "busybox", Mode: 0o777},
		{Typeflag: tar.TypeSymlink, Name: "bin/true", Linkname: "busybox", Mode: 0o777},
	} {
		if err := add(h, nil); err != nil {
			return 0, err
		}
	}
	if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, bb); err != nil {
		return 0, err
	}
	chunk := make([]byte, 64<<20)
	for i := int64(0); i*int64(len(chunk)) < payload; i++ {
		n := min(int64(len(chunk)), payload-i*int64(len(chunk)))
		rand.Read(chunk[:n])
		if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("data/blob%03d", i), Mode: 0o644}, chunk[:n]); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return 0, err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return 0, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return 0, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin"}
	cf.Config.Cmd = []string{"sh"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return 0, err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return 0, err
	}
	if err := remote.Write(r, img); err != nil {
		return 0, err
	}
	size, err := l.Size()
	return size, err
}

// bootResult is one image's VM figures, in the JSON.
type bootResult struct {
	Image     string          `json:"image"`
	Ready     []time.Duration `json:"run_detach_to_agent_ready_ns"`
	ExecVM    []time.Duration `json:"exec_vm_true_ns"`
	ExecFresh []time.Duration `json:"exec_image_true_ns"`
}

func boot(args []string) error {
	fs := flag.NewFlagSet("boot", flag.ExitOnError)
	state := fs.String("state", "", "the image store prepare filled")
	bin := fs.String("microvm", "bin/microvm", "the microvm binary")
	kernel := fs.String("kernel", "build/kernel/bzImage", "guest kernel")
	agent := fs.String("agent", "bin/microvm-agent", "guest agent")
	n := fs.Int("n", 5, "VM starts per image, and fresh-VM execs")
	execs := fs.Int("execs", 10, "exec --vm calls per image")
	jsonOut := fs.String("json", "", "write the results as JSON here")
	fs.Parse(args)
	if *state == "" {
		usage()
	}
	// The VMs' state (Unix sockets among it) lives in a directory of its
	// own on a local file system: in the nested-KVM box the repository is
	// a shared mount where a socket cannot be bound. Its images are the
	// prepared store's.
	vmState, err := os.MkdirTemp("", "images-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(vmState)
	abs, err := filepath.Abs(filepath.Join(*state, "images"))
	if err != nil {
		return err
	}
	if err := os.Symlink(abs, filepath.Join(vmState, "images")); err != nil {
		return err
	}
	env := append(os.Environ(), "MICROVM_STATE_DIR="+vmState)
	run := func(args ...string) (time.Duration, error) {
		cmd := exec.Command(*bin, args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		d := time.Since(start)
		if err != nil {
			return d, fmt.Errorf("microvm %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return d, nil
	}
	vmFlags := []string{"--kernel", *kernel, "--agent", *agent, "--memory", "256M"}
	var results []bootResult
	for _, sz := range sizes {
		b, err := os.ReadFile(filepath.Join(*state, sz.name+".ref"))
		if err != nil {
			return fmt.Errorf("%s image: %w (run prepare first)", sz.name, err)
		}
		ref := string(b)
		r := bootResult{Image: sz.name}
		fmt.Fprintf(os.Stderr, "%s: %s image: %d starts, %d exec --vm, %d fresh exec\n", prog, sz.name, *n, *execs, *n)
		for i := 0; i < *n; i++ {
			vm := fmt.Sprintf("bench-%s-%d", strings.ToLower(sz.name), i)
			d, err := run(append(append([]string{"run", "--name", vm, "--detach"}, vmFlags...), "--image", ref)...)
			if err != nil {
				return err
			}
			r.Ready = append(r.Ready, d)
			if i == 0 {
				for j := 0; j < *execs; j++ {
					d, err := run("exec", "--vm", vm, "--", "true")
					if err != nil {
						return err
					}
					r.ExecVM = append(r.ExecVM, d)
				}
			}
			if _, err := run("rm", "-f", vm); err != nil {
				return err
			}
		}
		for i := 0; i < *n; i++ {
			d, err := run(append(append([]string{"exec", "--quiet"}, vmFlags...), "--image", ref, "--", "true")...)
			if err != nil {
				return err
			}
			r.ExecFresh = append(r.ExecFresh, d)
		}
		results = append(results, r)
	}
	fmt.Printf("%-6s %24s %20s %24s\n", "image", "start to agent ms min/p50", "exec --vm ms min/p50", "exec --image ms min/p50")
	for _, r := range results {
		minMed := func(ds []time.Duration) (float64, float64) {
			return benchenv.MS(slices.Min(ds)), benchenv.MS(benchenv.MedianDuration(ds))
		}
		readyMin, readyMed := minMed(r.Ready)
		vmMin, vmMed := minMed(r.ExecVM)
		freshMin, freshMed := minMed(r.ExecFresh)
		fmt.Printf("%-6s %11.1f /%11.1f %9.1f /%9.1f %11.1f /%11.1f\n", r.Image, readyMin, readyMed, vmMin, vmMed, freshMin, freshMed)
	}
	if len(results) == 2 {
		a, b := results[0], results[1]
		fmt.Printf("1GiB/16MiB (min): start to agent %.2fx, exec --image %.2fx; exec --vm is %.1fx faster than exec --image (16MiB, p50)\n",
			float64(slices.Min(b.Ready))/float64(slices.Min(a.Ready)), float64(slices.Min(b.ExecFresh))/float64(slices.Min(a.ExecFresh)),
			float64(benchenv.MedianDuration(a.ExecFresh))/float64(benchenv.MedianDuration(a.ExecVM)))
	}
	if *jsonOut != "" {
		return benchenv.WriteJSON(*jsonOut, map[string]any{"host": benchenv.HostInfo(), "boot": results})
	}
	return nil
}

// discardLogger silences the registry's request log.
func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }
