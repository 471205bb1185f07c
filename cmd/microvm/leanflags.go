package main

import (
	"flag"
	"fmt"
	"io"
	"time"
)

// leanFlags is a command line parsed by the standard flag package, for the
// lean build, which does not link urfave/cli (flags.go). Both builds hold
// this file, so the full build's tests can read each command line both
// ways and compare (TestLeanFlags). It reads as
// urfave/cli's Context does: urfave/cli v2 registers each of a flag's
// names in a flag.FlagSet of the same kinds and parses with it.
type leanFlags struct {
	fs *flag.FlagSet
	// names maps each name of a flag to all its names.
	names map[string][]string
}

// parseLeanFlags parses args against opts; it returns the arguments after
// the flags. An error is the flag package's (flag.ErrHelp for -h).
func parseLeanFlags(cmd string, opts []opt, args []string) (*leanFlags, []string, error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := &leanFlags{fs: fs, names: map[string][]string{}}
	for _, o := range opts {
		names := append([]string{o.name}, o.aliases...)
		for _, n := range names {
			l.names[n] = names
		}
		// The first name holds the variable; the others share its Value.
		switch o.kind {
		case optString:
			def, _ := o.def.(string)
			fs.String(o.name, def, o.usage)
		case optBool:
			def, _ := o.def.(bool)
			fs.Bool(o.name, def, o.usage)
		case optInt:
			def, _ := o.def.(int)
			fs.Int(o.name, def, o.usage)
		case optInt64:
			def, _ := o.def.(int64)
			fs.Int64(o.name, def, o.usage)
		case optUint64:
			def, _ := o.def.(uint64)
			fs.Uint64(o.name, def, o.usage)
		case optDuration:
			def, _ := o.def.(time.Duration)
			fs.Duration(o.name, def, o.usage)
		case optValue:
			fs.Var(o.value, o.name, o.usage)
		default:
			panic(fmt.Sprintf("flag --%s: unknown kind %d", o.name, o.kind))
		}
		v := fs.Lookup(o.name).Value
		for _, n := range o.aliases {
			fs.Var(v, n, o.usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	return l, fs.Args(), nil
}

// get is the value of the flag name, as its kind's Go type; nil for a
// name no opt has.
func (l *leanFlags) get(name string) any {
	f := l.fs.Lookup(name)
	if f == nil {
		return nil
	}
	if g, ok := f.Value.(flag.Getter); ok {
		return g.Get()
	}
	return f.Value
}

func (l *leanFlags) String(name string) string { v, _ := l.get(name).(string); return v }
func (l *leanFlags) Bool(name string) bool     { v, _ := l.get(name).(bool); return v }
func (l *leanFlags) Int(name string) int       { v, _ := l.get(name).(int); return v }
func (l *leanFlags) Int64(name string) int64   { v, _ := l.get(name).(int64); return v }
func (l *leanFlags) Uint64(name string) uint64 { v, _ := l.get(name).(uint64); return v }
func (l *leanFlags) Duration(name string) time.Duration {
	v, _ := l.get(name).(time.Duration)
	return v
}

// Generic is an optValue's own value (nil for a name no opt has).
func (l *leanFlags) Generic(name string) interface{} {
	if f := l.fs.Lookup(name); f != nil {
		return f.Value
	}
	return nil
}

// LocalFlagNames are the flags the command line gave, each by all its
// names.
func (l *leanFlags) LocalFlagNames() []string {
	var given []string
	l.fs.Visit(func(f *flag.Flag) { given = append(given, l.names[f.Name]...) })
	return given
}
