package microvm_test

// Copies of test helpers that the internal tests of package microvm keep
// in metrics_test.go and vsock_test.go: the external tests cannot reach
// those, and the internal ones still need them.

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// exposition is a parsed Prometheus text exposition: each series (name and
// labels as written) with its value, and each family's type.
type exposition struct {
	values map[string]float64
	types  map[string]string
	order  []string // families in order
}

var (
	helpRE   = regexp.MustCompile(`^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$`)
	typeRE   = regexp.MustCompile(`^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$`)
	sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)?\})? (\S+)$`)
)

// parseExposition checks text against the format, version 0.0.4, as
// strictly as microvm writes it: every family is HELP then TYPE then at
// least one sample of that family, families and series appear once,
// counters end in _total and gauges do not, and every value parses.
func parseExposition(tb testing.TB, text string) exposition {
	tb.Helper()
	e := exposition{values: map[string]float64{}, types: map[string]string{}}
	if !strings.HasSuffix(text, "\n") {
		tb.Fatalf("exposition does not end with a newline")
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	family, samples := "", 0
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := helpRE.FindStringSubmatch(l); m != nil {
			if family != "" && samples == 0 {
				tb.Errorf("family %s has no samples", family)
			}
			family, samples = m[1], 0
			if _, dup := e.types[family]; dup {
				tb.Errorf("family %s appears twice", family)
			}
			if i+1 >= len(lines) {
				tb.Fatalf("line %d: HELP without TYPE", i+1)
			}
			i++
			t := typeRE.FindStringSubmatch(lines[i])
			if t == nil || t[1] != family {
				tb.Fatalf("line %d: %q: want the TYPE line of %s", i+1, lines[i], family)
			}
			e.types[family] = t[2]
			e.order = append(e.order, family)
			if (t[2] == "counter") != strings.HasSuffix(family, "_total") {
				tb.Errorf("family %s of type %s: counters and only counters end in _total", family, t[2])
			}
			continue
		}
		m := sampleRE.FindStringSubmatch(l)
		if m == nil {
			tb.Fatalf("line %d: %q is neither HELP, TYPE nor a sample", i+1, l)
		}
		if m[1] != family {
			tb.Fatalf("line %d: sample of %s inside family %q", i+1, m[1], family)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			tb.Fatalf("line %d: value %q: %v", i+1, m[3], err)
		}
		key := m[1] + m[2]
		if _, dup := e.values[key]; dup {
			tb.Errorf("series %s appears twice", key)
		}
		e.values[key] = v
		samples++
	}
	if family != "" && samples == 0 {
		tb.Errorf("family %s has no samples", family)
	}
	return e
}

// get returns a series' value, failing the test if it is absent.
func (e exposition) get(tb testing.TB, series string) float64 {
	tb.Helper()
	v, ok := e.values[series]
	if !ok {
		tb.Fatalf("series %s not in the exposition", series)
	}
	return v
}

// fakeTB records failures; Fatalf ends the check with a panic.
type fakeTB struct {
	testing.TB
	failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Errorf(string, ...any) { f.failed = true }
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true; panic("fatal") }

// unixClient is an HTTP client whose every request goes to the Unix socket
// path, as curl --unix-socket does.
func unixClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// scrape GETs /metrics from the server at path.
func scrape(tb testing.TB, path string) (string, *http.Response) {
	tb.Helper()
	c := unixClient(path)
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://microvm/metrics")
	if err != nil {
		tb.Fatalf("GET /metrics on %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b), resp
}

// shortDir is a fresh directory with a short path (sun_path holds 107
// bytes; t.TempDir() names can be longer).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mvm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// acceptWithin is l.Accept, failing the test if it takes longer than d.
func acceptWithin(t *testing.T, l net.Listener, d time.Duration) (net.Conn, error) {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-time.After(d):
		l.Close() // releases the Accept goroutine
		t.Fatalf("Accept did not return within %v", d)
		return nil, nil
	}
}
