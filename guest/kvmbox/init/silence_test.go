package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/kvmbox"
)

func TestTaskStat(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ stat, name, state string }{
		{"42 (cli.test) S 1 42 42 0 -1", "cli.test", "S"},
		{"7 (a (b) c) D 1 7", "a (b) c", "D"},
		{"9 (x)", "x", "?"},
		{"garbage", "?", "?"},
	} {
		if err := os.WriteFile(dir+"/stat", []byte(tc.stat), 0o644); err != nil {
			t.Fatal(err)
		}
		if name, state := taskStat(dir); name != tc.name || state != tc.state {
			t.Errorf("taskStat(%q) = %q, %q; want %q, %q", tc.stat, name, state, tc.name, tc.state)
		}
	}
	if name, state := taskStat(dir + "/gone"); name != "?" || state != "?" {
		t.Errorf("a thread that ended: %q, %q", name, state)
	}
}

// TestReportTasks: the report names this test's own threads, between its
// first and last lines.
func TestReportTasks(t *testing.T) {
	var b strings.Builder
	reportTasks(&b, time.Minute)
	out := b.String()
	if !strings.HasPrefix(out, "kvmbox-init: the command printed nothing for 1m0s") || !strings.HasSuffix(out, "end of the report\n") {
		t.Errorf("report not framed:\n%.2000s", out)
	}
	me := fmt.Sprintf("kvmbox-init: pid %d tid %d ", os.Getpid(), os.Getpid())
	if !strings.Contains(out, me) {
		t.Errorf("report lacks %q:\n%.4000s", me, out)
	}
}

// TestWatchSilence: one report per silence, none while output flows, a new
// one after output resumed and stopped again.
func TestWatchSilence(t *testing.T) {
	const after = 200 * time.Millisecond
	clock := kvmbox.NewOutputClock()
	printOut := func() { _, _ = clock.Writer(io.Discard).Write([]byte("x")) }
	reports := make(chan struct{}, 10)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		watchSilence(clock, after, done, func() { reports <- struct{}{} })
	}()
	// Output for 3 silences' worth: no report.
	for range 15 {
		printOut()
		time.Sleep(after / 5)
	}
	if n := len(reports); n != 0 {
		t.Fatalf("%d report(s) while the command printed", n)
	}
	// Silence for 4 of them: exactly one report.
	time.Sleep(4 * after)
	if n := len(reports); n != 1 {
		t.Fatalf("%d report(s) after a long silence, want 1", n)
	}
	// Output again, then silence: a second report.
	printOut()
	time.Sleep(3 * after)
	close(done)
	<-ended
	if n := len(reports); n != 2 {
		t.Errorf("%d report(s) after a second silence, want 2", n)
	}
}
