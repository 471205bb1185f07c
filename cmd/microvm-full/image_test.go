package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestApplyImage: an image's configuration applies as docker run applies
// it: the Entrypoint stays and the command replaces Cmd; --env replaces a
// variable of the same name; HOME is added for the user; --workdir wins
// over WorkingDir; the User's resolved ids are the process's.
func TestApplyImage(t *testing.T) {
	cfg := image.Config{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8"},
		WorkingDir: "/src",
		Entrypoint: []string{"/entry.sh"},
		Cmd:        []string{"serve", "--port=80"},
	}
	p, err := applyImage(cfg, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/entry.sh", "serve", "--port=80"}; !slices.Equal(p.Argv, want) {
		t.Errorf("no command: argv %q, want %q", p.Argv, want)
	}
	if want := []string{"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8", "HOME=/root"}; !slices.Equal(p.Env, want) {
		t.Errorf("env %q, want %q", p.Env, want)
	}
	if p.Workdir != "/src" || p.UID != nil || p.GID != nil {
		t.Errorf("workdir %q uid %v gid %v: want /src and the agent's user", p.Workdir, p.UID, p.GID)
	}

	cfg.User, cfg.UID, cfg.GID = "app", 1000, 1001
	p, err = applyImage(cfg, []string{"sh", "-c", "id"}, []string{"LANG=fr_FR.UTF-8", "X=1"}, "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/entry.sh", "sh", "-c", "id"}; !slices.Equal(p.Argv, want) {
		t.Errorf("with a command: argv %q, want %q", p.Argv, want)
	}
	if want := []string{"PATH=/usr/local/bin:/usr/bin", "LANG=fr_FR.UTF-8", "X=1", "HOME=/"}; !slices.Equal(p.Env, want) {
		t.Errorf("env %q, want %q", p.Env, want)
	}
	if p.Workdir != "/tmp" || p.UID == nil || *p.UID != 1000 || p.GID == nil || *p.GID != 1001 {
		t.Errorf("workdir %q uid %v gid %v: want /tmp, 1000, 1001", p.Workdir, p.UID, p.GID)
	}

	if _, err := applyImage(image.Config{}, nil, nil, ""); !isUsage(err) {
		t.Errorf("an image with no command and none given: %v, want a usage error", err)
	} else if want := "the image has no Entrypoint and no Cmd: give a command (-- CMD [ARG...])"; err.Error() != want {
		t.Errorf("an image with no command and none given: %q, want %q", err, want)
	}
}

func isUsage(err error) bool {
	_, ok := err.(clibase.UsageError)
	return ok
}

// TestParseUser: --user takes numbers only; GID defaults to UID.
func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in       string
		uid, gid uint32
		ok       bool
	}{
		{"1000", 1000, 1000, true},
		{"1000:50", 1000, 50, true},
		{"0:0", 0, 0, true},
		{"nobody", 0, 0, false},
		{"1000:", 0, 0, false},
		{"-1", 0, 0, false},
		{"4294967296", 0, 0, false},
	} {
		uid, gid, err := parseUser(tc.in)
		if (err == nil) != tc.ok || uid != tc.uid || gid != tc.gid {
			t.Errorf("parseUser(%q) = %d, %d, %v; want %d, %d, ok %v", tc.in, uid, gid, err, tc.uid, tc.gid, tc.ok)
		}
	}
}

// TestImageErrors: bad input around images gets one line and its status:
// 2 for the command line, checked before anything is fetched or booted;
// 125 for an image that cannot be had. Nothing reaches outside this
// machine: the registry is a closed port on the loopback.
func TestImageErrors(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("not a tarball at all, not even close\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	closed := fmt.Sprintf("127.0.0.1:%d/nothing/here:1", testenv.FreePort(t, "tcp"))

	wantError(t, microvm.StatusUsage, []string{"exec", "--kernel", garbage, "--image", "x:1", "--add", garbage + ":/x", "--", "true"},
		"--add puts files in the initramfs, which --image leaves")
	wantError(t, microvm.StatusUsage, []string{"exec", "--kernel", garbage, "--overlay-size", "64M", "--", "true"},
		"--overlay-size: only with --image")
	wantError(t, microvm.StatusUsage, []string{"exec", "--kernel", garbage, "--image", "x:1", "--overlay-size", "12k", "--", "true"},
		`--overlay-size "12k": want a SIZE of at least 1M`)
	wantError(t, microvm.StatusUsage, []string{"exec", "--kernel", garbage, "--user", "nobody", "--", "true"},
		`--user "nobody": want UID[:GID], numbers`)
	wantError(t, microvm.StatusUsage, []string{"run", "--image", "x:1"},
		"--with-agent and --image need --name")
	wantError(t, microvm.StatusUsage, []string{"image", "import", "--rootfs", garbage}, "give --name REF")
	wantError(t, microvm.StatusUsage, []string{"image", "pull"}, "want one image reference")

	wantError(t, clibase.StatusFailure, []string{"exec", "--kernel", garbage, "--quiet", "--image", closed, "--", "true"},
		"exec: image pull "+closed+":")
	wantError(t, clibase.StatusFailure, []string{"image", "import", "--name", "x:1", garbage}, "image import "+garbage+": ")
	wantError(t, clibase.StatusFailure, []string{"image", "import", "--name", "x:1", filepath.Join(dir, "missing.tar")}, "no such file or directory")
	wantError(t, clibase.StatusFailure, []string{"image", "rm", "nosuch:1"}, "image not found")
	if got, stdout, _ := runMain(t, "image", "ls"); got != 0 || !strings.HasPrefix(stdout, "NAME") || strings.Count(stdout, "\n") != 1 {
		t.Errorf("image ls of an empty store: status %d, %q", got, stdout)
	}
}

// TestEnvFlags: a bare --env K passes microvm's own $K (and nothing when
// it is unset), so a secret need not stand on a command line.
func TestEnvFlags(t *testing.T) {
	t.Setenv("MICROVM_TEST_SECRET", "s3cret=x")
	os.Unsetenv("MICROVM_TEST_UNSET")
	got, err := envFlags([]string{"A=1", "MICROVM_TEST_SECRET", "MICROVM_TEST_UNSET", "B="})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"A=1", "MICROVM_TEST_SECRET=s3cret=x", "B="}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("envFlags = %q, want %q", got, want)
	}
	for _, bad := range []string{"", "=v", "a\x00b"} {
		if _, err := envFlags([]string{bad}); err == nil {
			t.Errorf("envFlags(%q) = nil error", bad)
		}
	}
}
