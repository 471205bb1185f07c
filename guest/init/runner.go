package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"
)

// Scenario is one named check /init can run. Run returns a short
// space-separated key=value summary on success. It must return soon after ctx
// ends; the runner still bounds a scenario that does not.
type Scenario struct {
	Name  string
	Doc   string // one line, shown by -list and in docs/guest-linux.md
	Vsock bool   // needs a vsock transport: fails at once without one
	Run   func(ctx context.Context, env *Env, p *ScenarioParams) (details string, err error)
}

// Registry maps scenario names to scenarios.
type Registry map[string]*Scenario

// NewRegistry builds a registry; a duplicate name is a programming error.
func NewRegistry(list ...*Scenario) Registry {
	r := Registry{}
	for _, s := range list {
		if _, dup := r[s.Name]; dup {
			panic("init: duplicate scenario " + s.Name)
		}
		r[s.Name] = s
	}
	return r
}

// Names returns the registered names, sorted.
func (r Registry) Names() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Env is what a running scenario gets besides its parameters.
type Env struct {
	Net  Network
	name string
	out  *console
}

// Progress prints "init: scenario NAME MESSAGE", e.g. that a listener is up,
// so that the host knows when to connect. Result lines are printed by the
// runner, never by scenarios.
func (e *Env) Progress(format string, args ...any) {
	e.out.printf("init: scenario %s %s", e.name, fmt.Sprintf(format, args...))
}

// console serializes whole lines onto the output: the kernel writes to the
// same console, and each line must reach it in a single write.
type console struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *console) printf(format string, args ...any) {
	line := oneLine(fmt.Sprintf(format, args...)) + "\n"
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.w, line) // nothing useful to do if the console fails
}

// oneLine keeps a result on one console line.
func oneLine(s string) string {
	return strings.NewReplacer("\r", " ", "\n", " | ").Replace(strings.TrimRight(s, "\n"))
}

// Runner runs the scenarios named by microvm.scenarios, one after the other.
type Runner struct {
	Registry Registry
	Net      Network
	// DefaultTimeout bounds each scenario unless microvm.timeout or
	// microvm.NAME.timeout says otherwise (0: no bound).
	DefaultTimeout time.Duration
	// Grace is how long past its timeout a scenario that ignores its context
	// is waited for before it is reported as hung and abandoned.
	Grace time.Duration
}

// Run runs the scenarios, printing one result line each and a final
// "init: done ok|fail" line on out. It reports whether all passed.
func (r *Runner) Run(ctx context.Context, params *Params, out io.Writer) bool {
	con := &console{w: out}
	cid, cidErr := r.Net.LocalCID()
	if cidErr != nil {
		con.printf("init: vsock unavailable: %v", cidErr)
	} else {
		con.printf("init: vsock cid=%d", cid)
	}
	names := params.Scenarios()
	if len(names) == 0 {
		con.printf("init: no scenarios (set microvm.scenarios=NAME,...; known: %s)", strings.Join(r.Registry.Names(), ","))
	}
	allOK := true
	for _, name := range names {
		details, err := r.runOne(ctx, name, params, cidErr, con)
		if err != nil {
			allOK = false
			con.printf("init: scenario %s FAIL %v", name, err)
		} else {
			con.printf("init: scenario %s ok %s", name, details)
		}
	}
	for _, p := range params.Unused() {
		con.printf("init: warning: parameter %s was not used by any scenario", p)
	}
	if allOK {
		con.printf("init: done ok")
	} else {
		con.printf("init: done fail")
	}
	return allOK
}

type outcome struct {
	details string
	err     error
}

func (r *Runner) runOne(ctx context.Context, name string, params *Params, cidErr error, con *console) (string, error) {
	sc := r.Registry[name]
	if sc == nil {
		return "", fmt.Errorf("unknown scenario (known: %s)", strings.Join(r.Registry.Names(), ","))
	}
	sp := params.For(name)
	timeout := sp.Duration("timeout", r.DefaultTimeout)
	if err := sp.Err(); err != nil {
		return "", err
	}
	if sc.Vsock && cidErr != nil {
		return "", fmt.Errorf("needs vsock: %v", cidErr)
	}
	con.printf("init: scenario %s start", name)

	sctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	env := &Env{Net: r.Net, name: name, out: con}
	done := make(chan outcome, 1) // buffered: an abandoned scenario must not block
	go func() {
		defer func() {
			if v := recover(); v != nil {
				for _, l := range strings.Split(strings.TrimSpace(string(debug.Stack())), "\n") {
					con.printf("init: scenario %s panic: %s", name, l)
				}
				done <- outcome{err: fmt.Errorf("panic: %v", v)}
			}
		}()
		d, err := sc.Run(sctx, env, sp)
		done <- outcome{d, err}
	}()

	timedOut := func(o outcome) (string, error) {
		if o.err == nil && errors.Is(sctx.Err(), context.DeadlineExceeded) {
			// Finished successfully right at the deadline: count it.
			return o.details, nil
		}
		if errors.Is(sctx.Err(), context.DeadlineExceeded) {
			return "", fmt.Errorf("timed out after %v: %w", timeout, o.err)
		}
		return o.details, o.err
	}
	select {
	case o := <-done:
		return timedOut(o)
	case <-sctx.Done():
	}
	select {
	case o := <-done:
		return timedOut(o)
	case <-time.After(r.Grace):
		return "", fmt.Errorf("timed out after %v (hung: still running %v later)", timeout, r.Grace)
	}
}
