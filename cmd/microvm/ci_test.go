//go:build !microvm_lean

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

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
