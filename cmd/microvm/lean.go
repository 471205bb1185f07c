package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
)

// Main runs `run` and `version` and hands every other command line, help
// and version flags included, to microvm-full (cmd/microvm-full), which
// parses it with urfave/cli, so help, usage errors and the other commands
// read as they always have.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) < 2 {
		return clibase.ExitStatus(handOff("help"), stderr)
	}
	switch cmd, rest := args[1], args[2:]; {
	case cmd == "run":
		return clibase.ExitStatus(leanRun(rest, stdin, stdout, stderr), stderr)
	case cmd == "version" && len(rest) == 0:
		fmt.Fprintf(stdout, "microvm %s\n", Version)
		return 0
	case (cmd == "--version" || cmd == "-v") && len(rest) == 0:
		// urfave/cli's version flag, as the full build prints it.
		fmt.Fprintf(stdout, "microvm version %s\n", Version)
		return 0
	default:
		return clibase.ExitStatus(handOff(cmd), stderr)
	}
}

// leanRun is `microvm run` in the lean build. A command line the standard
// flag package refuses (or one asking for help) goes to microvm-full,
// whose urfave/cli says what is wrong, or shows the help, as before; so
// does one for a named VM.
func leanRun(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c, rest, err := clibase.ParseLeanFlags("run", clibase.RunOpts(), args)
	if err != nil {
		if herr := handOff("run"); !errors.Is(herr, errNoFullBuild) {
			return herr
		}
		return clibase.UsageError{Err: fmt.Errorf("run: %w", err)}
	}
	if err := clibase.CheckRunArgs(c, rest); err != nil {
		return err
	}
	if clibase.WantsNamed(c) {
		return handOff("run")
	}
	return clibase.RunPlain(c, stdin, stdout, stderr, clibase.Plain{Elsewhere: runInFullBuild})
}

// runInFullBuild hands `microvm run` to microvm-full when the machine is
// on a user-mode network (microvm-full starts and reaps its microvm-net
// process, under the seccomp policy that allows it) or --cpuprofile asks
// for a profile (runtime/pprof, with compress/gzip, which this binary
// leaves out).
func runInFullBuild(c clibase.FlagValues, cfg microvm.Config) (bool, error) {
	if cfg.HasUserNet() || clibase.IsSet(c, "cpuprofile") {
		return true, handOff("run")
	}
	return false, nil
}

// handOff replaces this process with microvm-full and the same command
// line.
func handOff(name string) error {
	helper, err := findFullBuild()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if !clibase.OwnsProcess {
		return fmt.Errorf("%s: the lean build hands over to %s only as its own process", name, helper)
	}
	// execve keeps the process: its pid, stdio, signal dispositions
	// reset to default, and the caller's wait.
	err = syscall.Exec(helper, os.Args, os.Environ())
	return fmt.Errorf("%s: exec %s: %w", name, helper, err)
}

// fullBuild is the full build's name, looked for beside the running
// binary first, then on PATH.
const fullBuild = "microvm-full"

// errNoFullBuild: the lean build found no microvm-full to hand over to.
var errNoFullBuild = errors.New(fullBuild + " not found")

// findFullBuild returns the path of microvm-full: beside the running
// binary, else in a directory of $PATH.
func findFullBuild() (string, error) {
	dirs := append([]string{clibase.BinDir()}, filepath.SplitList(os.Getenv("PATH"))...)
	for _, d := range dirs {
		if d == "" {
			continue
		}
		p := filepath.Join(d, fullBuild)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w beside %s or on PATH: this build of microvm runs only `run` and `version` itself (make builds both into bin/)", errNoFullBuild, clibase.BinDir())
}
