package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/microvm/microvm/guest/pid1"
)

const (
	defaultTimeout = 60 * time.Second
	hungGrace      = 2 * time.Second
)

func main() {
	if os.Getpid() != 1 {
		os.Exit(hostMain())
	}
	defer func() {
		// Last resort: a panic here would kill PID 1 and panic the kernel.
		if v := recover(); v != nil {
			fmt.Printf("init: panic: %v\ninit: done fail\n", v)
			endVM()
		}
	}()
	setupSystem()
	pid1.LoadModules(pid1.ModuleOrder, func(format string, args ...any) { fmt.Printf("init: "+format+"\n", args...) })
	fmt.Println("init: ready")
	cmdline, err := readCmdline()
	if err != nil {
		fmt.Printf("init: read command line: %v\n", err)
	}
	params, err := ParseCmdline(cmdline)
	if err != nil {
		fmt.Printf("init: %v\ninit: done fail\n", err)
		endVM()
	}
	r := &Runner{Registry: scenarios, Net: vsockNetwork{}, DefaultTimeout: defaultTimeout, Grace: hungGrace}
	r.Run(context.Background(), params, os.Stdout)
	endVM()
}

// hostMain runs /init as an ordinary program, for debugging on a host or in
// a guest shell: the command line comes from -cmdline, nothing is mounted and
// the machine is not rebooted. The exit status is 0 when all scenarios pass.
func hostMain() int {
	cmdline := flag.String("cmdline", "", "kernel-style command line (default: /proc/cmdline)")
	list := flag.Bool("list", false, "list the scenarios and exit")
	flag.Parse()
	if *list {
		for _, name := range scenarios.Names() {
			fmt.Printf("%-16s %s\n", name, scenarios[name].Doc)
		}
		return 0
	}
	if *cmdline == "" {
		s, err := readCmdline()
		if err != nil {
			fmt.Fprintln(os.Stderr, "init:", err)
			return 2
		}
		*cmdline = s
	}
	params, err := ParseCmdline(*cmdline)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 2
	}
	r := &Runner{Registry: scenarios, Net: vsockNetwork{}, DefaultTimeout: defaultTimeout, Grace: hungGrace}
	if !r.Run(context.Background(), params, os.Stdout) {
		return 1
	}
	return 0
}
