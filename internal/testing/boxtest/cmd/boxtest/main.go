// Command boxtest runs, in the nested-KVM box, the tests testenv queued in
// RECORD_DIR/queue.txt (package boxtest). scripts/box-test builds and runs
// it:
//
//	scripts/box-test RECORD_DIR
//
// Environment: BOX_TIMEOUT (one box, default 16m), BOX_TEST_TIMEOUT (the
// test binary's -test.timeout in the box, default 12m: a CI job's whole
// scenario under TCG takes minutes), BOX_QUIET_TIMEOUT (a box whose tests
// printed nothing for this long is ended and rerun, default 8m, 0: never),
// BOX_BUDGET (no box starts after this long, default 50m), BOX_RERUNS
// (default 3), BOX_PARALLEL (boxes at once, default 1).
// Exit status: 0 when every queued test passed in the box, 1 when one
// failed, 2 on bad usage.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/microvm/microvm/internal/testing/boxtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "box-test: "+format+"\n", a...)
		return code
	}
	if len(args) != 2 {
		return fail(2, "usage: boxtest REPOSITORY RECORD_DIR")
	}
	root, err := filepath.Abs(args[0])
	if err != nil {
		return fail(2, "%v", err)
	}
	rec, err := filepath.Abs(args[1])
	if err != nil {
		return fail(2, "%v", err)
	}
	if !strings.HasPrefix(rec+"/", root+"/") {
		// Only the repository is shared read-write with the box.
		return fail(2, "%s is outside the repository %s: the box could not write there", rec, root)
	}
	c := boxtest.Config{Root: root, Record: rec, Kvmbox: []string{filepath.Join(root, "scripts", "kvmbox")}, Out: os.Stdout}
	for _, d := range []struct {
		env    string
		dst    *time.Duration
		def    time.Duration
		zeroOK bool // 0 turns the bound off
	}{
		{"BOX_TIMEOUT", &c.BoxTimeout, 16 * time.Minute, false},
		{"BOX_TEST_TIMEOUT", &c.TestTimeout, 12 * time.Minute, false},
		{"BOX_BUDGET", &c.Budget, 50 * time.Minute, false},
		{"BOX_QUIET_TIMEOUT", &c.QuietTimeout, 8 * time.Minute, true},
	} {
		*d.dst = d.def
		if s := os.Getenv(d.env); s != "" {
			v, err := time.ParseDuration(s)
			if err != nil || v < 0 || v == 0 && !d.zeroOK {
				if d.zeroOK {
					return fail(2, "%s=%q: want a duration like 8m (0: never)", d.env, s)
				}
				return fail(2, "%s=%q: want a positive duration like 10m", d.env, s)
			}
			*d.dst = v
		}
	}
	if c.TestTimeout >= c.BoxTimeout {
		return fail(2, "BOX_TEST_TIMEOUT %v must be shorter than BOX_TIMEOUT %v: a hung test should panic while the box still reports", c.TestTimeout, c.BoxTimeout)
	}
	c.Reruns = 3
	if s := os.Getenv("BOX_RERUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 5 {
			return fail(2, "BOX_RERUNS=%q: want 0..5", s)
		}
		c.Reruns = n
	}
	c.Parallel = 1
	if s := os.Getenv("BOX_PARALLEL"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 4 {
			return fail(2, "BOX_PARALLEL=%q: want 1..4 boxes at once", s)
		}
		c.Parallel = n
	}
	f, err := os.Open(filepath.Join(rec, "queue.txt"))
	if os.IsNotExist(err) {
		fmt.Println("box-test: no test needs the box on this host")
		return 0
	}
	if err != nil {
		return fail(1, "%v", err)
	}
	pkgs, err := boxtest.ReadQueue(f)
	f.Close()
	if err != nil {
		return fail(1, "%s: %v", f.Name(), err)
	}
	if len(pkgs) == 0 {
		fmt.Println("box-test: no test needs the box on this host")
		return 0
	}
	if err := boxtest.Run(ctx, c, pkgs); err != nil {
		return fail(1, "%v", err)
	}
	return 0
}
