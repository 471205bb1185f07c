// Package boxtest runs in the nested-KVM box the Go tests that could not run
// on this host: testenv.RequireKVM queued them in RECORD/queue.txt as
// "PACKAGE_DIR TestName" lines, or "PACKAGE_DIR TestName alone" for a test
// that gets a box of its own (testenv.RequireKVMAlone: long tests that
// would otherwise push their package's box past TestTimeout). make test
// runs it through scripts/box-test (docs/testing.md).
//
// Data flow:
//
//	queue.txt ──▶ ReadQueue ──▶ per package: go test -c on the host (TCG is slow), while the boxes run
//	  round 0..Reruns: per package with tests left (and per "alone" test), one fresh box:
//	    scripts/kvmbox --timeout BoxTimeout --quiet-timeout QuietTimeout -- sh -c 'cd PKG && BIN -test.run ^(T1|T2)$ -test.v -test.timeout TestTimeout'
//	    stdout+stderr ──▶ Out and RECORD/box-PKG[.rerunN].log ──▶ ParseLog ──▶ Judge
//	    Judge: passed | real failure (final) | rerun (box artefact, RECORD/reruns.txt)
//
// One box a package keeps a dead box from taking every package's tests with
// it; BoxTimeout bounds a box whose L1 kernel stops answering, TestTimeout
// (shorter) makes a hung test panic with its goroutines while the box still
// reports, QuietTimeout ends a box whose output stopped, and Budget bounds
// the whole stage: no box starts after it, and a rerun gets what is left.
//
// The test binaries are built one after another on a goroutine of their
// own, in the order the boxes run (a box waits for its own binary only);
// the boxes run on the caller's goroutine, one at a time (Parallel: more).
package boxtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Package is one box's worth of queued tests: a package's tests, or one
// test of it that runs alone.
type Package struct {
	Dir   string // relative to the repository root
	Tests []string
	Alone bool // Tests is one test queued "alone": a box of its own
}

// box names p's box in file names and messages.
func (p Package) box() string {
	if p.Alone {
		return p.Dir + ":" + p.Tests[0]
	}
	return p.Dir
}

// ReadQueue reads queue.txt: "PACKAGE_DIR TestName [alone]" lines,
// duplicates allowed (a test queues itself once per run). A test queued
// alone anywhere runs alone.
func ReadQueue(r io.Reader) ([]Package, error) {
	byDir := map[string]map[string]bool{} // dir -> test -> alone
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 || len(f) > 3 || len(f) == 3 && f[2] != "alone" ||
			!testName.MatchString(f[1]) || filepath.IsAbs(f[0]) || strings.Contains(f[0], "..") {
			return nil, fmt.Errorf("queue line %d: %q: want \"PACKAGE_DIR TestName [alone]\"", n, sc.Text())
		}
		if byDir[f[0]] == nil {
			byDir[f[0]] = map[string]bool{}
		}
		byDir[f[0]][f[1]] = byDir[f[0]][f[1]] || len(f) == 3
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var pkgs []Package
	for dir, tests := range byDir {
		p := Package{Dir: dir}
		for t, alone := range tests {
			if alone {
				pkgs = append(pkgs, Package{Dir: dir, Tests: []string{t}, Alone: true})
			} else {
				p.Tests = append(p.Tests, t)
			}
		}
		if len(p.Tests) > 0 {
			sort.Strings(p.Tests)
			pkgs = append(pkgs, p)
		}
	}
	// The package's shared box first, then its lone tests by name.
	sort.Slice(pkgs, func(i, j int) bool {
		a, b := pkgs[i], pkgs[j]
		if a.Dir != b.Dir {
			return a.Dir < b.Dir
		}
		if a.Alone != b.Alone {
			return !a.Alone
		}
		return a.Tests[0] < b.Tests[0]
	})
	return pkgs, nil
}

// Config is one box-test stage.
type Config struct {
	Root   string // the repository
	Record string // the record directory (inside Root: the box writes there)
	// Kvmbox is the box's command line before "--" (scripts/kvmbox).
	Kvmbox []string
	// BoxTimeout bounds one box; TestTimeout is the test binary's
	// -test.timeout inside it; Budget bounds the stage. A rerun box that
	// would end past the budget gets what is left, both timeouts shrunk in
	// proportion, if that is at least a quarter of BoxTimeout.
	BoxTimeout, TestTimeout, Budget time.Duration
	// QuietTimeout ends a box whose tests printed nothing for this long
	// (kvmbox --quiet-timeout; 0: never): a box artefact, rerun.
	QuietTimeout time.Duration
	// Reruns is how many more rounds the box's artefacts get.
	Reruns int
	// Parallel is how many boxes run at once (0 or 1: one at a time, each
	// box's output streamed as it comes). With more, a box's output goes
	// to Out whole when the box ends, so boxes do not interleave.
	Parallel int
	Out      io.Writer
	// Build makes pkg's test binary at bin (nil: go test -c).
	Build func(ctx context.Context, pkg, bin string) error
}

func (c Config) build(ctx context.Context, pkg, bin string) error {
	if c.Build != nil {
		return c.Build(ctx, pkg, bin)
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./"+pkg)
	cmd.Dir = c.Root
	out, err := cmd.CombinedOutput()
	if err != nil && len(out) > 0 {
		return fmt.Errorf("%w\n%s", err, bytes.TrimRight(out, "\n"))
	}
	return err
}

// ExitBoxFailure is scripts/kvmbox's status when the box itself failed.
const ExitBoxFailure = 125

// Run runs the queued tests and returns nil when every one passed (or
// skipped) in the box.
func Run(ctx context.Context, c Config, pkgs []Package) error {
	start := time.Now()
	bindir := filepath.Join(c.Root, "build", "boxtest")
	if err := os.RemoveAll(bindir); err != nil {
		return err
	}
	if err := os.MkdirAll(bindir, 0o755); err != nil {
		return err
	}
	total := 0
	for _, p := range pkgs {
		total += len(p.Tests)
		fmt.Fprintf(c.Out, "box-test: %s: %d test(s): %s\n", p.box(), len(p.Tests), strings.Join(p.Tests, " "))
	}
	// Built while the first boxes run; the build goroutine ends with ctx
	// or its last build, and a box waits for its own binary only.
	bctx, stopBuilds := context.WithCancel(ctx)
	defer stopBuilds()
	bins := c.buildAll(bctx, pkgs, bindir)
	fmt.Fprintf(c.Out, "box-test: %d test(s) in %d box(es), one fresh box per package and per lone test (box timeout %v, test timeout %v, quiet timeout %v, stage budget %v)\n",
		total, len(pkgs), c.BoxTimeout, c.TestTimeout, c.QuietTimeout, c.Budget)

	if c.Parallel > 1 {
		c.Out = &lockedWriter{w: c.Out}
	}
	failed := map[string]string{} // "pkg Test" -> why
	pending := pkgs
	for round := 0; round <= c.Reruns && len(pending) > 0; round++ {
		next, err := c.runRound(ctx, pending, bins, round, start, failed)
		if err != nil {
			return err
		}
		if round == c.Reruns {
			for _, q := range next {
				for _, t := range q.Tests {
					failed[q.Dir+" "+t] = fmt.Sprintf("still failing after %d rerun(s) in a fresh box", c.Reruns)
				}
			}
		} else if len(next) > 0 {
			fmt.Fprintf(c.Out, "box-test: rerun %d of %d in fresh boxes: %s\n", round+1, c.Reruns, names(next))
		}
		pending = next
	}
	fmt.Fprintf(c.Out, "box-test: done in %v\n", time.Since(start).Round(time.Second))
	if len(failed) == 0 {
		return nil
	}
	keys := make([]string, 0, len(failed))
	for k := range failed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %s", k, failed[k])
	}
	return fmt.Errorf("box-test: %d test(s) failed in the box:%s", len(keys), b.String())
}

// binary is one package's test binary, built on buildAll's goroutine:
// path and err are set before done closes.
type binary struct {
	path string
	err  error
	done chan struct{}
}

// buildAll builds the test binary of each package in pkgs into bindir, one
// after another in pkgs' order (the order their boxes run), on a goroutine
// of its own: the first box starts once its own binary is linked instead
// of after all of them (about 20 s of links on 2 cores with a warm build
// cache), and the builds fill the core a box leaves idle. A build's output
// is kept and shown with its error, so it does not interleave with a
// streaming box.
func (c Config) buildAll(ctx context.Context, pkgs []Package, bindir string) map[string]*binary {
	bins := map[string]*binary{}
	var order []*binary
	var dirs []string
	for _, p := range pkgs {
		if bins[p.Dir] == nil {
			b := &binary{path: filepath.Join(bindir, fileName(p.Dir)+".test"), done: make(chan struct{})}
			bins[p.Dir] = b
			order = append(order, b)
			dirs = append(dirs, p.Dir)
		}
	}
	go func() {
		for i, b := range order {
			b.err = c.build(ctx, dirs[i], b.path)
			if b.err != nil {
				b.err = fmt.Errorf("box-test: go test -c ./%s: %w", dirs[i], b.err)
			}
			close(b.done)
		}
	}()
	return bins
}

// wait returns b's path once it is built.
func (b *binary) wait(ctx context.Context) (string, error) {
	select {
	case <-b.done:
		return b.path, b.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// runRound runs one round's boxes, c.Parallel at a time, adding to failed
// what failed for good, and returns the packages whose tests the boxes'
// own artefacts explain (to rerun), in pending's order. A box starts only
// while the stage's budget lasts (limits); the tests of those that cannot
// start fail as not run.
func (c Config) runRound(ctx context.Context, pending []Package, bins map[string]*binary, round int, start time.Time, failed map[string]string) ([]Package, error) {
	var (
		mu    sync.Mutex // guards failed, reruns, firstErr and the reruns record
		wg    sync.WaitGroup
		slots = make(chan struct{}, max(c.Parallel, 1))
	)
	reruns := make([]Package, len(pending))
	var firstErr error
	for i, p := range pending {
		slots <- struct{}{}
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		elapsed := time.Since(start)
		lim, ok := c.limits(round, elapsed)
		if stop || !ok {
			<-slots
			if !ok {
				mu.Lock()
				for _, q := range pending[i:] {
					for _, t := range q.Tests {
						failed[q.Dir+" "+t] = fmt.Sprintf("not run: the box stage's budget (%v) ran out after %v", c.Budget, elapsed.Round(time.Second))
					}
				}
				mu.Unlock()
			}
			break
		}
		if lim.box < c.BoxTimeout {
			fmt.Fprintf(c.Out, "box-test: %s: box timeout %v, test timeout %v: what the stage's budget has left\n",
				p.box(), lim.box.Round(time.Second), lim.test.Round(time.Second))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			bin, err := bins[p.Dir].wait(ctx)
			var v Verdict
			if err == nil {
				v, err = c.runBox(ctx, p, bin, round, lim)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			for t, why := range v.Failed {
				failed[p.Dir+" "+t] = why
			}
			q := Package{Dir: p.Dir, Alone: p.Alone}
			for _, t := range p.Tests {
				if r, ok := v.Rerun[t]; ok {
					q.Tests = append(q.Tests, t)
					if err := appendLine(filepath.Join(c.Record, "reruns.txt"), fmt.Sprintf("%s %s %s", p.Dir, t, r)); err != nil && firstErr == nil {
						firstErr = err
					}
					fmt.Fprintf(c.Out, "box-test: %s %s: %s\n", p.Dir, t, r)
				}
			}
			reruns[i] = q
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	var next []Package
	for _, q := range reruns {
		if len(q.Tests) > 0 {
			next = append(next, q)
		}
	}
	return next, nil
}

// lockedWriter serializes the writes of boxes that run at once.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// boxLimits are one box's timeouts.
type boxLimits struct{ box, test time.Duration }

// limits are the timeouts of a box of round (0: the first) started elapsed
// into the stage, and false when no box may start: past the budget, or a
// rerun with less than a quarter of BoxTimeout left. A first-round box
// keeps the full timeouts: the budget was sized for them.
func (c Config) limits(round int, elapsed time.Duration) (boxLimits, bool) {
	left := c.Budget - elapsed
	full := boxLimits{c.BoxTimeout, c.TestTimeout}
	switch {
	case left <= 0:
		return boxLimits{}, false
	case round == 0 || left >= c.BoxTimeout:
		return full, true
	case left < c.BoxTimeout/4:
		return boxLimits{}, false
	}
	scale := float64(left) / float64(c.BoxTimeout)
	return boxLimits{left.Truncate(time.Second), time.Duration(float64(c.TestTimeout) * scale).Truncate(time.Second)}, true
}

// runBox runs p's tests in one fresh box and judges them.
func (c Config) runBox(ctx context.Context, p Package, bin string, round int, lim boxLimits) (Verdict, error) {
	name := fileName(p.Dir)
	if p.Alone {
		name += "." + p.Tests[0]
	}
	if round > 0 {
		name += fmt.Sprintf(".rerun%d", round)
	}
	logPath := filepath.Join(c.Record, "box-"+name+".log")
	console := filepath.Join(c.Record, "console-"+name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return Verdict{}, err
	}
	defer logf.Close()
	// ReadQueue let only \w names through: safe in a regexp and a shell word.
	re := "^(" + strings.Join(p.Tests, "|") + ")$"
	script := fmt.Sprintf("cd %s && exec %s -test.run '%s' -test.v -test.timeout %s",
		shellQuote(filepath.Join(c.Root, p.Dir)), shellQuote(bin), re, lim.test)
	args := append(slices.Clone(c.Kvmbox[1:]), "--timeout", lim.box.String(), "--console-log", console)
	if c.QuietTimeout > 0 {
		args = append(args, "--quiet-timeout", c.QuietTimeout.String())
	}
	args = append(args, "--", "sh", "-c", script)
	cmd := exec.CommandContext(ctx, c.Kvmbox[0], args...)
	cmd.Dir = c.Root
	var w io.Writer = logf
	if c.Parallel <= 1 {
		w = io.MultiWriter(c.Out, logf)
	}
	cmd.Stdout, cmd.Stderr = w, w
	fmt.Fprintf(c.Out, "box-test: %s: box for %s\n", p.box(), strings.Join(p.Tests, " "))
	begin := time.Now()
	err = cmd.Run()
	status := 0
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		status = ee.ExitCode()
	default:
		return Verdict{}, fmt.Errorf("box-test: %s: %w", p.Dir, err)
	}
	took := time.Since(begin)
	if c.Parallel > 1 {
		// The box's whole output at once (one write: c.Out is locked).
		if b, err := os.ReadFile(logPath); err == nil {
			fmt.Fprintf(c.Out, "box-test: %s: the box's output:\n%s", p.box(), b)
		}
	}
	boxFailed := status == ExitBoxFailure
	fmt.Fprintf(c.Out, "box-test: %s: box ended in %v with status %d%s\n", p.box(),
		took.Round(time.Second), status, map[bool]string{true: " (the box itself failed)"}[boxFailed])
	// For make test's table of where the time went (scripts/test-times).
	if err := appendLine(filepath.Join(c.Record, "boxes.txt"),
		fmt.Sprintf("%s %d %.3f %d %s", p.box(), round, took.Seconds(), status, strings.Join(p.Tests, " "))); err != nil {
		return Verdict{}, err
	}
	cons, consErr := os.ReadFile(console)
	l1Oops := L1Oops.Match(cons)
	if boxFailed || l1Oops {
		c.printConsoleTail(console, cons, consErr, 40)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		return Verdict{}, err
	}
	l := ParseLog(b)
	v := Judge(p.Tests, l, status, boxFailed, l1Oops)
	for t, r := range v.Rerun {
		if r != ReasonBootStall {
			continue
		}
		if ev := StallEvidence(l.Tests[t].Output, filepath.Join(c.Root, "build", "kernel", "vmlinux")); ev != "" {
			fmt.Fprintf(c.Out, "box-test: %s %s: the guest kernel stopped booting: %s\n", p.Dir, t, ev)
		}
	}
	return v, nil
}

// printConsoleTail shows the end of the L1 kernel's console (b, read from
// path with err), which is what tells why a box died.
func (c Config) printConsoleTail(path string, b []byte, err error, n int) {
	if err != nil {
		fmt.Fprintf(c.Out, "box-test: no L1 console log: %v\n", err)
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	fmt.Fprintf(c.Out, "box-test: the last %d lines of the L1 console (%s):\n", len(lines), path)
	for _, l := range lines {
		fmt.Fprintf(c.Out, "  | %s\n", l)
	}
}

func names(pkgs []Package) string {
	var s []string
	for _, p := range pkgs {
		for _, t := range p.Tests {
			s = append(s, p.Dir+"/"+t)
		}
	}
	return strings.Join(s, " ")
}

// fileName turns a package directory into a file name ("." is the root).
func fileName(dir string) string {
	return strings.NewReplacer("/", "_", ".", "_").Replace(dir)
}

// testName is what ReadQueue accepts as a test's name.
var testName = regexp.MustCompile(`^Test\w*$`)

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
