// Command microvm runs KVM micro-VMs. See docs/cli.md for usage and exit
// codes.
package main

// The CLI has two builds. The full build of this package (go build
// ./cmd/microvm, go install, the tests) holds every command, parsed by
// urfave/cli (cli.go). `make` builds two binaries from it: bin/microvm-full,
// the full build, and bin/microvm, the lean build (tag microvm_lean),
// which runs `run` and `version` itself, parsing `run`'s flags with the
// standard flag package (lean.go, leanflags.go), and hands every other
// command line, help and bad flags included, over to microvm-full: exec and
// agent, the image and guest image tools, vhost-user-vsock, vsock-connect,
// ci and the named VMs' commands. So `microvm run` neither links nor
// initialises what only they use (gRPC, protobuf, whose detrand reads the
// executable at start-up, the image readers and writers, the vhost-user
// back-end, urfave/cli with its regexps and help templates), and the user
// still types `microvm exec`. docs/benchmarks.md ("Start-up") measures
// both.

import (
	"os"
)

func main() {
	ownsProcess = true
	os.Exit(Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
