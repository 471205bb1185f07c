package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/clibase"
)

// cliFlags turns opts (internal/clibase/flags.go) into urfave/cli's flags, in order.
func cliFlags(opts ...[]clibase.Opt) []cli.Flag {
	var fs []cli.Flag
	for _, group := range opts {
		for _, o := range group {
			fs = append(fs, cliFlag(o))
		}
	}
	return fs
}

// cliFlag is one opt as urfave/cli's flag of its kind.
func cliFlag(o clibase.Opt) cli.Flag {
	switch o.Kind {
	case clibase.OptString:
		def, _ := o.Def.(string)
		return &cli.StringFlag{Name: o.Name, Aliases: o.Aliases, Usage: o.Usage, Value: def}
	case clibase.OptBool:
		def, _ := o.Def.(bool)
		return &cli.BoolFlag{Name: o.Name, Aliases: o.Aliases, Usage: o.Usage, Value: def}
	case clibase.OptInt:
		def, _ := o.Def.(int)
		return &cli.IntFlag{Name: o.Name, Aliases: o.Aliases, Usage: o.Usage, Value: def}
	case clibase.OptInt64:
		def, _ := o.Def.(int64)
		return &cli.Int64Flag{Name: o.Name, Aliases: o.Aliases, Usage: o.Usage, Value: def}
	case clibase.OptUint64:
		def, _ := o.Def.(uint64)
		return &cli.Uint64Flag{Name: o.Name, Aliases: o.Aliases, Usage: o.Usage, Value: def}
	case clibase.OptDuration:
		def, _ := o.Def.(time.Duration)
		return &cli.DurationFlag{Name: o.Name, Aliases: o.Aliases, Usage: o.Usage, Value: def}
	case clibase.OptValue:
		return &cli.GenericFlag{Name: o.Name, Aliases: o.Aliases, Usage: o.Usage, Value: o.Value, DefaultText: o.DefText}
	}
	panic(fmt.Sprintf("flag --%s: unknown kind %d", o.Name, o.Kind))
}
