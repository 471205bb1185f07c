package namedvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/execvm"
)

// TestFinishCachesLine: a run whose caches are not kept says so in one
// line naming them and why; a run without caches says nothing.
func TestFinishCachesLine(t *testing.T) {
	var buf bytes.Buffer
	log := logrus.New()
	log.SetOutput(&buf)
	if err := FinishCaches(nil, errors.New("exit status 1"), log); err != nil || buf.Len() != 0 {
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
