// Package promtext writes the Prometheus text exposition format, version
// 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/):
//
//	# HELP microvm_vsock_tx_bytes_total Payload bytes the guest sent.
//	# TYPE microvm_vsock_tx_bytes_total counter
//	microvm_vsock_tx_bytes_total{device="vsock0"} 1048576
//
// A Writer emits one family at a time: Family writes the HELP and TYPE
// lines, then Uint or Float write that family's samples, each with its label
// pairs. Help text escapes backslash and newline; label values escape
// backslash, double quote and newline, as the format requires. Metric and
// label names are the caller's constants: an invalid one, a family written
// twice or a sample outside a family is a bug in the caller and panics, so
// the tests that render every family catch it.
//
// It is microvm's own small writer, not the Prometheus client library: the
// VMM exposes a fixed set of counters it already keeps, and needs no
// registry, collectors or protobuf.
package promtext

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// ContentType is the HTTP Content-Type of the format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Type is a metric family's type, as its TYPE line names it.
type Type string

// The types microvm uses.
const (
	Counter Type = "counter" // only ever goes up (resets when the process restarts)
	Gauge   Type = "gauge"   // goes up and down
)

// Writer writes families to an io.Writer. It is not safe for concurrent use.
// The first write error stops all further output; Flush returns it.
type Writer struct {
	w      *bufio.Writer
	err    error
	family string          // the family samples go to; "" before the first
	seen   map[string]bool // families written so far
	series map[string]bool // label sets written in the current family
	line   []byte          // scratch for one line
}

// NewWriter returns a Writer on w. Call Flush at the end.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriter(w), seen: map[string]bool{}}
}

// Family starts the family name of type typ: its HELP and TYPE lines. Every
// family may be started once.
func (w *Writer) Family(name string, typ Type, help string) {
	if !ValidMetricName(name) {
		panic(fmt.Sprintf("promtext: invalid metric name %q", name))
	}
	if typ != Counter && typ != Gauge {
		panic(fmt.Sprintf("promtext: family %s: unknown type %q", name, typ))
	}
	if w.seen[name] {
		panic(fmt.Sprintf("promtext: family %s written twice", name))
	}
	w.seen[name] = true
	w.family = name
	w.series = map[string]bool{}
	b := append(w.line[:0], "# HELP "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = appendEscaped(b, help, false)
	b = append(b, "\n# TYPE "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, typ...)
	b = append(b, '\n')
	w.write(b)
}

// Uint writes a sample of the current family with an integer value.
// labels are name, value pairs.
func (w *Writer) Uint(v uint64, labels ...string) {
	w.sample(strconv.AppendUint(nil, v, 10), labels)
}

// Int writes a sample of the current family with a signed integer value.
func (w *Writer) Int(v int64, labels ...string) {
	w.sample(strconv.AppendInt(nil, v, 10), labels)
}

// Float writes a sample of the current family with a floating-point value
// (+Inf, -Inf and NaN as the format spells them).
func (w *Writer) Float(v float64, labels ...string) {
	var s []byte
	switch {
	case math.IsInf(v, 1):
		s = []byte("+Inf")
	case math.IsInf(v, -1):
		s = []byte("-Inf")
	case math.IsNaN(v):
		s = []byte("NaN")
	default:
		s = strconv.AppendFloat(nil, v, 'g', -1, 64)
	}
	w.sample(s, labels)
}

func (w *Writer) sample(value []byte, labels []string) {
	if w.family == "" {
		panic("promtext: sample before any family")
	}
	if len(labels)%2 != 0 {
		panic(fmt.Sprintf("promtext: family %s: odd number of label strings %q", w.family, labels))
	}
	b := append(w.line[:0], w.family...)
	if len(labels) > 0 {
		b = append(b, '{')
		for i := 0; i < len(labels); i += 2 {
			n := labels[i]
			if !ValidLabelName(n) {
				panic(fmt.Sprintf("promtext: family %s: invalid label name %q", w.family, n))
			}
			for j := 0; j < i; j += 2 {
				if labels[j] == n {
					panic(fmt.Sprintf("promtext: family %s: label %s twice", w.family, n))
				}
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, n...)
			b = append(b, '=', '"')
			b = appendEscaped(b, labels[i+1], true)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	key := string(b[len(w.family):])
	if w.series[key] {
		panic(fmt.Sprintf("promtext: family %s: series %s written twice", w.family, key))
	}
	w.series[key] = true
	b = append(b, ' ')
	b = append(b, value...)
	b = append(b, '\n')
	w.line = b
	w.write(b)
}

func (w *Writer) write(b []byte) {
	if w.err != nil {
		return
	}
	_, w.err = w.w.Write(b)
}

// Flush writes out what is buffered and returns the first error.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	w.err = w.w.Flush()
	return w.err
}

// appendEscaped appends s with backslash and newline escaped, and the
// double quote too in a label value.
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, '\\', '\\')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '"' && quote:
			b = append(b, '\\', '"')
		default:
			b = append(b, c)
		}
	}
	return b
}

// ValidMetricName reports whether s matches [a-zA-Z_:][a-zA-Z0-9_:]*.
func ValidMetricName(s string) bool {
	return validName(s, true)
}

// ValidLabelName reports whether s matches [a-zA-Z_][a-zA-Z0-9_]* and does
// not start with "__" (reserved for Prometheus itself).
func ValidLabelName(s string) bool {
	return validName(s, false) && !strings.HasPrefix(s, "__")
}

func validName(s string, colon bool) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == ':' && colon ||
			i > 0 && c >= '0' && c <= '9'
		if !ok {
			return false
		}
	}
	return true
}
