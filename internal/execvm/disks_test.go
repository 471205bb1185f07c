package execvm

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/dockervm"
)

// stepRunner answers the guest steps by what their scripts do, with the
// statuses the test sets, and records them.
type stepRunner struct {
	unmountStatus int
	steps         []string
}

func (r *stepRunner) Run(_ context.Context, argv []string) (int, string, error) {
	script, args := argv[2], argv[4:]
	switch {
	case strings.Contains(script, "/sys/block/"):
		r.steps = append(r.steps, "mount "+strings.Join(args, " "))
	case strings.Contains(script, "umount"):
		r.steps = append(r.steps, "umount "+strings.Join(args, " "))
		if r.unmountStatus != 0 {
			return r.unmountStatus, "umount: target is busy", nil
		}
	default:
		r.steps = append(r.steps, "other")
	}
	return 0, "", nil
}

// openStore opens a cache store under a test directory, with the state
// directory (where Docker's disks go) there too.
func openStore(t *testing.T) *cachedisk.Store {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", dir)
	s, err := cachedisk.Open(dir+"/caches", cachedisk.Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newest(t *testing.T, s *cachedisk.Store, name string) int {
	t.Helper()
	infos, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == name {
			return in.Newest
		}
	}
	return 0
}

func TestCachesCommitOnlyWhenUnmountedAndOK(t *testing.T) {
	for _, tc := range []struct {
		name          string
		commandOK     bool
		unmountStatus int
		wantVersion   int
	}{
		{"passed", true, 0, 1},
		{"command failed", false, 0, 0},
		{"unmount failed", true, 32, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			var cfg microvm.Config
			o := Options{CacheStore: s, Caches: []Cache{{Name: "go", GuestPath: "/root/go", Size: 8 << 20}}}
			x, err := attachDisks(context.Background(), &cfg, o)
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Disks) != 1 || cfg.Disks[0].Serial != "microvm-cache-0" {
				t.Fatalf("disks %+v: want the clone with serial microvm-cache-0", cfg.Disks)
			}
			r := &stepRunner{unmountStatus: tc.unmountStatus}
			if err := x.setUp(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if tc.commandOK {
				err := x.writeBack(context.Background(), r)
				if (err != nil) != (tc.unmountStatus != 0) {
					t.Errorf("writeBack: %v", err)
				}
			}
			if err := x.finish(tc.commandOK); err != nil {
				t.Fatal(err)
			}
			if got := newest(t, s, "go"); got != tc.wantVersion {
				t.Errorf("newest version %d, want %d (steps %q)", got, tc.wantVersion, r.steps)
			}
			if _, err := os.Stat(cfg.Disks[0].Path); !os.IsNotExist(err) {
				t.Errorf("the clone %s is left behind (%v)", cfg.Disks[0].Path, err)
			}
		})
	}
}

func TestDockerDataRootOnCache(t *testing.T) {
	s := openStore(t)
	var cfg microvm.Config
	o := Options{CacheStore: s, Caches: []Cache{{Name: "docker", GuestPath: "/var/lib/docker/", Size: 8 << 20}}, Docker: &Docker{}}
	x, err := attachDisks(context.Background(), &cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	defer x.finish(false)
	if len(cfg.Disks) != 1 || cfg.Disks[0].Serial != dockervm.DiskSerial {
		t.Fatalf("disks %+v: want only the cache, with Docker's serial", cfg.Disks)
	}
}

func TestDockerDiskRemovedWithVM(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	var cfg microvm.Config
	x, err := attachDisks(context.Background(), &cfg, Options{Docker: &Docker{DiskSize: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Disks) != 1 || cfg.Disks[0].Serial != dockervm.DiskSerial {
		t.Fatalf("disks %+v: want Docker's data disk", cfg.Disks)
	}
	if _, err := os.Stat(cfg.Disks[0].Path); err != nil {
		t.Fatal(err)
	}
	if err := x.finish(true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.Disks[0].Path); !os.IsNotExist(err) {
		t.Errorf("Docker's disk %s is left behind (%v)", cfg.Disks[0].Path, err)
	}
}

func TestCachesRefusedWithWarmStart(t *testing.T) {
	err := Run(Options{Warm: &WarmStart{}, Caches: []Cache{{Name: "a", GuestPath: "/a"}}})
	if err == nil || !strings.Contains(err.Error(), "warm start") {
		t.Errorf("Run: %v, want a refusal", err)
	}
}
