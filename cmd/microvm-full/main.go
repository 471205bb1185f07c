// Command microvm-full is microvm with every command, parsed by
// urfave/cli (cli.go): run, exec and agent, the image and guest image
// tools, vhost-user-vsock, vsock-connect, ci and the named VMs' commands.
// See docs/cli.md for usage and exit codes.
//
// make builds it as bin/microvm-full, beside bin/microvm (cmd/microvm), the
// lean binary the user types, which runs `run` and `version` itself and
// hands every other command line, help and bad flags included, over to
// this one. What both parse and run (run's flags, the run of a VM without
// a name, logs, confinement, signals, exit status) is internal/clibase.
package main

import (
	"os"

	"github.com/microvm/microvm/internal/clibase"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

func main() {
	clibase.OwnsProcess = true
	os.Exit(Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
