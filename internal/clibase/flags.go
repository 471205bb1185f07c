package clibase

import (
	"time"
)

// The flags of `run` (and the groups other commands share) are declared
// once, as Opts, here. microvm-full turns them into urfave/cli flags
// (cmd/microvm-full/cliflags.go); the lean binary parses `run` with the
// standard flag package (leanflags.go), the parser urfave/cli itself uses
// underneath, so both read a command line the same way. The lean binary
// does not link urfave/cli: importing it compiles a regexp at start-up and
// links text/template for its help, about 0.3 MB of code on `run`'s path
// (docs/benchmarks.md, "Start-up").

// OptKind is the type of an Opt's value.
type OptKind uint8

const (
	OptString OptKind = iota
	OptBool
	OptInt
	OptInt64
	OptUint64
	OptDuration
	OptValue // a flag.Value of the Opt's own (Value)
)

// Opt is one command-line flag.
type Opt struct {
	Kind    OptKind
	Name    string
	Aliases []string
	Usage   string
	// Def is the default: a string, bool, int, int64, uint64 or
	// time.Duration as Kind says; nil is the type's zero.
	Def any
	// Value is an OptValue's own value, fresh for each command line (it
	// keeps what was given); DefText is the default help shows for it.
	Value   FlagValue
	DefText string
}

// FlagValue is an OptValue's value: the standard flag package's Value,
// which is also urfave/cli's Generic.
type FlagValue interface {
	Set(string) error
	String() string
}

// StringOpt, BoolOpt, ... declare Opts of each kind.
func StringOpt(name, def, usage string) Opt {
	return Opt{Kind: OptString, Name: name, Def: def, Usage: usage}
}
func BoolOpt(name, usage string, aliases ...string) Opt {
	return Opt{Kind: OptBool, Name: name, Usage: usage, Aliases: aliases}
}
func IntOpt(name string, def int, usage string) Opt {
	return Opt{Kind: OptInt, Name: name, Def: def, Usage: usage}
}
func Int64Opt(name, usage string) Opt  { return Opt{Kind: OptInt64, Name: name, Usage: usage} }
func Uint64Opt(name, usage string) Opt { return Opt{Kind: OptUint64, Name: name, Usage: usage} }
func DurationOpt(name string, def time.Duration, usage string) Opt {
	return Opt{Kind: OptDuration, Name: name, Def: def, Usage: usage}
}
func ValueOpt(name string, v FlagValue, defText, usage string) Opt {
	return Opt{Kind: OptValue, Name: name, Value: v, DefText: defText, Usage: usage}
}

// FlagValues is a parsed command line, as a command's code reads it:
// urfave/cli's *cli.Context in microvm-full, LeanFlags in the lean binary.
type FlagValues interface {
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

// IsSet says whether the command line gave the flag name. It stands in for
// urfave/cli's Context.IsSet, which looks an unset flag up through every
// flag's Names, each running a regexp: on `run` that was half of
// start-up's allocations, and the regexp engine's code on the start-up
// path (docs/benchmarks.md, "Start-up"). LocalFlagNames visits only the
// flags given.
func IsSet(c FlagValues, name string) bool {
	for _, n := range c.LocalFlagNames() {
		if n == name {
			return true
		}
	}
	return false
}
