package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// commandLineArgs are the commands whose arguments are a command line for
// the guest (exec's CMD [ARG...]): their flags end at the first argument,
// so that `exec NAME ls -l` passes -l to ls.
var commandLineArgs = map[string]bool{
	"exec":       true,
	"agent exec": true,
	"ci":         true, // ci gitlab run SCRIPT STAGE, as gitlab-runner calls it
}

// flagsFirst returns args with every flag of the command moved before its
// first positional argument, as Docker users type them (`microvm snapshot
// vm1 --out DIR`): urfave/cli, like Go's flag package, takes everything
// from the first argument on as arguments. Nothing after "--" moves, nor
// anything of a command in commandLineArgs. A flag's value goes with it:
// the next word, unless the flag is boolean or written --flag=value. An
// unknown flag moves too, so that the command says it is unknown; a last
// flag that wants a value and has none leaves args as they are.
func flagsFirst(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	cmds, path, i := app.Commands, "", 1
	var cmd *cli.Command
	for i < len(args) {
		next := findCommand(cmds, args[i])
		if next == nil {
			break
		}
		cmd, cmds = next, next.Subcommands
		path = strings.TrimSpace(path + " " + next.Name)
		i++
	}
	if cmd == nil || commandLineArgs[path] || commandLineArgs[strings.Fields(path)[0]] {
		return args
	}
	var flags, positional []string
	j := i
	for ; j < len(args); j++ {
		a := args[j]
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		if !strings.Contains(a, "=") && takesValue(cmd, strings.TrimLeft(a, "-")) {
			if j+1 == len(args) {
				return args // a flag without its value: the command says so
			}
			j++
			flags = append(flags, args[j])
		}
	}
	out := append([]string{}, args[:i]...)
	out = append(out, flags...)
	out = append(out, positional...)
	return append(out, args[j:]...)
}

// findCommand is the command of cmds named or aliased name.
func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue says whether cmd's flag name is followed by a value: false for
// a boolean flag and for a flag cmd does not have.
func takesValue(cmd *cli.Command, name string) bool {
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if v, ok := f.(interface{ TakesValue() bool }); ok {
				return v.TakesValue()
			}
			return true
		}
	}
	return false
}
