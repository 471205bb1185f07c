package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
)

// Main runs the CLI and returns the process exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdin, stdout, stderr)
	var unknown string
	app.CommandNotFound = func(_ *cli.Context, name string) { unknown = name }
	err := app.Run(flagsFirst(app, args))
	if unknown != "" {
		fmt.Fprintf(stderr, "microvm: unknown command %q (see microvm --help)\n", unknown)
		return microvm.StatusUsage
	}
	return clibase.ExitStatus(err, stderr)
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "microvm",
		Usage:     "a KVM micro-VM monitor with built-in virtio-vsock, virtio-blk and virtio-rng devices",
		Version:   Version,
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed once, by Main, with the right exit status.
		ExitErrHandler: func(*cli.Context, error) {},
		// A repeatable flag's value is one value, commas and all:
		// --env K=a,b, restore's --share tag=T,path=DIR and --net
		// tap=NAME,netns=PATH would otherwise be split at their commas.
		DisableSliceFlagSeparator: true,
		OnUsageError:              onUsageError,
		Commands: append([]*cli.Command{
			runCommand(stdin, stdout, stderr),
			execCommand(stdin, stdout, stderr),
			agentCommand(stdin, stdout, stderr),
			initramfsCommand(),
			mkfsCommand(),
			vhostUserVsockCommand(stdout, stderr),
			connectCommand(stdin, stdout, stderr),
			imageCommand(stdout, stderr),
			cacheCommand(stdout),
			ciCommand(stdout, stderr),
			{
				Name:         "version",
				Usage:        "print the version",
				OnUsageError: onUsageError,
				Action: func(c *cli.Context) error {
					if c.NArg() > 0 {
						return clibase.Usagef("version takes no arguments")
					}
					fmt.Fprintf(stdout, "microvm %s\n", Version)
					return nil
				},
			},
		}, namedCommands(stdin, stdout, stderr)...),
	}
}

// onUsageError turns flag parsing errors into usage errors (exit status 2)
// without printing the whole help text.
func onUsageError(_ *cli.Context, err error, _ bool) error { return clibase.UsageError{Err: err} }

// runCommand is `microvm run` (clibase.RunPlain; a named VM, named.go).
func runCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "run",
		Usage:        "boot a guest kernel",
		OnUsageError: onUsageError,
		UsageText:    "microvm run --kernel PATH [--initrd PATH] [--cmdline STR] [--cpus N] [--memory SIZE] [--irqchip split|kernel] [--acpi on|off] [--cpu-hide LIST] [--vsock-cid N --vsock-uds PATH [--vsock-opt LIST]] " + deviceSynopsis() + " [--chroot DIR] [--uid N --gid N] [--seccomp=off] [--log-level LEVEL]",
		Flags:        cliFlags(clibase.RunOpts()),
		Action: func(c *cli.Context) error {
			if err := clibase.CheckRunArgs(c, c.Args().Slice()); err != nil {
				return err
			}
			if clibase.WantsNamed(c) {
				return runNamed(c, stdin, stdout, stderr)
			}
			return clibase.RunPlain(c, stdin, stdout, stderr, clibase.Plain{StartCPUProfile: startCPUProfile})
		},
	}
}
