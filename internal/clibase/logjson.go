package clibase

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"
)

// JSONFormatter is --log-format json: one JSON object a line, "time",
// "level" and "msg" first, then the entry's fields by name (a field named
// like one of those three gets a "fields." prefix, as logrus's own
// JSONFormatter does). It is written here rather than using logrus's
// JSONFormatter because that pulls encoding/json into the lean binary
// (bin/microvm): 86 KB of code on `microvm run`'s start-up path, whose peak
// RSS is a target (docs/benchmarks.md, "Start-up"). Values are typed where
// JSON has the type (strings, errors, booleans, integers, finite floats,
// nil); anything else is its fmt text as a string.
type JSONFormatter struct{}

// jsonTimeFormat is RFC 3339 with milliseconds.
const jsonTimeFormat = "2006-01-02T15:04:05.000Z07:00"

func (JSONFormatter) Format(e *logrus.Entry) ([]byte, error) {
	b := make([]byte, 0, 128)
	b = append(b, `{"time":`...)
	b = appendJSONString(b, e.Time.Format(jsonTimeFormat))
	b = append(b, `,"level":`...)
	b = appendJSONString(b, e.Level.String())
	b = append(b, `,"msg":`...)
	b = appendJSONString(b, e.Message)
	keys := make([]string, 0, len(e.Data))
	for k := range e.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := k
		if k == "time" || k == "level" || k == "msg" {
			name = "fields." + k
		}
		b = append(b, ',')
		b = appendJSONString(b, name)
		b = append(b, ':')
		b = appendJSONValue(b, e.Data[k])
	}
	return append(b, '}', '\n'), nil
}

func appendJSONValue(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...)
	case string:
		return appendJSONString(b, x)
	case error:
		return appendJSONString(b, x.Error())
	case bool:
		return strconv.AppendBool(b, x)
	case time.Duration:
		return appendJSONString(b, x.String())
	case interface{ String() string }:
		return appendJSONString(b, x.String())
	}
	rv := reflect.ValueOf(v)
	if rv.Type().Name() != rv.Kind().String() {
		return appendJSONString(b, fmt.Sprint(v)) // a named number type: its fmt text
	}
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.AppendInt(b, rv.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.AppendUint(b, rv.Uint(), 10)
	case reflect.Float32:
		return appendJSONFloat(b, rv.Float(), 32)
	case reflect.Float64:
		return appendJSONFloat(b, rv.Float(), 64)
	}
	return appendJSONString(b, fmt.Sprint(v))
}

func appendJSONFloat(b []byte, f float64, bits int) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return appendJSONString(b, strconv.FormatFloat(f, 'g', -1, bits))
	}
	return strconv.AppendFloat(b, f, 'g', -1, bits)
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
