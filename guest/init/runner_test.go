package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// stubNet is a Network with a fixed LocalCID answer and nothing else.
type stubNet struct{ Network }

func (stubNet) LocalCID() (uint32, error) { return 3, nil }

func runWith(t *testing.T, reg Registry, net Network, cmdline string) ([]string, bool, time.Duration) {
	t.Helper()
	p, err := ParseCmdline(cmdline)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r := &Runner{Registry: reg, Net: net, DefaultTimeout: 5 * time.Second, Grace: 100 * time.Millisecond}
	start := time.Now()
	ok := r.Run(context.Background(), p, &out)
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"), ok, time.Since(start)
}

func TestRunnerOutput(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	reg := NewRegistry(
		&Scenario{Name: "good", Run: func(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
			env.Progress("listening port=%d", p.Uint32("port", 1))
			return "x=1", nil
		}},
		&Scenario{Name: "bad", Run: func(context.Context, *Env, *ScenarioParams) (string, error) {
			return "", errors.New("two\nlines")
		}},
		&Scenario{Name: "boom", Run: func(context.Context, *Env, *ScenarioParams) (string, error) {
			var m map[string]int
			m["x"] = 1 // nil map write: a runtime panic
			return "", nil
		}},
		&Scenario{Name: "hang", Run: func(context.Context, *Env, *ScenarioParams) (string, error) {
			<-release // ignores its context
			return "", nil
		}},
		&Scenario{Name: "late", Run: func(ctx context.Context, _ *Env, _ *ScenarioParams) (string, error) {
			<-ctx.Done()
			return "", ctx.Err()
		}},
		&Scenario{Name: "needsvsock", Vsock: true, Run: func(context.Context, *Env, *ScenarioParams) (string, error) {
			return "", errors.New("must not run")
		}},
	)
	lines, ok, elapsed := runWith(t, reg, stubNet{},
		"microvm.scenarios=good,bad,nosuch,boom,hang,late,good microvm.good.port=7 microvm.hang.timeout=50ms "+
			"microvm.late.timeout=20ms microvm.bad.timeout=soon microvm.extra=1")
	if ok {
		t.Error("Run reported success")
	}
	// Drop panic stack lines; check that there were some.
	var kept []string
	stack := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "init: scenario boom panic: ") {
			stack++
			continue
		}
		kept = append(kept, l)
	}
	if stack < 2 {
		t.Errorf("want a panic stack, got %d lines", stack)
	}
	want := []string{
		"init: vsock cid=3",
		"init: scenario good start",
		"init: scenario good listening port=7",
		"init: scenario good ok x=1",
		`init: scenario bad FAIL bad parameter microvm.bad.timeout="soon": want a duration such as 500ms, 30s or 2m`,
		"init: scenario nosuch FAIL unknown scenario (known: bad,boom,good,hang,late,needsvsock)",
		"init: scenario boom start",
		"init: scenario boom FAIL panic: assignment to entry in nil map",
		"init: scenario hang start",
		"init: scenario hang FAIL timed out after 50ms (hung: still running 100ms later)",
		"init: scenario late start",
		"init: scenario late FAIL timed out after 20ms: context deadline exceeded",
		"init: scenario good start",
		"init: scenario good listening port=7",
		"init: scenario good ok x=1",
		"init: warning: parameter microvm.extra was not used by any scenario",
		"init: done fail",
	}
	if diff := cmp.Diff(want, kept); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	if elapsed > 2*time.Second {
		t.Errorf("took %v: a hung scenario was not bounded", elapsed)
	}
}

func TestRunnerMultiLineError(t *testing.T) {
	reg := NewRegistry(&Scenario{Name: "bad", Run: func(context.Context, *Env, *ScenarioParams) (string, error) {
		return "", errors.New("two\nlines")
	}})
	lines, ok, _ := runWith(t, reg, stubNet{}, "microvm.scenarios=bad")
	want := []string{"init: vsock cid=3", "init: scenario bad start", "init: scenario bad FAIL two | lines", "init: done fail"}
	if diff := cmp.Diff(want, lines); diff != "" || ok {
		t.Errorf("ok=%v, output (-want +got):\n%s", ok, diff)
	}
}

type noVsock struct{ Network }

func (noVsock) LocalCID() (uint32, error) { return 0, errors.New("vsock: no transport") }

func TestRunnerNoVsock(t *testing.T) {
	lines, ok, elapsed := runWith(t, scenarios, noVsock{}, "microvm.scenarios=echo,refused")
	want := []string{
		"init: vsock unavailable: vsock: no transport",
		"init: scenario echo FAIL needs vsock: vsock: no transport",
		"init: scenario refused FAIL needs vsock: vsock: no transport",
		"init: done fail",
	}
	if diff := cmp.Diff(want, lines); diff != "" || ok {
		t.Errorf("ok=%v, output (-want +got):\n%s", ok, diff)
	}
	if elapsed > time.Second {
		t.Errorf("took %v, want an immediate failure", elapsed)
	}
}

func TestRunnerNoScenarios(t *testing.T) {
	lines, ok, _ := runWith(t, NewRegistry(), stubNet{}, "console=ttyS0")
	want := []string{"init: vsock cid=3", "init: no scenarios (set microvm.scenarios=NAME,...; known: )", "init: done ok"}
	if diff := cmp.Diff(want, lines); diff != "" || !ok {
		t.Errorf("ok=%v, output (-want +got):\n%s", ok, diff)
	}
}

func TestRegistryTable(t *testing.T) {
	want := []string{"concurrent", "connect", "echo", "halfclose-guest", "halfclose-host", "loopback", "recv", "refused", "send", "seqpacket", "seqpacket-echo", "slowreader", "urandom"}
	if diff := cmp.Diff(want, scenarios.Names()); diff != "" {
		t.Errorf("scenario names (-want +got):\n%s", diff)
	}
	for name, s := range scenarios {
		if s.Name != name || s.Doc == "" || s.Run == nil || s.Vsock == (name == "loopback") {
			t.Errorf("scenario %q incomplete: %+v", name, s)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("NewRegistry accepted a duplicate name")
		}
	}()
	NewRegistry(&Scenario{Name: "a"}, &Scenario{Name: "a"})
}
