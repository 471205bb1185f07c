//go:build !microvm_lean

package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/vms"
)

// TestGitLabExecutorNoVM: config prints the contract's JSON; run and
// prepare map their failures to GitLab's variables: a stage with no job VM
// is a system failure with one line; without the variables (not under
// GitLab Runner) microvm's own statuses stay.
func TestGitLabExecutorNoVM(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	t.Setenv("CUSTOM_ENV_CI_RUNNER_ID", "3")
	t.Setenv("CUSTOM_ENV_CI_JOB_ID", "41")
	status, stdout, stderr := runMain(t, "ci", "gitlab", "config")
	var cfg map[string]any
	if status != 0 || stderr != "" || json.Unmarshal([]byte(stdout), &cfg) != nil || cfg["builds_dir"] != "/builds" ||
		cfg["cache_dir"] != "/cache" || cfg["builds_dir_is_shared"] != false {
		t.Fatalf("config: status %d, stdout %q, stderr %q", status, stdout, stderr)
	}
	script := filepath.Join(t.TempDir(), "s.sh")
	if err := os.WriteFile(script, []byte("true\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Not under GitLab Runner: microvm's statuses.
	wantError(t, 1, []string{"ci", "gitlab", "run", script, "step_script"}, "VM gitlab-3-41")
	wantError(t, 2, []string{"ci", "gitlab", "run", script}, "want SCRIPT and STAGE")

	t.Setenv("BUILD_FAILURE_EXIT_CODE", "31")
	t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "32")
	wantError(t, 32, []string{"ci", "gitlab", "run", script, "step_script"}, "ci gitlab run: step_script: ")
	wantError(t, 32, []string{"ci", "gitlab", "run", filepath.Join(t.TempDir(), "missing.sh"), "step_script"}, "no such file or directory")
	wantError(t, 32, []string{"ci", "gitlab", "prepare", "--memory", "lots"}, "--memory")
	// A bad flag is found before anything is made: no cache disk is left.
	cacheDir := filepath.Join(t.TempDir(), "cache")
	wantError(t, 32, []string{"ci", "gitlab", "prepare", "--cache-dir", cacheDir, "--warm-pool", "-1"}, "--warm-pool -1")
	if _, err := os.Stat(cacheDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused prepare left %s behind (%v)", cacheDir, err)
	}
	// cleanup of a job that never started is fine.
	if status, stdout, stderr := runMain(t, "ci", "gitlab", "cleanup"); status != 0 || stdout != "" || stderr != "" {
		t.Errorf("cleanup without a VM: status %d, %q, %q", status, stdout, stderr)
	}
	t.Setenv("CUSTOM_ENV_CI_JOB_ID", "../x")
	wantError(t, 32, []string{"ci", "gitlab", "cleanup"}, "job VM name")
}

// TestJobEnvironment: a job's scripts get the image's environment (its
// PATH included), a usual PATH when it has none, and root's HOME.
func TestJobEnvironment(t *testing.T) {
	got := jobEnvironment(&vms.Process{Env: []string{"PATH=/usr/local/go/bin:/usr/bin", "GOPATH=/go", "HOME=/home/gopher"}})
	want := []string{"PATH=/usr/local/go/bin:/usr/bin", "GOPATH=/go", "HOME=/root"}
	if !slices.Equal(got, want) {
		t.Errorf("image with an environment: %q, want %q", got, want)
	}
	if got := jobEnvironment(nil); !slices.Equal(got, []string{"PATH=" + ciPath, "HOME=/root"}) {
		t.Errorf("no image defaults: %q", got)
	}
}

// TestWarmPoolOffers: the offer files without VMs behind them. An offer
// whose VM never came up is claimed once (the second claimer finds none),
// removed, and not taken; an offer older than the TTL is swept by the next
// cleanup's refill; a pool that is full boots nothing; drain takes what is
// left.
func TestWarmPoolOffers(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	args := []string{"--image", "x:1"}
	if err := writeJSON(offerPath("s1"), ciOffer{VM: "warm-s1", Args: args, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var msgs strings.Builder
	if got := claimWarm("gitlab-1-1", "s1", args, 100*time.Millisecond, &msgs); got != "" {
		t.Errorf("claimed %q, a VM that never ran", got)
	}
	if !strings.Contains(msgs.String(), "not running after") {
		t.Errorf("claim said %q", msgs.String())
	}
	if got := claimWarm("gitlab-1-2", "s1", args, 100*time.Millisecond, &msgs); got != "" {
		t.Errorf("second claim took %q from a claimed offer", got)
	}
	if left, _ := filepath.Glob(filepath.Join(ciPoolDir(), "*")); len(left) != 0 {
		t.Errorf("files left after the claim: %v", left)
	}

	// An old offer for slot s2 is swept; slot s3 already has one, so a
	// pool of 1 is full and nothing is started for it.
	if err := writeJSON(offerPath("s2"), ciOffer{VM: "warm-s2", Created: time.Now().Add(-2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(offerPath("s3"), ciOffer{VM: "warm-s3", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	msgs.Reset()
	refillPool(&ciJobRecord{VM: "gitlab-1-3", Slot: "s4", Pool: 1, TTL: time.Hour}, &msgs)
	if _, err := os.Stat(offerPath("s2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale offer is still there (%v); refill said %q", err, msgs.String())
	}
	if _, err := os.Stat(offerPath("s4")); !errors.Is(err, fs.ErrNotExist) || strings.Contains(msgs.String(), "booting") {
		t.Errorf("a full pool offered slot s4 a VM (%v); refill said %q", err, msgs.String())
	}
	var out strings.Builder
	if err := drainPool(&out, 100*time.Millisecond); err != nil || !strings.Contains(out.String(), "warm-s3") {
		t.Errorf("drain: %v, %q", err, out.String())
	}
	if left, _ := filepath.Glob(filepath.Join(ciPoolDir(), "offer-*")); len(left) != 0 {
		t.Errorf("offers left after drain: %v", left)
	}
}
