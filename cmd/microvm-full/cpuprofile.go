package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/clibase"
)

// startCPUProfile starts the CPU profile --cpuprofile asks for (none when
// it is not given); stop writes it out and closes the file. The file is
// created before the machine is built and the filter installed, so a
// --chroot or --uid does not change where it goes; the policy must then
// allow the profiler's timers (seccomp.Policy.WithCPUProfiling). Read it
// with `go tool pprof bin/microvm-full PROFILE`. The lean binary hands a
// command line with --cpuprofile to this one (lean.go), so runtime/pprof
// stays off its start-up.
func startCPUProfile(c clibase.FlagValues, log logrus.FieldLogger) (stop func(), err error) {
	path := c.String("cpuprofile")
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, clibase.Usagef("--cpuprofile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	log.WithField("file", path).Info("CPU profile started")
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.WithError(err).Warn("--cpuprofile: writing the profile")
		}
	}, nil
}
