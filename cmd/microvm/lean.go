//go:build microvm_lean

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
)

// execCommand, in the lean build, hands `microvm exec ...` to microvm-full
// (handoff.go).
func execCommand(io.Reader, io.Writer, io.Writer) *cli.Command {
	return handoffCommand("exec", execUsage)
}

// agentCommand, in the lean build, hands `microvm agent ...` to
// microvm-full.
func agentCommand(io.Reader, io.Writer, io.Writer) *cli.Command {
	return handoffCommand("agent", agentUsage)
}

// initramfsCommand, in the lean build, hands `microvm initramfs ...` to
// microvm-full.
func initramfsCommand() *cli.Command { return handoffCommand("initramfs", initramfsUsage) }

// mkfsCommand, in the lean build, hands `microvm mkfs ...` to
// microvm-full.
func mkfsCommand() *cli.Command { return handoffCommand("mkfs", mkfsUsage) }

// vhostUserVsockCommand, in the lean build, hands `microvm
// vhost-user-vsock ...` to microvm-full.
func vhostUserVsockCommand(io.Writer, io.Writer) *cli.Command {
	return handoffCommand("vhost-user-vsock", vhostUserUsage)
}

// imageCommand, in the lean build, hands `microvm image ...` to
// microvm-full.
func imageCommand(io.Writer, io.Writer) *cli.Command { return handoffCommand("image", imageUsage) }

// ciCommand, in the lean build, hands `microvm ci ...` to microvm-full.
func ciCommand(io.Writer, io.Writer) *cli.Command { return handoffCommand("ci", ciUsage) }

// connectCommand, in the lean build, hands `microvm vsock-connect ...` to
// microvm-full.
func connectCommand(io.Reader, io.Writer, io.Writer) *cli.Command {
	return handoffCommand("vsock-connect", connectUsage)
}

// runNamed, in the lean build, hands `microvm run` with --name, --detach
// or --with-agent to microvm-full, which runs named VMs.
func runNamed(*cli.Context, io.Reader, io.Writer, io.Writer) error { return handOff("run") }

// The named VMs' commands, in the lean build, hand over to microvm-full.
func namedCommands(io.Reader, io.Writer, io.Writer) []*cli.Command {
	var cs []*cli.Command
	for _, n := range namedCommandNames {
		cs = append(cs, handoffCommand(n.name, n.usage))
	}
	return cs
}

// runInFullBuild, in the lean build, hands `microvm run` to microvm-full
// when the machine is on a user-mode network: starting and reaping its
// microvm-net process is code the lean build leaves out.
func runInFullBuild(cfg microvm.Config) (bool, error) {
	if cfg.HasUserNet() {
		return true, handOff("run")
	}
	return false, nil
}

// handoffCommand is a command whose flags and arguments, help included,
// are microvm-full's to parse: it replaces this process with microvm-full
// and the same command line.
func handoffCommand(name, usage string) *cli.Command {
	return &cli.Command{
		Name:            name,
		Usage:           usage,
		SkipFlagParsing: true,
		HideHelp:        true,
		Action:          func(*cli.Context) error { return handOff(name) },
	}
}

// handOff replaces this process with microvm-full and the same command
// line.
func handOff(name string) error {
	helper, err := findFullBuild()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if !ownsProcess {
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
	dirs := append([]string{binDir()}, filepath.SplitList(os.Getenv("PATH"))...)
	for _, d := range dirs {
		if d == "" {
			continue
		}
		p := filepath.Join(d, fullBuild)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w beside %s or on PATH: this build of microvm runs only `run` and `version` itself (make builds both into bin/)", errNoFullBuild, binDir())
}
