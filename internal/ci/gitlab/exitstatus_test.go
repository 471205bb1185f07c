package gitlab

import (
	"errors"
	"fmt"
	"testing"

	"github.com/microvm/microvm/internal/dockervm"
)

// TestExitStatus: under GitLab Runner a failed script is
// $BUILD_FAILURE_EXIT_CODE and anything else $SYSTEM_FAILURE_EXIT_CODE,
// said on stderr; outside it a failed script keeps its status, Docker's
// failure is dockervm.ExitStatus, and any other error has none here.
func TestExitStatus(t *testing.T) {
	build := fmt.Errorf("run: %w", BuildFailure{Stage: "step_script", Status: 3})
	docker := fmt.Errorf("prepare: %w", &dockervm.Error{Reason: "dockerd exited"})
	other := errors.New("prepare: mounting the cache: exit status 32")
	for _, tc := range []struct {
		build, system string
		err           error
		status        int
		say, ok       bool
	}{
		{err: build, status: 3, ok: true},
		{err: docker, status: dockervm.ExitStatus, say: true, ok: true},
		{err: other},
		{system: "32", err: build, status: 3, ok: true}, // only the build variable counts for a script
		{build: "31", system: "32", err: build, status: 31, ok: true},
		{build: "31", system: "32", err: docker, status: 32, say: true, ok: true},
		{build: "31", system: "32", err: other, status: 32, say: true, ok: true},
		{build: "31", system: "0", err: other},   // not a status
		{build: "31", system: "256", err: other}, // not a status
		{build: "31", system: "x", err: docker, status: dockervm.ExitStatus, say: true, ok: true},
	} {
		t.Setenv(envBuildFailure, tc.build)
		t.Setenv(envSystemFailure, tc.system)
		status, say, ok := ExitStatus(tc.err)
		if status != tc.status || say != tc.say || ok != tc.ok {
			t.Errorf("%s=%q %s=%q, %v: %d, %v, %v; want %d, %v, %v", envBuildFailure, tc.build, envSystemFailure, tc.system,
				tc.err, status, say, ok, tc.status, tc.say, tc.ok)
		}
	}
}
