package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/execvm"
)

// TestRunCacheUsage: run --cache's mistakes are exec's, in the same
// words, plus run's own (no agent to mount them, no main process to keep
// them, a cache over run --docker's data disk); each is one line and
// status 2, before any VM, clone or store exists.
func TestRunCacheUsage(t *testing.T) {
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	kernel := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(kernel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := []string{"run", "--name", "c1", "--with-agent", "--kernel", kernel}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--kernel", kernel, "--cache", "go=/root/go"}, "--cache needs --image"},
		{[]string{"run", "--name", "c1", "--kernel", kernel, "--cache", "go=/root/go"}, "--cache needs --image"},
		{append(agent, "--cache", "go"), `--cache "go": want NAME=GUESTPATH[,size=SIZE]`},
		{append(agent, "--cache", "go=root/go"), "the guest path must be an absolute directory other than /"},
		{append(agent, "--cache", "go=/"), "the guest path must be an absolute directory other than /"},
		{append(agent, "--cache", "go=/a,size=1K"), `size "1K": want 16M to 1T`},
		{append(agent, "--cache", "go=/a,mode=x"), `unknown option "mode"`},
		{append(agent, "--cache", "go=/a", "--cache", "go=/b"), "given twice"},
		{append(agent, "--cache", "../x=/a"), `--cache "../x=/a"`},
		{append(agent, "--cache-limit", "1G"), "--cache-limit is --cache's: give --cache too"},
		{append(agent, "--cache-dir", state), "--cache-dir is --cache's: give --cache too"},
		{append(agent, "--cache", "go=/a", "--cache-limit", "0"), "--cache-limit \"0\": want a size from 1B to 1024T"},
		{append(agent, "--cache", "go=/a", "--cache-dir", ""), `--cache-dir "": want a directory`},
		{append(agent, "--cache", "go=/a"), "--cache needs the image's main process (not --idle)"},
		{append(agent, "--docker", "--cache", "d=/var/lib/docker"), "run --docker keeps Docker's data root on a disk of the VM's own"},
	} {
		wantError(t, microvm.StatusUsage, tc.args, tc.want)
	}
	if entries, err := os.ReadDir(state); err != nil || len(entries) != 0 {
		t.Errorf("state directory after refused command lines: %v, %v; want it empty", entries, err)
	}
}

// TestRunCacheNeedsMain: a VM with the agent and no main process
// (--with-agent alone) has no status 0 to keep its caches by: refused.
func TestRunCacheNeedsMain(t *testing.T) {
	if err := (runCaches{caches: []execvm.Cache{{Name: "go"}}}).checkMain(false); err == nil ||
		!strings.Contains(err.Error(), "--cache needs the image's main process (not --idle)") {
		t.Errorf("checkMain(false) = %v", err)
	}
	if err := (runCaches{caches: []execvm.Cache{{Name: "go"}}}).checkMain(true); err != nil {
		t.Errorf("checkMain(true) = %v", err)
	}
	if err := (runCaches{}).checkMain(false); err != nil {
		t.Errorf("no caches: checkMain(false) = %v", err)
	}
}

// TestWantsNamedCache: --cache and its flags take run to named.go (the
// lean binary hands them to microvm-full), which refuses them without
// an image.
func TestWantsNamedCache(t *testing.T) {
	for _, args := range []string{"--kernel k --cache go=/a", "--kernel k --cache-limit 1G", "--kernel k --cache-dir /c"} {
		c, _, err := clibase.ParseLeanFlags("run", clibase.RunOpts(), strings.Fields(args))
		if err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		if !clibase.WantsNamed(c) {
			t.Errorf("WantsNamed(%s) = false, want true", args)
		}
	}
}
