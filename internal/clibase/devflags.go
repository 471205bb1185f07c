package clibase

import (
	"fmt"
	"strings"

	"github.com/microvm/microvm"
)

// deviceFlag is a device kind's flag (microvm.Flag) on the command line:
// its values are kept, in order, and applied to the Config once all flags
// are parsed (ReadDeviceFlags). A value of its own rather than a string
// slice, which urfave/cli would split at commas.
type deviceFlag struct {
	vals []string
}

func (d *deviceFlag) Set(s string) error { d.vals = append(d.vals, s); return nil }
func (d *deviceFlag) String() string     { return strings.Join(d.vals, " ") }

// boolDeviceFlag is a deviceFlag that may stand alone (--rng).
type boolDeviceFlag struct{ deviceFlag }

// IsBoolFlag lets the flag stand alone (the standard flag package's
// boolFlag interface); alone it means "on".
func (*boolDeviceFlag) IsBoolFlag() bool { return true }

// DeviceFlags are the flags of every device kind (microvm.DeviceFlags) and
// the metrics socket, for run and exec.
func DeviceFlags() []Opt {
	var fs []Opt
	for _, f := range microvm.DeviceFlags() {
		var v FlagValue = &deviceFlag{}
		if f.Bool {
			v = &boolDeviceFlag{}
		}
		fs = append(fs, ValueOpt(f.Name, v, f.Default, f.Usage))
	}
	return append(fs, StringOpt("metrics-socket", "", "serve the VM's metrics (Prometheus text format, GET /metrics) over HTTP on this Unix socket (docs/metrics.md)"))
}

// ReadDeviceFlags applies the device flags, and the metrics socket, to
// cfg: the kinds' defaults first, then each flag's values in order.
func ReadDeviceFlags(c FlagValues, cfg *microvm.Config) error {
	cfg.MetricsSocket = c.String("metrics-socket")
	if IsSet(c, "metrics-socket") && cfg.MetricsSocket == "" {
		return Usagef("--metrics-socket needs a path")
	}
	if err := microvm.CheckMetricsSocket(cfg.MetricsSocket); err != nil {
		return err // an ErrConfig: a usage error
	}
	microvm.DeviceFlagDefaults(cfg)
	for _, f := range microvm.DeviceFlags() {
		var vals []string
		switch v := c.Generic(f.Name).(type) {
		case *deviceFlag:
			vals = v.vals
		case *boolDeviceFlag:
			vals = v.vals
		default:
			return fmt.Errorf("--%s: not a device flag (%T)", f.Name, v)
		}
		for _, s := range vals {
			if err := f.Set(cfg, s); err != nil {
				return err // an ErrConfig: a usage error
			}
		}
	}
	return microvm.FinishDeviceFlags(cfg, func(name string) bool { return IsSet(c, name) })
}

// onOff is a flag that is on when given alone and takes on/off (or
// true/false) as a value: --seccomp, --seccomp=off.
type onOff struct{ on bool }

func (o *onOff) Set(s string) error {
	switch strings.ToLower(s) {
	case "on", "true", "1", "yes":
		o.on = true
	case "off", "false", "0", "no":
		o.on = false
	default:
		return fmt.Errorf("%q: want on or off", s)
	}
	return nil
}

func (o *onOff) String() string {
	if o.on {
		return "on"
	}
	return "off"
}

// IsBoolFlag lets the flag stand alone (the standard flag package's
// boolFlag interface).
func (o *onOff) IsBoolFlag() bool { return true }
