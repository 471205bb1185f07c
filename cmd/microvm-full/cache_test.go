package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

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
	} {
		st, _, stderr := runMain(t, tc.args...)
		if st != microvm.StatusUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: status %d, %q; want %d and %q", tc.args, st, stderr, microvm.StatusUsage, tc.want)
		}
	}
}

// TestCacheLsRm lists and removes a cache that a job committed.
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
	st, stdout, stderr := runMain(t, "cache", "ls", "--dir", dir)
	if st != 0 || !strings.HasPrefix(stdout, "NAME") || !strings.Contains(stdout, "go-mod") || !strings.Contains(stdout, "16M") {
		t.Fatalf("cache ls: %d, %q, %q", st, stdout, stderr)
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
}
