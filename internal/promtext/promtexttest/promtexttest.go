// Package promtexttest reads back, in tests, what promtext writes: Parse
// checks a Prometheus text exposition (version 0.0.4) as strictly as
// microvm writes it and returns its series and families, and Scrape fetches
// one from a metrics socket. The root package's metrics tests, unit and
// KVM integration alike, share it.
//
// Data flow: Scrape (GET /metrics over the Unix socket) → text → Parse →
// Exposition → Get (one series' value) or its maps.
package promtexttest

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// Exposition is a parsed Prometheus text exposition: each series (name and
// labels as written) with its value, and each family's type.
type Exposition struct {
	Values map[string]float64
	Types  map[string]string
	Order  []string // families in order
}

var (
	helpRE   = regexp.MustCompile(`^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$`)
	typeRE   = regexp.MustCompile(`^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$`)
	sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)?\})? (\S+)$`)
)

// Parse checks text against the format, version 0.0.4, as strictly as
// microvm writes it: every family is HELP then TYPE then at least one
// sample of that family, families and series appear once, counters end in
// _total and gauges do not, and every value parses.
func Parse(tb testing.TB, text string) Exposition {
	tb.Helper()
	e := Exposition{Values: map[string]float64{}, Types: map[string]string{}}
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
			if _, dup := e.Types[family]; dup {
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
			e.Types[family] = t[2]
			e.Order = append(e.Order, family)
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
		if _, dup := e.Values[key]; dup {
			tb.Errorf("series %s appears twice", key)
		}
		e.Values[key] = v
		samples++
	}
	if family != "" && samples == 0 {
		tb.Errorf("family %s has no samples", family)
	}
	return e
}

// Get returns a series' value, failing the test if it is absent.
func (e Exposition) Get(tb testing.TB, series string) float64 {
	tb.Helper()
	v, ok := e.Values[series]
	if !ok {
		tb.Fatalf("series %s not in the exposition", series)
	}
	return v
}

// Scrape GETs /metrics from the metrics socket at path, failing the test
// if the request or reading the body fails.
func Scrape(tb testing.TB, path string) (string, *http.Response) {
	tb.Helper()
	c := testenv.UnixClient(path)
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
