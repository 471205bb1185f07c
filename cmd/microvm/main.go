// Command microvm runs KVM micro-VMs. See the README for usage and exit
// codes.
package main

import (
	"os"
)

func main() {
	ownsProcess = true
	os.Exit(Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
