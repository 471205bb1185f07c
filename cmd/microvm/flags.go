package main

import (
	"time"
)

// The flags of `run` (and the groups other commands share) are declared
// once, as opts, in files both builds hold. The full build turns them into
// urfave/cli flags (cliflags.go); the lean build parses `run` with the
// standard flag package (leanflags.go), the parser urfave/cli itself uses
// underneath, so both read a command line the same way. The lean build
// does not link urfave/cli: importing it compiles a regexp at start-up and
// links text/template for its help, about 0.3 MB of code on `run`'s path
// (docs/benchmarks.md, "Start-up").

// optKind is the type of an opt's value.
type optKind uint8

const (
	optString optKind = iota
	optBool
	optInt
	optInt64
	optUint64
	optDuration
	optValue // a flag.Value of the opt's own (value)
)

// opt is one command-line flag.
type opt struct {
	kind    optKind
	name    string
	aliases []string
	usage   string
	// def is the default: a string, bool, int, int64, uint64 or
	// time.Duration as kind says; nil is the type's zero.
	def any
	// value is an optValue's own value, fresh for each command line (it
	// keeps what was given); defText is the default help shows for it.
	value   flagValue
	defText string
}

// flagValue is an optValue's value: the standard flag package's Value,
// which is also urfave/cli's Generic.
type flagValue interface {
	Set(string) error
	String() string
}

// stringOpt, boolOpt, ... declare opts of each kind.
func stringOpt(name, def, usage string) opt {
	return opt{kind: optString, name: name, def: def, usage: usage}
}
func boolOpt(name, usage string, aliases ...string) opt {
	return opt{kind: optBool, name: name, usage: usage, aliases: aliases}
}
func intOpt(name string, def int, usage string) opt {
	return opt{kind: optInt, name: name, def: def, usage: usage}
}
func int64Opt(name, usage string) opt  { return opt{kind: optInt64, name: name, usage: usage} }
func uint64Opt(name, usage string) opt { return opt{kind: optUint64, name: name, usage: usage} }
func durationOpt(name string, def time.Duration, usage string) opt {
	return opt{kind: optDuration, name: name, def: def, usage: usage}
}
func valueOpt(name string, v flagValue, defText, usage string) opt {
	return opt{kind: optValue, name: name, value: v, defText: defText, usage: usage}
}

// flagValues is a parsed command line, as a command's code reads it:
// urfave/cli's *cli.Context in the full build, leanFlags in the lean one.
type flagValues interface {
	String(name string) string
	Bool(name string) bool
	Int(name string) int
	Int64(name string) int64
	Uint64(name string) uint64
	Duration(name string) time.Duration
	// Generic is an optValue's value.
	Generic(name string) interface{}
	// LocalFlagNames are the flags the command line gave, by each of
	// their names.
	LocalFlagNames() []string
}

// isSet says whether the command line gave the flag name. It stands in for
// urfave/cli's Context.IsSet, which looks an unset flag up through every
// flag's Names, each running a regexp: on `run` that was half of
// start-up's allocations, and the regexp engine's code on the start-up
// path (docs/benchmarks.md, "Start-up"). LocalFlagNames visits only the
// flags given.
func isSet(c flagValues, name string) bool {
	for _, n := range c.LocalFlagNames() {
		if n == name {
			return true
		}
	}
	return false
}
