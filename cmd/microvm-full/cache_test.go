package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/cachedisk"
)

func TestParseCache(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want: "NAME PATH SIZE", or an error's part
		ok       bool
	}{
		{"go=/root/go", "go /root/go 4294967296", true},
		{"npm=/root/.npm/,size=1G", "npm /root/.npm 1073741824", true},
		{"docker=/var/lib/docker,size=20G", "docker /var/lib/docker 21474836480", true},
		{"go", "want NAME=GUESTPATH", false},
		{"../x=/a", "cache name", false},
		{"a/b=/a", "cache name", false},
		{"go=relative", "absolute directory", false},
		{"go=/", "absolute directory", false},
		{"go=/a,size=1K", "want 16M to 1T", false},
		{"go=/a,ro", "unknown option", false},
	} {
		c, err := parseCache(tc.in)
		if tc.ok {
			got := c.Name + " " + c.GuestPath + " " + strconv.FormatInt(c.Size, 10)
			if err != nil || got != tc.want {
				t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want an error with %q", tc.in, err, tc.want)
		}
	}
	if _, err := readCaches([]string{"a=/x", "b=/x/"}); err == nil {
		t.Error("two caches at one guest path: accepted")
	}
	if _, err := readCaches([]string{"a=/x", "a=/y"}); err == nil {
		t.Error("one cache at two guest paths: accepted")
	}
}

// TestExecCacheFlagsRefused: --cache and --docker with what cannot keep
// their disks are usage errors, before any VM or file.
func TestExecCacheFlagsRefused(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--vm", "x", "--cache", "go=/go", "--", "true"}, "not --vm"},
		{[]string{"exec", "--docker-disk", "1G", "--", "true"}, "give --docker too"},
		{[]string{"exec", "--docker", "--docker-timeout", "0s", "--", "true"}, "want a positive duration"},
		{[]string{"exec", "--docker", "--docker-disk", "1K", "--", "true"}, "want 256M to 1T"},
		{[]string{"exec", "--cache", "go", "--", "true"}, "want NAME=GUESTPATH"},
		{[]string{"exec", "--cache", "go=/go,size=1K", "--", "true"}, "want 16M to 1T"}, // the comma kept
		{[]string{"exec", "--cache", "go=/go", "--cache", "mod=/go/", "--", "true"}, "given twice"},
		{[]string{"exec", "--chroot", t.TempDir(), "--cache", "go=/go", "--", "true"}, "which --chroot hides"},
		{[]string{"exec", "--snapshot", t.TempDir(), "--docker", "--", "true"}, "warm start"},
		{[]string{"exec", "--cache-limit", "10G", "--", "true"}, "give --cache too"},
		{[]string{"exec", "--cache", "go=/go", "--cache-limit", "0", "--", "true"}, `--cache-limit "0": want a size from 1B to 1024T (a bare number is MiB)`},
		{[]string{"exec", "--cache", "go=/go", "--cache-limit", "lots", "--", "true"}, "want a size"},
		{[]string{"exec", "--vm", "x", "--cache-limit", "1G", "--", "true"}, "not --vm"},
	} {
		st, _, stderr := runMain(t, tc.args...)
		if st != microvm.StatusUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: status %d, %q; want %d and %q", tc.args, st, stderr, microvm.StatusUsage, tc.want)
		}
	}
}

// TestCacheLsRm lists and removes a cache that a job committed, with a
// running job's clone and one a killed job left (no one holds it, older
// than cachedisk.CloneGrace): ls counts one in use and one abandoned, and
// rm takes them with the versions.
func TestCacheLsRm(t *testing.T) {
	dir := t.TempDir()
	s, err := cachedisk.Open(dir, cachedisk.Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := s.Checkout(context.Background(), "go-mod", 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(cl); err != nil {
		t.Fatal(err)
	}
	var clones []string
	for range 2 {
		cl, err := s.Checkout(context.Background(), "go-mod", 16<<20)
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Path(cl)
		if err != nil {
			t.Fatal(err)
		}
		clones = append(clones, p)
	}
	old := time.Now().Add(-2 * cachedisk.CloneGrace)
	if err := os.Chtimes(clones[0], old, old); err != nil {
		t.Fatal(err)
	}
	st, stdout, stderr := runMain(t, "cache", "ls", "--dir", dir)
	if st != 0 || !strings.HasPrefix(stdout, "NAME") || !strings.Contains(stdout, "go-mod") || !strings.Contains(stdout, "16M") {
		t.Fatalf("cache ls: %d, %q, %q", st, stdout, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if f := strings.Fields(lines[len(lines)-1]); len(lines) != 2 || !strings.HasSuffix(lines[0], "CLONES IN USE  ABANDONED") || !slices.Equal(f[len(f)-2:], []string{"1", "1"}) {
		t.Errorf("cache ls: %q; want one clone in use and one abandoned", stdout)
	}
	var list []cachedisk.Info
	if st, stdout, _ := runMain(t, "cache", "ls", "--dir", dir, "--json"); st != 0 || json.Unmarshal([]byte(stdout), &list) != nil || len(list) != 1 || list[0].Clones != 2 || list[0].Abandoned != 1 {
		t.Errorf("cache ls --json: %d, %q; want 2 clones, 1 abandoned", st, stdout)
	}
	if st, _, stderr := runMain(t, "cache", "rm", "--dir", dir, "../x"); st == 0 || !strings.Contains(stderr, "cache name") {
		t.Errorf("cache rm ../x: %d, %q; want a refusal", st, stderr)
	}
	if st, _, stderr := runMain(t, "cache", "rm", "--dir", dir, "go-mod"); st != 0 {
		t.Fatalf("cache rm: %d, %q", st, stderr)
	}
	if st, stdout, _ := runMain(t, "cache", "ls", "--dir", dir, "--json"); st != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("cache ls --json after rm: %d, %q", st, stdout)
	}
	for _, p := range clones {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("clone %s after rm: %v; want it gone", p, err)
		}
	}
}

// TestExecCacheLimit: exec's --cache-limit bounds the store that its
// commits go to: with it, committing two caches twice leaves each its
// newest version alone (the older ones evicted across names); without
// it, each keeps the default two.
func TestExecCacheLimit(t *testing.T) {
	for _, tc := range []struct {
		limit    []string
		versions int
	}{{nil, 2}, {[]string{"--cache-limit", "1K"}, 1}} {
		t.Setenv("MICROVM_STATE_DIR", t.TempDir())
		app := newApp(nil, io.Discard, io.Discard)
		var o execOpts
		var readErr error
		for _, cmd := range app.Commands {
			if cmd.Name == "exec" {
				cmd.Action = func(c *cli.Context) error { readErr = o.readCacheFlags(c); return nil }
			}
		}
		args := append(append([]string{"microvm", "exec", "--cache", "a=/a", "--cache", "b=/b"}, tc.limit...), "--", "true")
		if err := app.Run(args); err != nil || readErr != nil || o.cacheStore == nil {
			t.Fatalf("%q: %v, %v, store %v", args, err, readErr, o.cacheStore)
		}
		for round := 0; round < 2; round++ {
			for _, name := range []string{"a", "b"} {
				cl, err := o.cacheStore.Checkout(context.Background(), name, 16<<20)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := o.cacheStore.Commit(cl); err != nil {
					t.Fatal(err)
				}
			}
		}
		infos, err := o.cacheStore.List()
		if err != nil || len(infos) != 2 {
			t.Fatalf("%q: %+v, %v; want two caches", tc.limit, infos, err)
		}
		for _, in := range infos {
			if in.Newest != 2 || in.Versions != tc.versions {
				t.Errorf("%q: cache %s: newest %d, %d versions; want 2 and %d", tc.limit, in.Name, in.Newest, in.Versions, tc.versions)
			}
		}
	}
}
