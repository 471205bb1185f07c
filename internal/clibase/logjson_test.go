package clibase

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// TestJSONFormatter: every line is one JSON object that encoding/json
// reads back with the same values: awkward strings (quotes, control
// characters, invalid UTF-8), typed fields, and a field named like a
// reserved key.
func TestJSONFormatter(t *testing.T) {
	e := &logrus.Entry{
		Time:    time.Date(2026, 12, 1, 18, 0, 0, 5e6, time.UTC),
		Level:   logrus.ErrorLevel,
		Message: "a \"quoted\"\tline\nwith \x01 control, \xff bad UTF-8, and é",
		Data: logrus.Fields{
			"n": 42, "u": uint64(1 << 63), "f": 1.5, "nan": math.NaN(), "ok": true,
			"err": errors.New("boom"), "d": 1500 * time.Millisecond, "nil": nil, "msg": "shadowed",
			"list": []int{1, 2},
		},
	}
	b, err := JSONFormatter{}.Format(e)
	if err != nil {
		t.Fatal(err)
	}
	if b[len(b)-1] != '\n' {
		t.Errorf("%q does not end in a newline", b)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	want := map[string]any{
		"time": "2026-12-01T18:00:00.005Z", "level": "error",
		"msg": "a \"quoted\"\tline\nwith \x01 control, \ufffd bad UTF-8, and é",
		"n":   42.0, "u": float64(1 << 63), "f": 1.5, "nan": "NaN", "ok": true, "err": "boom", "d": "1.5s",
		"nil": nil, "fields.msg": "shadowed", "list": "[1 2]",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v (line %s)", k, got[k], v, b)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d keys, want %d: %s", len(got), len(want), b)
	}
}
