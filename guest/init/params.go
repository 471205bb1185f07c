package main

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// paramPrefix starts every kernel command-line parameter /init reads.
const paramPrefix = "microvm."

// Params holds the microvm.* parameters of a kernel command line:
//
//	microvm.scenarios=NAME[,NAME...]   scenarios to run, in order
//	microvm.KEY=VALUE                  a parameter for every scenario
//	microvm.NAME.KEY=VALUE             a parameter for scenario NAME only;
//	                                   it wins over microvm.KEY
//
// KEY never contains a dot; NAME may contain '-'. When a parameter is given
// twice the last one wins, as for most kernel parameters.
type Params struct {
	scenarios []string
	global    map[string]string            // KEY -> VALUE
	scoped    map[string]map[string]string // NAME -> KEY -> VALUE
	used      map[string]bool              // full parameter names looked up
}

// ParseCmdline extracts the microvm.* parameters from a kernel command line
// (the contents of /proc/cmdline). Other parameters are ignored.
func ParseCmdline(cmdline string) (*Params, error) {
	p := &Params{
		global: map[string]string{},
		scoped: map[string]map[string]string{},
		used:   map[string]bool{},
	}
	for _, arg := range splitCmdline(cmdline) {
		key, val, _ := strings.Cut(arg, "=")
		rest, ok := strings.CutPrefix(key, paramPrefix)
		if !ok {
			continue
		}
		val = unquote(val)
		switch i := strings.LastIndexByte(rest, '.'); {
		case rest == "":
			return nil, fmt.Errorf("parameter %q: empty name", arg)
		case rest == "scenarios":
			p.scenarios = p.scenarios[:0]
			for _, name := range strings.Split(val, ",") {
				if name = strings.TrimSpace(name); name != "" {
					p.scenarios = append(p.scenarios, name)
				}
			}
		case i < 0:
			p.global[rest] = val
		case i == 0 || i == len(rest)-1:
			return nil, fmt.Errorf("parameter %q: want microvm.KEY or microvm.SCENARIO.KEY", arg)
		default:
			name, k := rest[:i], rest[i+1:]
			if p.scoped[name] == nil {
				p.scoped[name] = map[string]string{}
			}
			p.scoped[name][k] = val
		}
	}
	return p, nil
}

// splitCmdline splits a command line at white space outside double quotes,
// as the kernel's next_arg does.
func splitCmdline(s string) []string {
	var args []string
	var cur strings.Builder
	inQuote, inArg := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			inArg = true
			cur.WriteRune(r)
		case !inQuote && (r == ' ' || r == '\t' || r == '\n' || r == '\r'):
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			inArg = true
			cur.WriteRune(r)
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// unquote strips one pair of surrounding double quotes from a value.
func unquote(v string) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

// Scenarios returns the scenario names from microvm.scenarios, in order.
func (p *Params) Scenarios() []string { return p.scenarios }

// For returns the parameter view of one scenario.
func (p *Params) For(scenario string) *ScenarioParams {
	return &ScenarioParams{p: p, name: scenario}
}

// Unused returns the microvm.* parameters that no scenario looked up, sorted:
// usually a typo, reported as a warning.
func (p *Params) Unused() []string {
	var out []string
	for k := range p.global {
		if !p.used[paramPrefix+k] {
			out = append(out, paramPrefix+k)
		}
	}
	for name, m := range p.scoped {
		for k := range m {
			if full := paramPrefix + name + "." + k; !p.used[full] {
				out = append(out, full)
			}
		}
	}
	sort.Strings(out)
	return out
}

// ScenarioParams reads one scenario's parameters with typed getters. A getter
// given a malformed value returns its default and records the first error,
// which Err reports; a scenario reads all its parameters, then checks Err.
type ScenarioParams struct {
	p    *Params
	name string
	err  error
}

// lookup finds KEY for this scenario: microvm.NAME.KEY, then microvm.KEY.
func (s *ScenarioParams) lookup(key string) (val, full string, ok bool) {
	scoped := paramPrefix + s.name + "." + key
	global := paramPrefix + key
	s.p.used[scoped] = true
	s.p.used[global] = true
	if v, ok := s.p.scoped[s.name][key]; ok {
		return v, scoped, true
	}
	if v, ok := s.p.global[key]; ok {
		return v, global, true
	}
	return "", "", false
}

func (s *ScenarioParams) fail(full, val, want string, err error) {
	if s.err == nil {
		if err != nil {
			s.err = fmt.Errorf("bad parameter %s=%q: want %s (%w)", full, val, want, err)
		} else {
			s.err = fmt.Errorf("bad parameter %s=%q: want %s", full, val, want)
		}
	}
}

// Err returns the first malformed parameter met by a getter, or nil.
func (s *ScenarioParams) Err() error { return s.err }

// String returns KEY's value, or def.
func (s *ScenarioParams) String(key, def string) string {
	if v, _, ok := s.lookup(key); ok {
		return v
	}
	return def
}

// Uint32 returns KEY as a decimal (or 0x-prefixed) 32-bit unsigned integer,
// as vsock CIDs and ports are.
func (s *ScenarioParams) Uint32(key string, def uint32) uint32 {
	v, full, ok := s.lookup(key)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		s.fail(full, v, "an unsigned 32-bit integer", nil)
		return def
	}
	return uint32(n)
}

// Int returns KEY as a decimal integer in [lo, hi].
func (s *ScenarioParams) Int(key string, def, lo, hi int) int {
	v, full, ok := s.lookup(key)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		s.fail(full, v, fmt.Sprintf("an integer in [%d, %d]", lo, hi), nil)
		return def
	}
	return n
}

// Uint64 returns KEY as a decimal (or 0x-prefixed) 64-bit unsigned integer.
func (s *ScenarioParams) Uint64(key string, def uint64) uint64 {
	v, full, ok := s.lookup(key)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		s.fail(full, v, "an unsigned 64-bit integer", nil)
		return def
	}
	return n
}

// Size returns KEY as a byte count: a decimal number with an optional binary
// suffix K, M or G (1K = 1024), case-insensitive. It must not exceed 1 TiB.
func (s *ScenarioParams) Size(key string, def int64) int64 {
	v, full, ok := s.lookup(key)
	if !ok {
		return def
	}
	n, err := parseSize(v)
	if err != nil {
		s.fail(full, v, "a size such as 4096, 64K, 8M or 1G", err)
		return def
	}
	return n
}

const maxSize = 1 << 40

func parseSize(v string) (int64, error) {
	mult := int64(1)
	num := v
	if n := len(v); n > 0 {
		switch v[n-1] {
		case 'k', 'K':
			mult, num = 1<<10, v[:n-1]
		case 'm', 'M':
			mult, num = 1<<20, v[:n-1]
		case 'g', 'G':
			mult, num = 1<<30, v[:n-1]
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, errors.New("not a number")
	}
	if n < 0 || n > maxSize/mult {
		return 0, errors.New("out of range [0, 1T]")
	}
	return n * mult, nil
}

// Duration returns KEY as a Go duration ("500ms", "30s", "2m"); a bare
// integer is taken as seconds. Negative durations are refused.
func (s *ScenarioParams) Duration(key string, def time.Duration) time.Duration {
	v, full, ok := s.lookup(key)
	if !ok {
		return def
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		s.fail(full, v, "a duration such as 500ms, 30s or 2m", nil)
		return def
	}
	return d
}
