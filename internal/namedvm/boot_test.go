package namedvm

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// bootConfig is a checked configuration as run --name gives Boot: one
// disk of the user's and exec's vsock device.
func bootConfig() microvm.Config {
	return microvm.Config{CPUs: 2, MemoryBytes: 256 << 20, Kernel: "/k/bzImage", Initrd: "/k/init.cpio",
		Cmdline: "console=ttyS0", Disks: []microvm.DiskConfig{{Path: "/data.img"}}, Vsock: &microvm.VsockConfig{CID: 3}}
}

// dockerCacheRequest is run --name d1 with a main process, --docker and
// one cache, go at /root/go, in a store of the test's own.
func dockerCacheRequest(t *testing.T) BootRequest {
	return BootRequest{Name: "d1", Config: bootConfig(), Agent: true, Main: &Process{Argv: []string{"make"}},
		Docker:   &execvm.Docker{Start: dockervm.Options{Timeout: time.Second}},
		Caches:   []execvm.Cache{{Name: "go", GuestPath: "/root/go", Size: 8 << 20}},
		CacheDir: filepath.Join(t.TempDir(), "caches")}
}

// TestBootLaunchRecord: the record of run --name's VM says what it boots:
// the agent image (not a file) when Boot builds it, the image by the name
// the user gave with its process defaults, and every disk in the machine's
// order, the image's root first.
func TestBootLaunchRecord(t *testing.T) {
	img := &image.Image{Rootfs: "/images/abc.ext4", Config: image.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/app", User: "1000", UID: 1000}}
	main := &Process{Argv: []string{"/bin/app"}}
	for _, tc := range []struct {
		name string
		req  BootRequest
		want vms.Record
	}{
		{"plain", BootRequest{Name: "p1", Config: bootConfig()},
			vms.Record{Name: "p1", CPUs: 2, MemoryBytes: 256 << 20, Kernel: "/k/bzImage", Initrd: "/k/init.cpio",
				AgentPort: agentvm.Port, VsockCID: 3, Disks: []string{"/data.img"}}},
		{"agent image", BootRequest{Name: "a1", Config: bootConfig(), Agent: true, AgentImage: &agentimage.Options{}},
			vms.Record{Name: "a1", CPUs: 2, MemoryBytes: 256 << 20, Kernel: "/k/bzImage", Initrd: "(the agent image)",
				Agent: true, AgentPort: agentvm.Port, VsockCID: 3, Disks: []string{"/data.img"}}},
		{"image", BootRequest{Name: "i1", Config: bootConfig(), Agent: true, AgentImage: &agentimage.Options{},
			Image: img, ImageRef: "app:1", Overlay: 64 << 20, Main: main},
			vms.Record{Name: "i1", CPUs: 2, MemoryBytes: 256 << 20, Kernel: "/k/bzImage", Initrd: "(the agent image)",
				Agent: true, AgentPort: agentvm.Port, VsockCID: 3, Disks: []string{"/images/abc.ext4", "/data.img"},
				Image: "app:1", Process: &vms.Process{Env: []string{"PATH=/bin"}, WorkingDir: "/app", HasUser: true, UID: 1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := bootLaunch(tc.req, tc.req.Config)
			if diff := cmp.Diff(tc.want, l.Record); diff != "" {
				t.Errorf("record (-want +got):\n%s", diff)
			}
			if l.Main != tc.req.Main || l.Build == nil || l.Setup != nil {
				t.Errorf("launch: main %v, build %v, setup %v; want the request's main, a build and no setup", l.Main, l.Build != nil, l.Setup != nil)
			}
		})
	}
}

// TestBootEnv: Docker's start and the caches' mounts run with the main
// process's environment, else the image's, else the agent's (nil).
func TestBootEnv(t *testing.T) {
	img := &image.Image{Config: image.Config{Env: []string{"FROM=image"}}}
	main := &Process{Argv: []string{"x"}, Env: []string{"FROM=main"}}
	for _, tc := range []struct {
		req  BootRequest
		want []string
	}{
		{BootRequest{}, nil},
		{BootRequest{Image: img}, []string{"FROM=image"}},
		{BootRequest{Image: img, Main: main}, []string{"FROM=main"}},
	} {
		if got := bootEnv(tc.req); !cmp.Equal(got, tc.want) {
			t.Errorf("bootEnv(image %v, main %v) = %q, want %q", tc.req.Image != nil, tc.req.Main != nil, got, tc.want)
		}
	}
}

// TestPrepareBootDisks: run --name --docker --cache's machine has the
// user's disks, then Docker's data disk in the VM's state directory, then
// the caches, checked out before the launch is made (its record lists
// them all); Docker's start is the setup, after the caches' mounts, and
// its status is Docker's. The request's configuration is left as it was.
func TestPrepareBootDisks(t *testing.T) {
	testenv.NeedMkfs(t)
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	req := dockerCacheRequest(t)
	l, caches, err := prepareBoot(req, 125)
	if err != nil {
		t.Fatal(err)
	}
	defer caches.Finish(false)
	if caches == nil || len(caches.Caches()) != 1 {
		t.Fatalf("caches %v; want go's checked out", caches)
	}
	dockerDisk, err := DockerDiskPath("d1")
	if err != nil {
		t.Fatal(err)
	}
	disks := l.Record.Disks
	if len(disks) != 3 || disks[0] != "/data.img" || disks[1] != dockerDisk || !strings.HasPrefix(disks[2], req.CacheDir) {
		t.Errorf("disks %q; want /data.img, %s, then the go cache's clone in %s", disks, dockerDisk, req.CacheDir)
	}
	if l.Setup == nil || l.AfterMain == nil || l.SetupStatus != dockervm.ExitStatus {
		t.Errorf("setup %v, after main %v, setup status %d; want the mounts and Docker, the write-back, %d",
			l.Setup != nil, l.AfterMain != nil, l.SetupStatus, dockervm.ExitStatus)
	}
	if len(req.Config.Disks) != 1 {
		t.Errorf("the request's disks became %v", req.Config.Disks)
	}
	// Without Docker a failed mount is the status the caller gave.
	req.Docker = nil
	l, caches, err = prepareBoot(req, 125)
	if err != nil {
		t.Fatal(err)
	}
	defer caches.Finish(false)
	if l.SetupStatus != 125 || len(l.Record.Disks) != 2 {
		t.Errorf("without Docker: setup status %d, disks %q; want 125 and the user's disk and the cache", l.SetupStatus, l.Record.Disks)
	}
}

// TestBootCheckoutFailure: caches that cannot be checked out stop Boot
// before the VM's record exists, as a FailedError that a detached start
// reads on its ready line.
func TestBootCheckoutFailure(t *testing.T) {
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	req := BootRequest{Name: "c1", Config: bootConfig(), Agent: true, Main: &Process{Argv: []string{"make"}},
		Caches: []execvm.Cache{{Name: "go", GuestPath: "/root/go"}}, CacheDir: filepath.Join(notDir, "caches")}
	err = Boot(req, Options{Ready: w, FailureStatus: 125})
	var fe FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("Boot = %v; want a FailedError", err)
	}
	line, _ := bufio.NewReader(r).ReadString('\n')
	if want := "error: " + err.Error() + "\n"; line != want {
		t.Errorf("ready line %q, want %q", line, want)
	}
	if _, err := os.Stat(filepath.Join(state, "vms", "c1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the VM's directory: %v; want none", err)
	}
}

// TestDockerLaunch: run --docker's launch makes the data disk (sparse
// ext4 of the size asked for) only when the machine is built, then builds
// it; a disk that exists already is refused, not reused; Docker's start
// is the launch's setup, with its exit status.
func TestDockerLaunch(t *testing.T) {
	testenv.NeedMkfs(t)
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	path, err := DockerDiskPath("d1")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(vms.StateDir(), "vms", "d1", DockerDiskFile); path != want {
		t.Errorf("DockerDiskPath = %s, want %s", path, want)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	built := 0
	inner := Launch{Build: func(microvm.Config) (*microvm.Machine, error) {
		built++
		if _, err := os.Stat(path); err != nil {
			t.Errorf("built before the disk was made: %v", err)
		}
		return nil, nil
	}}
	l := dockerLaunch(inner, path, &execvm.Docker{DiskSize: 300 << 20, Start: dockervm.Options{Timeout: time.Second}}, nil)
	if l.Setup == nil || l.SetupStatus != dockervm.ExitStatus {
		t.Errorf("setup %v, status %d; want Docker's start and %d", l.Setup != nil, l.SetupStatus, dockervm.ExitStatus)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the disk exists before the build: %v", err)
	}
	if _, err := l.Build(microvm.Config{}); err != nil || built != 1 {
		t.Fatalf("build: %v, inner builds %d", err, built)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 300<<20 {
		t.Errorf("disk: %v, %v; want 300M", fi, err)
	}
	// A FailedError: the CLI's failure status (cmd/microvm-full's namedExit).
	_, err = l.Build(microvm.Config{})
	var f FailedError
	if !errors.As(err, &f) || !errors.Is(err, os.ErrExist) || built != 1 {
		t.Errorf("second build: %v, inner builds %d; want a failure for the existing disk and no build", err, built)
	}
}
