package clibase

import (
	"flag"
	"fmt"
	"io"
	"time"
)

// LeanFlags is a command line parsed by the standard flag package, for the
// lean binary, which does not link urfave/cli (flags.go). microvm-full
// links this file too, so its tests can read each command line both ways
// and compare (TestLeanFlags). It reads as
// urfave/cli's Context does: urfave/cli v2 registers each of a flag's
// names in a flag.FlagSet of the same kinds and parses with it.
type LeanFlags struct {
	fs *flag.FlagSet
	// names maps each name of a flag to all its names.
	names map[string][]string
}

// ParseLeanFlags parses args against opts; it returns the arguments after
// the flags. An error is the flag package's (flag.ErrHelp for -h).
func ParseLeanFlags(cmd string, opts []Opt, args []string) (*LeanFlags, []string, error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := &LeanFlags{fs: fs, names: map[string][]string{}}
	for _, o := range opts {
		names := append([]string{o.Name}, o.Aliases...)
		for _, n := range names {
			l.names[n] = names
		}
		// The first name holds the variable; the others share its Value.
		switch o.Kind {
		case OptString:
			def, _ := o.Def.(string)
			fs.String(o.Name, def, o.Usage)
		case OptBool:
			def, _ := o.Def.(bool)
			fs.Bool(o.Name, def, o.Usage)
		case OptInt:
			def, _ := o.Def.(int)
			fs.Int(o.Name, def, o.Usage)
		case OptInt64:
			def, _ := o.Def.(int64)
			fs.Int64(o.Name, def, o.Usage)
		case OptUint64:
			def, _ := o.Def.(uint64)
			fs.Uint64(o.Name, def, o.Usage)
		case OptDuration:
			def, _ := o.Def.(time.Duration)
			fs.Duration(o.Name, def, o.Usage)
		case OptValue:
			fs.Var(o.Value, o.Name, o.Usage)
		default:
			panic(fmt.Sprintf("flag --%s: unknown kind %d", o.Name, o.Kind))
		}
		v := fs.Lookup(o.Name).Value
		for _, n := range o.Aliases {
			fs.Var(v, n, o.Usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	return l, fs.Args(), nil
}

// get is the value of the flag name, as its kind's Go type; nil for a
// name no opt has.
func (l *LeanFlags) get(name string) any {
	f := l.fs.Lookup(name)
	if f == nil {
		return nil
	}
	if g, ok := f.Value.(flag.Getter); ok {
		return g.Get()
	}
	return f.Value
}

func (l *LeanFlags) String(name string) string { v, _ := l.get(name).(string); return v }
func (l *LeanFlags) Bool(name string) bool     { v, _ := l.get(name).(bool); return v }
func (l *LeanFlags) Int(name string) int       { v, _ := l.get(name).(int); return v }
func (l *LeanFlags) Int64(name string) int64   { v, _ := l.get(name).(int64); return v }
func (l *LeanFlags) Uint64(name string) uint64 { v, _ := l.get(name).(uint64); return v }
func (l *LeanFlags) Duration(name string) time.Duration {
	v, _ := l.get(name).(time.Duration)
	return v
}

// Generic is an optValue's own value (nil for a name no opt has).
func (l *LeanFlags) Generic(name string) interface{} {
	if f := l.fs.Lookup(name); f != nil {
		return f.Value
	}
	return nil
}

// LocalFlagNames are the flags the command line gave, each by all its
// names.
func (l *LeanFlags) LocalFlagNames() []string {
	var given []string
	l.fs.Visit(func(f *flag.Flag) { given = append(given, l.names[f.Name]...) })
	return given
}
