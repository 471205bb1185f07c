//go:build !microvm_lean

package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
)

// cliFlags turns opts (flags.go) into urfave/cli's flags, in order.
func cliFlags(opts ...[]opt) []cli.Flag {
	var fs []cli.Flag
	for _, group := range opts {
		for _, o := range group {
			fs = append(fs, cliFlag(o))
		}
	}
	return fs
}

// cliFlag is one opt as urfave/cli's flag of its kind.
func cliFlag(o opt) cli.Flag {
	switch o.kind {
	case optString:
		def, _ := o.def.(string)
		return &cli.StringFlag{Name: o.name, Aliases: o.aliases, Usage: o.usage, Value: def}
	case optBool:
		def, _ := o.def.(bool)
		return &cli.BoolFlag{Name: o.name, Aliases: o.aliases, Usage: o.usage, Value: def}
	case optInt:
		def, _ := o.def.(int)
		return &cli.IntFlag{Name: o.name, Aliases: o.aliases, Usage: o.usage, Value: def}
	case optInt64:
		def, _ := o.def.(int64)
		return &cli.Int64Flag{Name: o.name, Aliases: o.aliases, Usage: o.usage, Value: def}
	case optUint64:
		def, _ := o.def.(uint64)
		return &cli.Uint64Flag{Name: o.name, Aliases: o.aliases, Usage: o.usage, Value: def}
	case optDuration:
		def, _ := o.def.(time.Duration)
		return &cli.DurationFlag{Name: o.name, Aliases: o.aliases, Usage: o.usage, Value: def}
	case optValue:
		return &cli.GenericFlag{Name: o.name, Aliases: o.aliases, Usage: o.usage, Value: o.value, DefaultText: o.defText}
	}
	panic(fmt.Sprintf("flag --%s: unknown kind %d", o.name, o.kind))
}
