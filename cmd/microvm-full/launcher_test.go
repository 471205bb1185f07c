package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// launcherStub is a stand-in for microvm that the GitHub launcher runs:
// it appends each command line to $STUB_LOG, one argument a line and a
// blank line after, the JIT config it was given in its environment as a
// line "env: VALUE" after run's, and exits $STUB_STATUS for run.
const launcherStub = `#!/bin/sh
for a in "$@"; do printf '%s\n' "$a"; done >>"$STUB_LOG"
if [ "$1" = run ]; then
	printf 'env: %s\n' "$ACTIONS_RUNNER_INPUT_JITCONFIG" >>"$STUB_LOG"
	echo >>"$STUB_LOG"
	exit "${STUB_STATUS:-0}"
fi
echo >>"$STUB_LOG"
`

// runLauncher runs examples/github-actions/launch-runner against the stub
// with env added, and returns its exit status, its stderr and the stub's
// command lines (each its arguments).
func runLauncher(t *testing.T, env ...string) (int, string, [][]string) {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stub, log := filepath.Join(dir, "microvm"), filepath.Join(dir, "log")
	if err := os.WriteFile(stub, []byte(launcherStub), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "examples", "github-actions", "launch-runner"), "runner:1")
	cmd.Env = append(os.Environ(), "MICROVM="+stub, "STUB_LOG="+log, "JITCONFIG=JIT-abc123")
	for _, k := range []string{"DOCKER", "DOCKER_DISK", "DOCKER_TIMEOUT", "CPUS", "MEMORY", "RUNNER_CMD", "CACHE", "CACHE_DIR", "CACHE_LIMIT"} {
		cmd.Env = append(cmd.Env, k+"=") // none from this test's environment
	}
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	status := 0
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatal(err)
		}
		status = ee.ExitCode()
	}
	b, err := os.ReadFile(log)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var calls [][]string
	for _, c := range strings.Split(string(b), "\n\n") {
		if c = strings.TrimSuffix(c, "\n"); c != "" {
			calls = append(calls, strings.Split(c, "\n"))
		}
	}
	return status, stderr.String(), calls
}

// TestLauncherArgs: the GitHub launcher's microvm command lines, without
// a VM: run with the image, the network, the sizes and the JIT config by
// name only (its value in the environment), then rm -f of the same VM;
// DOCKER=1 adds --docker and DOCKER_DISK and DOCKER_TIMEOUT their flags,
// before the runner's command, CACHE's words --cache flags and CACHE_DIR
// and CACHE_LIMIT theirs. Docker's status 122 comes back with a line
// that says what it means; a bad DOCKER or CACHE, or DOCKER_DISK or
// CACHE_DIR without it, is a usage error before microvm runs.
func TestLauncherArgs(t *testing.T) {
	vm := func(calls [][]string) string {
		if len(calls) == 0 || len(calls[0]) < 3 || !strings.HasPrefix(calls[0][2], "gha-") {
			t.Fatalf("calls %q: want run --name gha-... first", calls)
		}
		return calls[0][2]
	}
	want := func(name string, docker ...string) [][]string {
		run := append([]string{"run", "--name", name, "--image", "runner:1", "--net", "user", "--cpus", "2", "--memory", "4G",
			"--env", "ACTIONS_RUNNER_INPUT_JITCONFIG"}, docker...)
		run = append(run, "--", "/home/runner/run.sh", "env: JIT-abc123")
		return [][]string{run, {"rm", "-f", name}}
	}
	check := func(what string, got, want [][]string) {
		t.Helper()
		if strings.Join(flatten(got), "|") != strings.Join(flatten(want), "|") {
			t.Errorf("%s: microvm called with\n%q\nwant\n%q", what, got, want)
		}
	}

	status, stderr, calls := runLauncher(t)
	if status != 0 || stderr != "" {
		t.Errorf("plain: status %d, stderr %q", status, stderr)
	}
	check("plain", calls, want(vm(calls)))

	status, stderr, calls = runLauncher(t, "DOCKER=1")
	if status != 0 || stderr != "" {
		t.Errorf("DOCKER=1: status %d, stderr %q", status, stderr)
	}
	check("DOCKER=1", calls, want(vm(calls), "--docker"))

	status, _, calls = runLauncher(t, "DOCKER=1", "DOCKER_DISK=20G", "DOCKER_TIMEOUT=3m", "CPUS=4", "MEMORY=8G")
	w := want(vm(calls), "--docker", "--docker-disk", "20G", "--docker-timeout", "3m")
	w[0][8], w[0][10] = "4", "8G"
	if status != 0 {
		t.Errorf("DOCKER=1 with its sizes: status %d", status)
	}
	check("DOCKER=1 DOCKER_DISK=20G DOCKER_TIMEOUT=3m", calls, w)

	status, stderr, calls = runLauncher(t, "DOCKER=1", "STUB_STATUS=122")
	if status != 122 || !strings.Contains(stderr, "launch-runner: Docker did not come up in the VM (exit status 122)") {
		t.Errorf("Docker failed: status %d, stderr %q; want 122 and the launcher's line", status, stderr)
	}
	check("Docker failed", calls, want(vm(calls), "--docker"))
	// Without DOCKER=1 a 122 is the runner's own, passed on unexplained.
	if status, stderr, _ = runLauncher(t, "STUB_STATUS=122"); status != 122 || stderr != "" {
		t.Errorf("runner's 122: status %d, stderr %q; want 122 and nothing said", status, stderr)
	}

	for _, env := range [][]string{{"DOCKER=yes"}, {"DOCKER_DISK=20G"}, {"DOCKER=0", "DOCKER_TIMEOUT=1m"}} {
		status, stderr, calls := runLauncher(t, env...)
		if status != 2 || !strings.HasPrefix(stderr, "launch-runner: DOCKER") || strings.Count(stderr, "\n") != 1 || len(calls) != 0 {
			t.Errorf("%q: status %d, stderr %q, calls %q; want 2, one line, no microvm", env, status, stderr, calls)
		}
	}

	// CACHE's words become --cache flags, CACHE_DIR and CACHE_LIMIT
	// theirs, after Docker's.
	status, stderr, calls = runLauncher(t, "DOCKER=1", "CACHE= go=/home/runner/go  npm=/home/runner/.npm,size=8G ", "CACHE_DIR=/srv/caches/repo1", "CACHE_LIMIT=50G")
	if status != 0 || stderr != "" {
		t.Errorf("CACHE: status %d, stderr %q", status, stderr)
	}
	check("CACHE", calls, want(vm(calls), "--docker", "--cache", "go=/home/runner/go", "--cache", "npm=/home/runner/.npm,size=8G",
		"--cache-dir", "/srv/caches/repo1", "--cache-limit", "50G"))
	for _, env := range [][]string{{"CACHE=go"}, {"CACHE=go=relative"}, {"CACHE=go=/a,mode=x"}, {"CACHE=../go=/a"},
		{"CACHE_DIR=/srv/caches"}, {"CACHE_LIMIT=1G"}} {
		status, stderr, calls := runLauncher(t, env...)
		if status != 2 || !strings.HasPrefix(stderr, "launch-runner: CACHE") || strings.Count(stderr, "\n") != 1 || len(calls) != 0 {
			t.Errorf("%q: status %d, stderr %q, calls %q; want 2, one line, no microvm", env, status, stderr, calls)
		}
	}
}

// flatten joins calls' arguments, a call's end marked, for comparing.
func flatten(calls [][]string) []string {
	var out []string
	for _, c := range calls {
		out = append(append(out, c...), "<end>")
	}
	return out
}
