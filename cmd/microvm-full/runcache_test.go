package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

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

// TestFinishCachesLine: a run whose caches are not kept says so in one
// line naming them and why; a run without caches says nothing.
func TestFinishCachesLine(t *testing.T) {
	var buf bytes.Buffer
	log := logrus.New()
	log.SetOutput(&buf)
	if err := finishCaches(nil, nil, errors.New("exit status 1"), log); err != nil || buf.Len() != 0 {
		t.Errorf("no caches: %v, %q", err, buf.String())
	}
	if got := discardReason(errors.New("exit status 1")); !strings.Contains(got, "(exit status 1)") {
		t.Errorf("discardReason(exit status 1) = %q", got)
	}
	if got := discardReason(nil); !strings.Contains(got, "before its main process ended 0") {
		t.Errorf("discardReason(nil) = %q", got)
	}
	if got := cacheNames([]execvm.Cache{{Name: "go"}, {Name: "npm"}}); got != "go, npm" {
		t.Errorf("cacheNames = %q", got)
	}
}

// recRunner records the guest commands it is given and answers status.
type recRunner struct {
	status int
	argvs  [][]string
}

func (r *recRunner) Run(_ context.Context, argv []string) (int, string, error) {
	r.argvs = append(r.argvs, argv)
	return r.status, "chown: bad", nil
}

// TestChownCaches: a main process that is not root gets each cache's top
// directory (chown UID[:GID] DIR, nothing recursive); root's caches are
// left as they are; a chown that fails is the setup's failure.
func TestChownCaches(t *testing.T) {
	u, g, zero := uint32(1001), uint32(121), uint32(0)
	for _, tc := range []struct {
		uid, gid *uint32
		want     []string
	}{
		{nil, nil, nil},
		{&zero, &zero, nil},
		{&u, nil, []string{"1001"}},
		{&u, &g, []string{"1001:121"}},
	} {
		if got := cacheOwner(tc.uid, tc.gid); strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("cacheOwner = %q, want %q", got, tc.want)
		}
	}
	caches := []execvm.Cache{{Name: "go", GuestPath: "/home/runner/go"}, {Name: "npm", GuestPath: "/home/runner/.npm"}}
	r := &recRunner{}
	if err := chownCaches(context.Background(), r, caches, nil); err != nil || len(r.argvs) != 0 {
		t.Errorf("root: %v, ran %q", err, r.argvs)
	}
	if err := chownCaches(context.Background(), r, caches, []string{"1001:121"}); err != nil ||
		fmt.Sprint(r.argvs) != "[[chown 1001:121 /home/runner/go] [chown 1001:121 /home/runner/.npm]]" {
		t.Errorf("1001:121: %v, ran %q", err, r.argvs)
	}
	r = &recRunner{status: 1}
	if err := chownCaches(context.Background(), r, caches, []string{"1001"}); err == nil || !strings.Contains(err.Error(), "run: cache go: giving /home/runner/go to the main process's user failed (status 1): chown: bad") {
		t.Errorf("failed chown: %v", err)
	}
}
