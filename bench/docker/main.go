// Command docker-bench measures Docker in a microVM through `microvm exec
// --docker` (docs/ci.md, "Jobs that build containers") and the cache disks
// it keeps Docker's data root on, in two parts that may run on different
// machines (make bench-docker runs the first on this host and the second
// where Linux boots: here, or the nested-KVM box):
//
//	docker-bench cache -dir DIR [-n 5] [-json F]
//	    host only, no VM: a 1 GiB cache disk (ext4) in a store under DIR
//	    (internal/cachedisk) holding 100 MiB, checked out (cloned), 100 MiB
//	    written as a job would, committed as the next version, -n times;
//	    the clone and commit times, the clone method (reflink or sparse
//	    copy) and DIR's file system;
//	docker-bench vm -state DIR -microvm BIN -kernel K -agent A -image TAR [-import-only] [-json F]
//	    imports TAR into microvm's state DIR where it is not there yet
//	    (only that with -import-only: make bench-docker does it on this
//	    host, where it is faster than in the box); then two execs of
//	    that image (TAR: make debian-docker-image) with --docker and one
//	    --cache at /var/lib/docker, the first on an empty cache, the
//	    second on the version the first committed. Each times,
//	    from this side, the exec's start until the guest's first line
//	    ("daemon up", printed after `docker info` answered: the command
//	    starts only once --docker's dockerd is up) and the whole exec (the
//	    cache's commit included); in the guest (date +%s%N), `docker build`
//	    of a small project (a busybox image FROM scratch and a two-stage
//	    image from it, from a directory shared with --share) and `docker
//	    run --rm` of that image. The second build must report "Using
//	    cache".
//
// The vm part boots Linux: where this host's KVM cannot (none, or PVM),
// make bench-docker runs it in the nested-KVM box, and the table says so:
// there the figures are QEMU TCG's and show that it works, not its speed.
//
// Exit status: 0 when everything was measured, 1 when a step failed (the
// message says which), 2 for a bad command line.
package main

import (
	"flag"
	"fmt"
	"os"
)

const prog = "docker-bench"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "cache":
		err = cacheMain(os.Args[2:])
	case "vm":
		err = vmMain(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s cache -dir DIR [-n 5] [-json F]\n", prog)
	fmt.Fprintf(os.Stderr, "       %s vm -state DIR -microvm BIN -kernel K -agent A -image TAR [-import-only] [-json F]\n", prog)
	os.Exit(2)
}

// parse parses args into fs, exiting 2 on a bad command line.
func parse(fs *flag.FlagSet, args []string) {
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		usage()
	}
}
