package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestGitLabExecutorNoVM: config prints the contract's JSON; run and
// prepare map their failures to GitLab's variables: a stage with no job VM
// is a system failure with one line; without the variables (not under
// GitLab Runner) microvm's own statuses stay.
func TestGitLabExecutorNoVM(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	t.Setenv("CUSTOM_ENV_CI_RUNNER_ID", "3")
	t.Setenv("CUSTOM_ENV_CI_JOB_ID", "41")
	t.Setenv("CUSTOM_ENV_CI_JOB_TOKEN", "token-41")
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
	wantError(t, 1, []string{"ci", "gitlab", "run", script, "step_script"}, "no VM was prepared for this job")
	wantError(t, 2, []string{"ci", "gitlab", "run", script}, "want SCRIPT and STAGE")

	t.Setenv("BUILD_FAILURE_EXIT_CODE", "31")
	t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "32")
	wantError(t, 32, []string{"ci", "gitlab", "run", script, "step_script"}, "ci gitlab run: no VM was prepared")
	wantError(t, 32, []string{"ci", "gitlab", "prepare", "--memory", "lots"}, "--memory")
	wantError(t, 32, []string{"ci", "gitlab", "prepare", "--net", "tap=tap0"}, "--net")
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
	// Without a token nothing tells the job apart: refused, one line.
	t.Setenv("CUSTOM_ENV_CI_JOB_TOKEN", "")
	wantError(t, 32, []string{"ci", "gitlab", "cleanup"}, "no job token")
}
