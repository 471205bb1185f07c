//go:build linux

// Command microvm-agent is the guest agent: it serves package agent's gRPC
// API (docs/agent.md) on vsock, or on a Unix socket.
//
//	microvm-agent [-listen vsock://:1024 | -listen unix:///path] [-poweroff-after-exec] [-v]
//
// Run as PID 1 (the guest's /init) it first mounts /proc, /sys, devtmpfs on
// /dev, devpts, tmpfs on /dev/shm, /tmp and /run, and brings up lo; with
// microvm.root=DEV on the kernel command line (microvm --image) it first
// makes an overlay of the image on DEV and a tmpfs its root (pid1.ImageRoot); it reaps every orphan
// (agent.Reaper) and powers the machine off on Shutdown, or when the last
// Exec ends with -poweroff-after-exec, or if serving fails: PID 1 must never
// exit. Run otherwise it is an ordinary service that waits for its own
// children only and exits on Shutdown.
//
// Build it static: CGO_ENABLED=0 go build ./guest/agent/cmd/microvm-agent.
//
// Goroutines: main serves; the stopper (started once by stopOnce) stops the
// server gracefully, bounded by stopGrace, then powers off or exits.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/microvm/microvm/guest/agent"
	"github.com/microvm/microvm/guest/vsocknet"
)

// stopGrace bounds the wait for running calls (the Shutdown reply among
// them) before the server is stopped hard.
const stopGrace = 2 * time.Second

// errListen reports a -listen value that names no supported socket.
var errListen = errors.New("want vsock://:PORT or unix:///PATH")

func main() {
	if os.Args[0] == agent.ContainerInitArg0 {
		agent.ContainerInit() // a container process's set-up step; never returns
	}
	listen := flag.String("listen", "vsock://:1024", "where to serve: vsock://:PORT or unix:///PATH")
	afterExec := flag.Bool("poweroff-after-exec", false, "power off (exit, if not PID 1) when the last running Exec ends")
	version := flag.Bool("version", false, "print the version and exit")
	verbose := flag.Bool("v", os.Getenv("MICROVM_AGENT_VERBOSE") == "1",
		"log each Exec's start and end (on a serial console every byte costs a VM exit; as /init, set MICROVM_AGENT_VERBOSE=1 on the kernel command line)")
	flag.Parse()
	if *version {
		fmt.Println(agent.Version)
		return
	}
	log.SetPrefix("microvm-agent: ")
	pid1 := os.Getpid() == 1
	end := func(code int) { os.Exit(code) }
	var reaper *agent.Reaper
	if pid1 {
		defer func() {
			if v := recover(); v != nil {
				log.Printf("panic: %v", v)
				powerOff()
			}
		}()
		end = func(int) { powerOff() }
		if err := setupSystem(); err != nil {
			log.Print(err)
			powerOff()
		}
		reaper = agent.NewReaper()
	}

	ln, err := listenOn(*listen)
	if err != nil {
		log.Print(err)
		end(1)
	}
	var (
		srv      *agent.Server
		stopOnce sync.Once
	)
	stop := func() {
		stopOnce.Do(func() {
			go func() {
				done := make(chan struct{})
				go func() { srv.GracefulStop(); close(done) }()
				select {
				case <-done:
				case <-time.After(stopGrace):
					srv.Stop()
				}
			}()
		})
	}
	opts := agent.Options{Shutdown: stop, Reaper: reaper}
	if pid1 && haveCgroup2() {
		opts.CgroupRoot = cgroupRoot
	}
	if *verbose {
		opts.Logf = log.Printf
	}
	if *afterExec {
		opts.Idle = stop
	}
	srv = agent.New(opts)
	log.Printf("serving on %v (pid 1: %v)", ln.Addr(), pid1)
	if err := srv.Serve(ln); err != nil {
		log.Print(err)
		end(1)
	}
	log.Print("stopped")
	end(0)
}

// listenOn parses -listen and listens there.
func listenOn(s string) (net.Listener, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("-listen %q: %w", s, err)
	}
	switch u.Scheme {
	case "vsock":
		port, err := strconv.ParseUint(u.Port(), 10, 32)
		if err != nil || u.Hostname() != "" {
			return nil, fmt.Errorf("-listen %q: %w", s, errListen)
		}
		ln, err := vsocknet.Listen(uint32(port))
		if err != nil {
			return nil, err
		}
		return ln, nil
	case "unix":
		if u.Path == "" {
			return nil, fmt.Errorf("-listen %q: %w", s, errListen)
		}
		os.Remove(u.Path) // a stale socket from an earlier run
		return net.Listen("unix", u.Path)
	}
	return nil, fmt.Errorf("-listen %q: %w", s, errListen)
}
