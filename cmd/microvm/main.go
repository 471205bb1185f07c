// Command microvm runs KVM micro-VMs. See docs/cli.md for usage and exit
// codes.
//
// This is the lean binary (bin/microvm, and what go install builds): it
// runs `run` and `version` itself, parsing `run`'s flags with the standard
// flag package (lean.go; internal/clibase declares them once for both
// binaries), and hands every other command line, help and bad flags
// included, over to microvm-full (cmd/microvm-full): exec and agent, the
// image and guest image tools, vhost-user-vsock, vsock-connect, ci and the
// named VMs' commands. So `microvm run` neither links nor initialises what
// only they use (gRPC, protobuf, whose detrand reads the executable at
// start-up, the image readers and writers, the vhost-user back-end,
// urfave/cli with its regexps and help templates; deps_test.go keeps them
// out), and the user still types `microvm exec`. docs/benchmarks.md
// ("Start-up") measures both.
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
