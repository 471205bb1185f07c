package execvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/seccomp"
)

// envFinishChild makes the test binary finish an exec's disks under the
// seccomp filter instead of running the tests: a filter is for the life
// of the process.
const envFinishChild = "EXECVM_TEST_FINISH_UNDER_FILTER"

// envFinishTotal, set in the child's environment, makes it commit two
// caches in a store with a total-size bound of 1 byte (exec
// --cache-limit), so that every commit evicts across names under the
// filter; each cache also gets an abandoned clone (plantAbandoned) after
// its checkout, which only that walk can remove.
const envFinishTotal = "EXECVM_TEST_FINISH_TOTAL"

// envFinishRun, set in the child's environment, makes it finish the
// caches as a named VM's process does for run --cache (VMCaches), under
// that process's filter at its widest (--net user, snapshots, cache
// commits), the commit evicting under a total-size bound.
const envFinishRun = "EXECVM_TEST_FINISH_RUN"

// childUnsupported is the child's exit status where this kernel has no
// seccomp filters.
const childUnsupported = 4

func TestMain(m *testing.M) {
	if dir := os.Getenv(envFinishChild); dir != "" {
		if err := finishUnderFilter(dir); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			if errors.Is(err, seccomp.ErrUnsupported) {
				os.Exit(childUnsupported)
			}
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// finishUnderFilter does what exec does around its VM, in the same order:
// the disks are set up before the filter (checkout, Docker's data disk),
// and committed, discarded and removed under it, as exec --cache
// --docker's policy has it.
func finishUnderFilter(state string) error {
	os.Setenv("MICROVM_STATE_DIR", state)
	limits, caches := cachedisk.Limits{Versions: 1}, []Cache{{Name: "kept", GuestPath: "/k", Size: 8 << 20}}
	if os.Getenv(envFinishTotal) != "" {
		limits = cachedisk.Limits{TotalBytes: 1}
		caches = append(caches, Cache{Name: "other", GuestPath: "/o", Size: 8 << 20})
	}
	s, err := cachedisk.Open(filepath.Join(state, "caches"), limits, nil)
	if err != nil {
		return err
	}
	var cfg microvm.Config
	if os.Getenv(envFinishRun) != "" {
		v, err := AttachCaches(context.Background(), &cfg, s, caches)
		if err != nil {
			return err
		}
		v.x.unmounted = true // what WriteBack records once the guest unmounted them
		if err := plantAbandoned(s, caches); err != nil {
			return err
		}
		policy := seccomp.VMMUserNet().WithSnapshots().WithCacheCommits()
		if err := seccomp.Install(policy, seccomp.Options{Prefix: "child", Hint: "test"}); err != nil {
			return err
		}
		_, err = v.Finish(true)
		return err
	}
	o := Options{CacheStore: s, Caches: caches, Docker: &Docker{DiskSize: 16 << 20}}
	x, err := attachDisks(context.Background(), &cfg, o)
	if err != nil {
		return err
	}
	x.unmounted = true // what the guest reports after writeBack
	if err := plantAbandoned(s, caches); err != nil {
		return err
	}
	if err := seccomp.Install(seccomp.VMM().WithCacheCommits(), seccomp.Options{Prefix: "child", Hint: "test"}); err != nil {
		return err
	}
	return x.finish(true)
}

// plantAbandoned, with envFinishTotal set, leaves in each cache's clones
// directory a clone that a killed job would have left: no one holds it
// and it is older than cachedisk.CloneGrace.
func plantAbandoned(s *cachedisk.Store, caches []Cache) error {
	if os.Getenv(envFinishTotal) == "" {
		return nil
	}
	old := time.Now().Add(-2 * cachedisk.CloneGrace)
	for _, c := range caches {
		p := filepath.Join(s.Dir(), c.Name, "clones", strings.Repeat("0", 32)+".ext4")
		if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
			return err
		}
		if err := os.Chtimes(p, old, old); err != nil {
			return err
		}
	}
	return nil
}

// finishRounds runs the filtered child (envFinishChild) on state twice,
// with env added to its environment, skipping the test where the host has
// no seccomp filters.
func finishRounds(t *testing.T, state string, env ...string) {
	t.Helper()
	for round := 1; round <= 2; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(append(os.Environ(), envFinishChild+"="+state, "GORACE=atexit_sleep_ms=0"), env...)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == childUnsupported {
			t.Skipf("no seccomp filters here: %s", out)
		}
		if err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, out)
		}
	}
}

// TestFinishUnderFilter: committing caches (twice, so an old version is
// evicted) and removing Docker's data disk pass exec's seccomp filter, as
// they must once the VM is gone.
func TestFinishUnderFilter(t *testing.T) {
	state := t.TempDir()
	finishRounds(t, state)
	s, err := cachedisk.Open(filepath.Join(state, "caches"), cachedisk.Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := s.List()
	if err != nil || len(infos) != 1 || infos[0].Newest != 2 || infos[0].Versions != 1 {
		t.Errorf("after two commits under the filter: %+v, %v; want version 2 alone", infos, err)
	}
	left, _ := filepath.Glob(filepath.Join(state, "docker-disks", "*"))
	if len(left) != 0 {
		t.Errorf("Docker's disks left behind: %s", strings.Join(left, " "))
	}
}

// TestEvictUnderFilter: with a bound on the store's total size, each
// commit evicts the oldest versions of every cache, its own and others'
// (whose locks it takes), and removes their abandoned clones, under
// exec's seccomp filter; two rounds leave each cache its newest version
// alone, where the default limits keep two, and no clone.
func TestEvictUnderFilter(t *testing.T) {
	state := t.TempDir()
	finishRounds(t, state, envFinishTotal+"=1")
	wantNewestAlone(t, state)
}

// TestRunFinishUnderFilter: a named VM's process commits run --cache's
// caches after its VM, under its own filter (run's, with --net user and
// cache commits), evicting across names and removing abandoned clones as
// exec's does.
func TestRunFinishUnderFilter(t *testing.T) {
	state := t.TempDir()
	finishRounds(t, state, envFinishRun+"=1", envFinishTotal+"=1")
	wantNewestAlone(t, state)
}

// wantNewestAlone checks that after finishRounds' two rounds under a
// total-size bound the store in state holds two caches, each with its
// newest version (2) alone and no clone left.
func wantNewestAlone(t *testing.T, state string) {
	t.Helper()
	s, err := cachedisk.Open(filepath.Join(state, "caches"), cachedisk.Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := s.List()
	if err != nil || len(infos) != 2 {
		t.Fatalf("after two rounds: %+v, %v; want two caches", infos, err)
	}
	for _, in := range infos {
		if in.Newest != 2 || in.Versions != 1 || in.Clones != 0 {
			t.Errorf("cache %s: newest %d, %d versions, %d clones; want version 2 alone", in.Name, in.Newest, in.Versions, in.Clones)
		}
	}
}
