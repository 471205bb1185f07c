// Command kvmbox runs a command inside the nested-KVM box (package kvmbox).
// Use it through scripts/kvmbox, which builds the L1 kernel and the box's
// init first and passes their paths:
//
//	scripts/kvmbox [--cpus N] [--memory SIZE] [--timeout DURATION] [--stall-timeout DURATION] [--quiet-timeout DURATION] -- CMD [ARG...]
//
// The exit status is CMD's (128+N when signal N ended it); 125 means the box
// itself failed, with one line on stderr saying why.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/microvm/microvm/internal/testing/kvmbox"
)

func main() { os.Exit(Main(os.Args[1:], os.Stderr)) }

// Main parses args, runs the box and returns the exit status.
func Main(args []string, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "kvmbox: "+format+"\n", a...)
		return kvmbox.ExitBoxFailure
	}
	fs := flag.NewFlagSet("kvmbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o kvmbox.Options
	cpus := 2
	if v := os.Getenv("KVMBOX_CPUS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fail("KVMBOX_CPUS=%q: want a number of vCPUs (1..8)", v)
		}
		cpus = n
	}
	fs.IntVar(&o.CPUs, "cpus", cpus, "vCPUs of the box (1..8; default $KVMBOX_CPUS, else 2)")
	mem := fs.String("memory", "3G", "memory of the box: a number of MiB, or with an M or G suffix")
	fs.StringVar(&o.QEMU, "qemu", os.Getenv("KVMBOX_QEMU"), "the qemu-system-x86_64 to run (default $KVMBOX_QEMU, else the one in PATH)")
	fs.StringVar(&o.TCGThread, "tcg-thread", cmp.Or(os.Getenv("KVMBOX_TCG_THREAD"), "multi"), "QEMU's TCG threading: multi (a host thread per vCPU) or single (default $KVMBOX_TCG_THREAD, else multi)")
	fs.StringVar(&o.L1Append, "l1-append", os.Getenv("KVMBOX_L1_APPEND"), "added to the L1 kernel's command line, e.g. kvm_amd.npt=1 (default $KVMBOX_L1_APPEND)")
	fs.StringVar(&o.CPU, "cpu", cmp.Or(os.Getenv("KVMBOX_CPU"), kvmbox.DefaultCPU), "QEMU's -cpu for the box (default $KVMBOX_CPU, else "+kvmbox.DefaultCPU+")")
	fs.DurationVar(&o.Timeout, "timeout", 0, "end the box after this long (0: no limit)")
	fs.DurationVar(&o.StallTimeout, "stall-timeout", kvmbox.DefaultStallTimeout, "end the box when its L1 kernel sent no heartbeat for this long (0: never)")
	fs.DurationVar(&o.QuietTimeout, "quiet-timeout", 0, "end the box when the command printed nothing for this long (0: never)")
	fs.StringVar(&o.Kernel, "kernel", "", "the L1 bzImage (scripts/kvmbox passes build/kvmbox/bzImage)")
	fs.StringVar(&o.Init, "init", "", "the box's static init (scripts/kvmbox passes build/kvmbox/init)")
	fs.StringVar(&o.Repo, "repo", "", "directory shared read-write at the same path (scripts/kvmbox passes the repository)")
	fs.StringVar(&o.ConsoleLog, "console-log", "", "keep the L1 console log in this file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: scripts/kvmbox [--cpus N] [--memory SIZE] [--timeout DURATION] -- CMD [ARG...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return kvmbox.ExitBoxFailure
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return fail("no command given (usage: scripts/kvmbox [flags] -- CMD [ARG...])")
	}
	mib, err := parseMiB(*mem)
	if err != nil {
		return fail("--memory %q: %v", *mem, err)
	}
	o.MemoryMiB = mib
	if o.Timeout < 0 || o.StallTimeout < 0 || o.QuietTimeout < 0 {
		return fail("--timeout, --stall-timeout and --quiet-timeout must not be negative")
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = -1 // Options' "never"
	}

	// SIGINT or SIGTERM ends the box (QEMU is killed) with 128+signal.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var caught atomic.Int32
	go func() {
		select {
		case s := <-sigs:
			caught.Store(int32(s.(syscall.Signal)))
			cancel()
		case <-ctx.Done():
		}
	}()
	code, err := kvmbox.Run(ctx, o, argv)
	if sig := caught.Load(); sig != 0 {
		fmt.Fprintf(stderr, "kvmbox: stopped by %v\n", syscall.Signal(sig))
		return 128 + int(sig)
	}
	if err != nil {
		return fail("%s", strings.TrimPrefix(err.Error(), "kvmbox: "))
	}
	return code
}

// parseMiB reads "3072", "3072M" or "3G".
func parseMiB(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "G"), strings.HasSuffix(s, "g"):
		mult, s = 1024, s[:len(s)-1]
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, errors.New("want a positive number of MiB, or a size like 2G")
	}
	return n * mult, nil
}
