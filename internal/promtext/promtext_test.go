package promtext

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func render(t *testing.T, f func(w *Writer)) string {
	t.Helper()
	var b bytes.Buffer
	w := NewWriter(&b)
	f(w)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestGolden: the exact bytes of a small exposition, escaping included.
func TestGolden(t *testing.T) {
	got := render(t, func(w *Writer) {
		w.Family("demo_bytes_total", Counter, "Bytes moved.\nSecond line with a \\ backslash and \"quotes\".")
		w.Uint(0, "device", "vsock0")
		w.Uint(18446744073709551615, "device", "vda", "queue", "rx")
		w.Family("demo_connections", Gauge, "Open connections.")
		w.Int(-3)
		w.Family("demo_seconds_total", Counter, "Time.")
		w.Float(1.5, "path", `C:\dir "x"`+"\nnext")
		w.Float(math.Inf(1), "v", "inf")
		w.Float(math.Inf(-1), "v", "-inf")
		w.Float(math.NaN(), "v", "nan")
		w.Float(1e6, "v", "big")
		w.Float(0.000125, "v", "small")
	})
	want := `# HELP demo_bytes_total Bytes moved.\nSecond line with a \\ backslash and "quotes".
# TYPE demo_bytes_total counter
demo_bytes_total{device="vsock0"} 0
demo_bytes_total{device="vda",queue="rx"} 18446744073709551615
# HELP demo_connections Open connections.
# TYPE demo_connections gauge
demo_connections -3
# HELP demo_seconds_total Time.
# TYPE demo_seconds_total counter
demo_seconds_total{path="C:\\dir \"x\"\nnext"} 1.5
demo_seconds_total{v="inf"} +Inf
demo_seconds_total{v="-inf"} -Inf
demo_seconds_total{v="nan"} NaN
demo_seconds_total{v="big"} 1e+06
demo_seconds_total{v="small"} 0.000125
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("exposition (-want +got):\n%s", diff)
	}
}

// TestEscapeLabelValues: every byte that needs it is escaped, and only
// those; the result reads back to the original with the format's rules.
func TestEscapeLabelValues(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ``},
		{"plain", `plain`},
		{`a\b`, `a\\b`},
		{`say "hi"`, `say \"hi\"`},
		{"two\nlines", `two\nlines`},
		{`\"` + "\n", `\\\"\n`},
		{"tab\tand ünïcode", "tab\tand ünïcode"},
	} {
		got := string(appendEscaped(nil, tc.in, true))
		if got != tc.want {
			t.Errorf("label value %q escaped as %s, want %s", tc.in, got, tc.want)
		}
		if back := unescape(got); back != tc.in {
			t.Errorf("label value %q: escaped %s reads back as %q", tc.in, got, back)
		}
	}
	// HELP text leaves double quotes alone.
	if got := string(appendEscaped(nil, `"q"\`+"\n", false)); got != `"q"\\\n` {
		t.Errorf("help escaped as %s", got)
	}
}

// unescape is the reader's side of label value escaping.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		name          string
		metric, label bool
	}{
		{"microvm_vsock_tx_bytes_total", true, true},
		{"_x", true, true},
		{"a:b", true, false},
		{":a", true, false},
		{"__name", true, false},
		{"1abc", false, false},
		{"a-b", false, false},
		{"a b", false, false},
		{"", false, false},
		{"é", false, false},
	} {
		if got := ValidMetricName(tc.name); got != tc.metric {
			t.Errorf("ValidMetricName(%q) = %v, want %v", tc.name, got, tc.metric)
		}
		if got := ValidLabelName(tc.name); got != tc.label {
			t.Errorf("ValidLabelName(%q) = %v, want %v", tc.name, got, tc.label)
		}
	}
}

// TestMisusePanics: the caller's mistakes are caught, not written out as a
// malformed exposition.
func TestMisusePanics(t *testing.T) {
	for name, f := range map[string]func(w *Writer){
		"bad metric name": func(w *Writer) { w.Family("a-b", Counter, "") },
		"bad type":        func(w *Writer) { w.Family("a", Type("histogram"), "") },
		"family twice":    func(w *Writer) { w.Family("a", Counter, ""); w.Family("a", Counter, "") },
		"sample first":    func(w *Writer) { w.Uint(1) },
		"odd labels": func(w *Writer) {
			w.Family("a", Counter, "")
			labels := strings.Fields("device") // one string: a name without its value
			w.Uint(1, labels...)
		},
		"bad label name":    func(w *Writer) { w.Family("a", Counter, ""); w.Uint(1, "de-vice", "x") },
		"reserved label":    func(w *Writer) { w.Family("a", Counter, ""); w.Uint(1, "__name__", "x") },
		"label twice":       func(w *Writer) { w.Family("a", Counter, ""); w.Uint(1, "d", "x", "d", "y") },
		"series twice":      func(w *Writer) { w.Family("a", Counter, ""); w.Uint(1, "d", "x"); w.Uint(2, "d", "x") },
		"unlabelled twice":  func(w *Writer) { w.Family("a", Gauge, ""); w.Int(1); w.Int(2) },
		"float series dupe": func(w *Writer) { w.Family("a", Gauge, ""); w.Float(1, "d", "x"); w.Uint(2, "d", "x") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f(NewWriter(&bytes.Buffer{}))
		})
	}
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("broken pipe")
}

// TestWriteError: the first write error is returned by Flush and nothing
// more is written after it.
func TestWriteError(t *testing.T) {
	fw := &failWriter{}
	w := NewWriter(fw)
	w.Family("a_total", Counter, strings.Repeat("x", 5000)) // larger than bufio's buffer
	w.Uint(1)
	w.Family("b_total", Counter, strings.Repeat("y", 5000))
	if err := w.Flush(); err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Errorf("Flush: %v, want the write error", err)
	}
	if fw.n != 1 {
		t.Errorf("%d writes reached the broken writer, want 1", fw.n)
	}
}
