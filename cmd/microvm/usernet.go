//go:build !microvm_lean

package main

import (
	"context"
	"io"
	stdlog "log"
	"net"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/seccomp"
)

// vmmPolicy is the seccomp allow-list for a machine of cfg: a user-mode
// network needs IPv4 and IPv6 sockets for its egress.
func vmmPolicy(cfg microvm.Config) seccomp.Policy {
	if cfg.HasUserNet() {
		return seccomp.VMMUserNet()
	}
	return seccomp.VMM()
}

// prepareUserNet does, before the machine is built, what a user-mode
// network (--net user) needs from the process: Go's resolver reads its
// configuration while it still may (the filter then refuses opening it
// again: seccomp.VMMUserNet), and gvisor-tap-vsock's messages, which it
// writes to logrus's standard logger, become debug lines of log.
// checkUserNet has checked the command line.
func prepareUserNet(cfg microvm.Config, log logrus.FieldLogger) {
	if !cfg.HasUserNet() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = net.DefaultResolver.LookupHost(ctx, "localhost")
	std := logrus.StandardLogger()
	std.SetOutput(io.Discard)
	std.AddHook(debugHook{log})
	// Its port forwarder (inetaf/tcpproxy) writes to the standard
	// library's logger: a guest port that refuses a published
	// connection, say.
	stdlog.SetFlags(0)
	stdlog.SetOutput(debugWriter{log})
}

// debugWriter turns the standard library logger's lines into debug lines.
type debugWriter struct{ to logrus.FieldLogger }

func (w debugWriter) Write(p []byte) (int, error) {
	w.to.WithField("from", "usernet").Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}

// debugHook passes another logger's entries on as debug lines.
type debugHook struct{ to logrus.FieldLogger }

func (debugHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h debugHook) Fire(e *logrus.Entry) error {
	h.to.WithFields(e.Data).WithField("from", "usernet").Debug(e.Message)
	return nil
}

// runInFullBuild: this is the full build; it runs everything itself.
func runInFullBuild(microvm.Config) (bool, error) { return false, nil }
