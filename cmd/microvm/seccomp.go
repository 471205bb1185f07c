package main

import (
	"errors"
	"fmt"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/seccomp"
)

// ownsProcess says that Main runs as the process's own program (main, or
// the test binary acting as the CLI), so it may confine the whole process.
// Main called from inside another program (the package's in-process tests)
// never installs the filter: it would stay on that program for the rest
// of its life.
var ownsProcess bool

// afterConfine, when set (only by tests), runs right after the filter is
// installed: TestSeccompForbiddenCall makes a forbidden call there.
var afterConfine func()

// seccompHint ends the report of a forbidden call.
const seccompHint = "--seccomp=off runs without the filter; docs/security.md"

// seccompFlag is --seccomp, on by default, for the commands that run a
// device: run, exec, vhost-user-vsock.
func seccompFlag() cli.Flag {
	return &cli.GenericFlag{Name: "seccomp", Value: &onOff{on: true}, DefaultText: "on",
		Usage: "confine microvm to the system calls it needs once the VM is set up; a forbidden call ends it with one line naming the call, status 159 (--seccomp=off to debug; docs/security.md)"}
}

// confine installs policy's seccomp filter on the whole process unless
// --seccomp=off says not to. It is called once the machine (or back-end)
// is set up and before it runs guest-driven code. A kernel without seccomp
// filters is an error that names the way out.
func confine(c *cli.Context, policy seccomp.Policy, log logrus.FieldLogger) error {
	if o, ok := c.Generic("seccomp").(*onOff); ok && !o.on {
		log.Info("seccomp: filter off (--seccomp=off)")
		return nil
	}
	if !ownsProcess {
		log.Debug("seccomp: filter not installed: Main runs inside another program")
		return nil
	}
	if err := seccomp.Install(policy, seccomp.Options{Prefix: "microvm", Hint: seccompHint}); err != nil {
		if errors.Is(err, seccomp.ErrUnsupported) {
			return fmt.Errorf("%w (run with --seccomp=off to go without it)", err)
		}
		return err
	}
	log.WithField("policy", policy.Name()).Debug("seccomp: filter installed")
	if afterConfine != nil {
		afterConfine()
	}
	return nil
}
