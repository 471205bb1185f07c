package namedvm

import (
	"errors"
	"strings"
	"testing"
)

// TestSetupFailure: a setup that has not ended, or that ended well or
// only because the VM was ending anyway, is no failure; one whose Setup
// failed is a SetupError with the setup's status that still unwraps to
// the cause; one whose wait for the agent failed is a FailedError with
// the failure status.
func TestSetupFailure(t *testing.T) {
	cause := errors.New("dockerd exited")
	pending := &setupRun{done: make(chan struct{})}
	if st, err := pending.failure("v", 122, 125); st != 0 || err != nil {
		t.Errorf("pending: %d, %v; want 0, nil", st, err)
	}
	ended := func(e setupEnd) *setupRun {
		s := &setupRun{done: make(chan struct{})}
		s.run(func() setupEnd { return e }, func(error) {})
		return s
	}
	for _, e := range []setupEnd{{}, {err: cause}} {
		if st, err := ended(e).failure("v", 122, 125); st != 0 || err != nil {
			t.Errorf("%+v: %d, %v; want 0, nil", e, st, err)
		}
	}
	st, err := ended(setupEnd{err: cause, failed: true, inSetup: true}).failure("v", 122, 125)
	var se SetupError
	if st != 122 || !errors.As(err, &se) || se.Status != 122 || !errors.Is(err, cause) || err.Error() != "VM v: dockerd exited" {
		t.Errorf("setup failed: %d, %#v", st, err)
	}
	st, err = ended(setupEnd{err: cause, failed: true}).failure("v", 122, 125)
	var fe FailedError
	if st != 125 || !errors.As(err, &fe) || errors.As(err, &se) || !strings.Contains(err.Error(), "microvm logs v") {
		t.Errorf("agent wait failed: %d, %#v", st, err)
	}
}

// TestSetupRunCancels: a failed setup stops the VM with its error, once
// its end can be read; one that did not fail stops nothing.
func TestSetupRunCancels(t *testing.T) {
	cause := errors.New("no dockerd")
	for _, e := range []setupEnd{{}, {err: cause}, {err: cause, failed: true, inSetup: true}} {
		s := &setupRun{done: make(chan struct{})}
		var got error
		s.run(func() setupEnd { return e }, func(err error) {
			select {
			case <-s.done:
			default:
				t.Error("cancelled before done was closed")
			}
			got = err
		})
		want := error(nil)
		if e.failed {
			want = cause
		}
		if got != want {
			t.Errorf("%+v: cancelled with %v, want %v", e, got, want)
		}
	}
}
