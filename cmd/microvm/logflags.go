package main

import (
	"io"

	"github.com/sirupsen/logrus"
)

// logFlags are --log-level and --log-format, on every command that logs.
func logFlags() []opt {
	return []opt{
		stringOpt("log-level", "warn", "diagnostics on stderr: panic, fatal, error, warn, info, debug or trace"),
		stringOpt("log-format", "text", "diagnostics as text lines, or json: one JSON object a line, for machines"),
	}
}

// setupLog is the logger logFlags ask for, writing to stderr.
func setupLog(c flagValues, stderr io.Writer) (*logrus.Logger, error) {
	lvl, err := logrus.ParseLevel(c.String("log-level"))
	if err != nil {
		return nil, usagef("--log-level %q: want one of panic, fatal, error, warn, info, debug, trace", c.String("log-level"))
	}
	l := logrus.New()
	l.SetOutput(stderr)
	l.SetLevel(lvl)
	switch f := c.String("log-format"); f {
	case "text", "":
		l.SetFormatter(&logrus.TextFormatter{DisableTimestamp: false, FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	case "json":
		l.SetFormatter(jsonFormatter{})
	default:
		return nil, usagef("--log-format %q: want text or json", f)
	}
	return l, nil
}
