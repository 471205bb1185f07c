package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/clibase"
)

// lockedBuffer is a bytes.Buffer safe for the progress goroutine and the
// test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestProgress: nothing before the first wait; then one line rewritten in
// place; erased at the end; nothing at all off a terminal or with --quiet.
func TestProgress(t *testing.T) {
	var quick lockedBuffer
	stop := runProgress(&quick, "booting", nil, time.Hour, time.Hour)
	stop()
	stop() // twice is harmless
	if quick.String() != "" {
		t.Errorf("a step shorter than the wait wrote %q", quick.String())
	}

	var slow lockedBuffer
	stop = runProgress(&slow, "booting", nil, 10*time.Millisecond, 10*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(slow.String(), "microvm: booting (") < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	out := slow.String()
	if n := strings.Count(out, "\r\x1b[Kmicrovm: booting ("); n < 2 {
		t.Errorf("output %q: want the line shown at least twice, each rewriting the last", out)
	}
	if strings.Contains(out, "\n") || !strings.HasSuffix(out, "\r\x1b[K") {
		t.Errorf("output %q: want no newline and the line erased at the end", out)
	}

	var buf bytes.Buffer
	startProgress(&buf, false, "booting")() // not a terminal
	if buf.Len() != 0 {
		t.Errorf("off a terminal: %q", buf.String())
	}
}

// TestLogFormat: --log-format json gives one JSON object a line; an
// unknown format is a usage error.
func TestLogFormat(t *testing.T) {
	var logged bytes.Buffer
	var got error
	app := &cli.App{Name: "t", Flags: cliFlags(clibase.LogFlags()), Writer: &bytes.Buffer{}, ErrWriter: &bytes.Buffer{},
		Action: func(c *cli.Context) error {
			l, err := clibase.SetupLog(c, &logged)
			if err != nil {
				got = err
				return nil
			}
			l.WithField("vm", "ci-1").Warn("hello")
			return nil
		}}
	if err := app.Run([]string{"t", "--log-format", "json"}); err != nil || got != nil {
		t.Fatal(err, got)
	}
	var entry map[string]any
	if err := json.Unmarshal(logged.Bytes(), &entry); err != nil || entry["msg"] != "hello" || entry["vm"] != "ci-1" || entry["level"] != "warning" {
		t.Errorf("json log %q: %v, %v", logged.String(), entry, err)
	}
	if err := app.Run([]string{"t", "--log-format", "xml"}); err != nil {
		t.Fatal(err)
	}
	var ue clibase.UsageError
	if !errors.As(got, &ue) || !strings.Contains(got.Error(), `--log-format "xml": want text or json`) {
		t.Errorf("--log-format xml: %v, want a usage error", got)
	}
}

// TestProgressDetail: the detail (a phase and a bar) follows what.
func TestProgressDetail(t *testing.T) {
	var b lockedBuffer
	stop := runProgress(&b, "image pull x", func() string { return progressBar("download", 1<<20, 4<<20) },
		time.Millisecond, time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), "%") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	want := "microvm: image pull x: downloading 1.0/4.0 MiB [#####...............] 25% ("
	if !strings.Contains(b.String(), want) {
		t.Errorf("output %q: want %q", b.String(), want)
	}
	if got := progressBar("convert", 1, 2); got != "making the ext4 root file system" {
		t.Errorf("unknown total: %q", got)
	}
	if got := progressBar("", 1, 2); got != "" {
		t.Errorf("no phase yet: %q", got)
	}
}
