package clibase

import (
	"io"

	"github.com/sirupsen/logrus"
)

// LogFlags are --log-level and --log-format, on every command that logs.
func LogFlags() []Opt {
	return []Opt{
		StringOpt("log-level", "warn", "diagnostics on stderr: panic, fatal, error, warn, info, debug or trace"),
		StringOpt("log-format", "text", "diagnostics as text lines, or json: one JSON object a line, for machines"),
	}
}

// SetupLog is the logger LogFlags ask for, writing to stderr.
func SetupLog(c FlagValues, stderr io.Writer) (*logrus.Logger, error) {
	lvl, err := logrus.ParseLevel(c.String("log-level"))
	if err != nil {
		return nil, Usagef("--log-level %q: want one of panic, fatal, error, warn, info, debug, trace", c.String("log-level"))
	}
	l := logrus.New()
	l.SetOutput(stderr)
	l.SetLevel(lvl)
	switch f := c.String("log-format"); f {
	case "text", "":
		l.SetFormatter(&logrus.TextFormatter{DisableTimestamp: false, FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	case "json":
		l.SetFormatter(JSONFormatter{})
	default:
		return nil, Usagef("--log-format %q: want text or json", f)
	}
	return l, nil
}
