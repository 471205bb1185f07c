package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/ci/gitlab"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/dockervm"
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

// TestGitLabPrepareDockerFlags: prepare's --docker flags are checked
// before anything is made, as exec's are, --docker-cache wants --docker,
// and --docker is refused with the warm pool; under GitLab Runner each is a system failure in one line.
func TestGitLabPrepareDockerFlags(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	t.Setenv("CUSTOM_ENV_CI_JOB_ID", "42")
	t.Setenv("CUSTOM_ENV_CI_JOB_TOKEN", "token-42")
	cacheDir := filepath.Join(t.TempDir(), "cache")
	prep := func(args ...string) []string {
		return append([]string{"ci", "gitlab", "prepare", "--cache-dir", cacheDir, "--cache-key", "p"}, args...)
	}
	wantError(t, 2, prep("--docker-disk", "1G"), "--docker-disk and --docker-timeout are --docker's")
	wantError(t, 2, prep("--docker-timeout", "5m"), "--docker-disk and --docker-timeout are --docker's")
	wantError(t, 2, prep("--docker", "--docker-disk", "1K"), `--docker-disk "1K": want 256M to 1T`)
	wantError(t, 2, prep("--docker", "--docker-timeout", "0s"), "--docker-timeout 0s")
	wantError(t, 2, prep("--docker", "--warm-pool", "2"), "--docker and --warm-pool 2")
	wantError(t, 2, prep("--docker-cache"), "--docker-cache is --docker's: give --docker too")
	wantError(t, 2, prep("--docker", "--docker-cache", "--warm-pool", "2"), "--docker and --warm-pool 2")
	t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "32")
	wantError(t, 32, prep("--docker", "--warm-pool", "1"), "--docker and --warm-pool 1")
	if _, err := os.Stat(cacheDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused prepare left %s behind (%v)", cacheDir, err)
	}
}

// TestCIExitDocker: Docker that did not come up in prepare is a system
// failure under GitLab Runner, and exec's status 122 outside it, with
// dockerd's log in the message.
func TestCIExitDocker(t *testing.T) {
	err := fmt.Errorf("ci gitlab prepare: VM x: %w", &dockervm.Error{Reason: "dockerd exited before it answered", Log: "  level=fatal"})
	var msgs strings.Builder
	t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "")
	var se clibase.StatusError
	if got := ciExit(err, &msgs); !errors.As(got, &se) || se.Status != dockervm.ExitStatus || !strings.Contains(msgs.String(), "level=fatal") {
		t.Errorf("outside GitLab Runner: %v, %q; want status %d and the log", got, msgs.String(), dockervm.ExitStatus)
	}
	msgs.Reset()
	t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "32")
	if got := ciExit(err, &msgs); !errors.As(got, &se) || se.Status != 32 || !strings.Contains(msgs.String(), "dockerd exited before it answered") ||
		!strings.Contains(msgs.String(), "level=fatal") {
		t.Errorf("under GitLab Runner: %v, %q; want status 32 and the log", got, msgs.String())
	}
	// The job's cache that does not mount, with --docker and
	// --docker-cache too, is not Docker's failure: a system failure under
	// GitLab Runner as any, outside it a plain error, never 122.
	mountErr := errors.New("ci gitlab prepare: VM x: mounting the cache: exit status 32")
	t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "")
	if got := ciExit(mountErr, &msgs); got != mountErr {
		t.Errorf("a cache that does not mount, outside GitLab Runner: %#v; want the error as it is", got)
	}
	if got := clibase.ExitStatus(ciExit(mountErr, io.Discard), io.Discard); got == dockervm.ExitStatus {
		t.Errorf("a cache that does not mount exits %d, Docker's status", got)
	}
	t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "32")
	if got := ciExit(mountErr, io.Discard); !errors.As(got, &se) || se.Status != 32 {
		t.Errorf("a cache that does not mount, under GitLab Runner: %v; want status 32", got)
	}
}

// gitlabCommand is `ci gitlab` in app.
func gitlabCommand(t *testing.T, app *cli.App) *cli.Command {
	t.Helper()
	for _, c := range app.Commands {
		if c.Name == "ci" {
			for _, g := range c.Subcommands {
				if g.Name == "gitlab" {
					return g
				}
			}
		}
	}
	t.Fatal("no ci gitlab command")
	return nil
}

// TestGitLabPrepareCacheLimit: prepare's --cache-limit is read as exec's
// is: the same sizes refused with the same one line (exit status 2, or
// the system failure status under GitLab Runner) before anything is
// made, and a good one reaches PrepareOptions as the store's bound.
func TestGitLabPrepareCacheLimit(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	t.Setenv("CUSTOM_ENV_CI_JOB_ID", "43")
	t.Setenv("CUSTOM_ENV_CI_JOB_TOKEN", "token-43")
	cacheDir := filepath.Join(t.TempDir(), "cache")
	for _, bad := range []string{"0", "lots", "2P", "-1G"} {
		want := fmt.Sprintf("--cache-limit %q: want a size from 1B to 1024T (a bare number is MiB)", bad)
		t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "")
		wantError(t, 2, []string{"exec", "--cache", "go=/go", "--cache-limit", bad, "--", "true"}, want)
		wantError(t, 2, []string{"ci", "gitlab", "prepare", "--cache-dir", cacheDir, "--cache-key", "p", "--cache-limit", bad}, want)
		t.Setenv("SYSTEM_FAILURE_EXIT_CODE", "32")
		wantError(t, 32, []string{"ci", "gitlab", "prepare", "--cache-dir", cacheDir, "--cache-key", "p", "--cache-limit", bad}, want)
	}
	if _, err := os.Stat(cacheDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused prepare left %s behind (%v)", cacheDir, err)
	}
	for _, tc := range []struct {
		args []string
		want int64
	}{{nil, 0}, {[]string{"--cache-limit", "20G"}, 20 << 30}, {[]string{"--cache-limit", "1024T"}, 1 << 50}} {
		app := newApp(nil, io.Discard, io.Discard)
		var o gitlab.PrepareOptions
		var readErr error
		for _, c := range gitlabCommand(t, app).Subcommands {
			if c.Name == "prepare" {
				c.Action = func(c *cli.Context) error { o, readErr = readPrepareOptions(c); return nil }
			}
		}
		if err := app.Run(append([]string{"microvm", "ci", "gitlab", "prepare"}, tc.args...)); err != nil || readErr != nil || o.CacheLimit != tc.want {
			t.Errorf("prepare %q: %v, %v, cache limit %d; want %d", tc.args, err, readErr, o.CacheLimit, tc.want)
		}
	}
}

// TestGitLabFlagsFromConfigOnly: no flag of `ci gitlab` reads an
// environment variable. GitLab Runner gives the executor the job's
// variables in its environment (CUSTOM_ENV_*, which a job may set to
// anything), so what bounds or places the runner's VMs and caches
// (--cache-limit, --cache-dir, --net, ...) comes only from config.toml's
// *_args.
func TestGitLabFlagsFromConfigOnly(t *testing.T) {
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			for _, f := range c.Flags {
				if df, ok := f.(cli.DocGenerationFlag); !ok || len(df.GetEnvVars()) > 0 {
					t.Errorf("%s %s: flag %v reads the environment (%v)", path, c.Name, f.Names(), df)
				}
			}
			walk(path+" "+c.Name, c.Subcommands)
		}
	}
	g := gitlabCommand(t, newApp(nil, io.Discard, io.Discard))
	walk("ci gitlab", g.Subcommands)
}
