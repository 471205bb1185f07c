package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/devices/rng"
)

// diskList is the repeatable --disk flag: each use adds a disk, in order.
// A cli.Generic rather than a StringSliceFlag, which would split the value
// at its commas.
type diskList struct{ disks []microvm.DiskConfig }

// Set parses one --disk value: path=F[,readonly][,serial=S].
func (l *diskList) Set(s string) error {
	d, err := parseDisk(s)
	if err != nil {
		return err
	}
	l.disks = append(l.disks, d)
	return nil
}

func (l *diskList) String() string { return "" }

func parseDisk(s string) (microvm.DiskConfig, error) {
	var d microvm.DiskConfig
	for _, kv := range strings.Split(s, ",") {
		k, v, hasV := strings.Cut(kv, "=")
		switch {
		case k == "path" && hasV && v != "":
			d.Path = v
		case k == "readonly" && !hasV:
			d.ReadOnly = true
		case k == "serial" && hasV:
			d.Serial = v
		default:
			return d, fmt.Errorf("--disk %q: unknown or malformed %q; want path=FILE[,readonly][,serial=S]", s, kv)
		}
	}
	if d.Path == "" {
		return d, fmt.Errorf("--disk %q: no path=FILE", s)
	}
	return d, nil
}

// onOff is a flag that is on when given alone and takes on/off (or
// true/false) as a value: --rng, --rng=off.
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

// deviceFlags are the disk, rng and network flags of run and exec.
func deviceFlags() []cli.Flag {
	return []cli.Flag{
		&cli.GenericFlag{Name: "disk", Value: &diskList{}, Usage: "add a virtio-blk disk over a raw image: path=FILE[,readonly][,serial=S] (repeatable: /dev/vda, /dev/vdb, ... in order)"},
		&cli.StringFlag{Name: "root", Usage: "boot from this disk (/dev/vda, ...) instead of the initramfs: adds root=DEV rw (ro for a read-only disk)"},
		&cli.GenericFlag{Name: "rng", Value: &onOff{on: true}, DefaultText: "on", Usage: "virtio-rng entropy device fed from getrandom (--rng=off leaves it out)"},
		&cli.StringFlag{Name: "rng-rate", Usage: "limit the rng device to this many bytes per second (SIZE[/s]; a bare number means bytes; default no limit)"},
		netFlag(),
		&cli.StringFlag{Name: "metrics-socket", Usage: "serve the VM's metrics (Prometheus text format, GET /metrics) over HTTP on this Unix socket (docs/metrics.md)"},
	}
}

// readDeviceFlags adds the disks, the root, the rng and the network
// devices, and the metrics socket, to cfg.
func readDeviceFlags(c *cli.Context, cfg *microvm.Config) error {
	var err error
	cfg.MetricsSocket = c.String("metrics-socket")
	if c.IsSet("metrics-socket") && cfg.MetricsSocket == "" {
		return usagef("--metrics-socket needs a path")
	}
	if err := microvm.CheckMetricsSocket(cfg.MetricsSocket); err != nil {
		return err // an ErrConfig: a usage error
	}
	if cfg.Nets, err = readNets(c); err != nil {
		return err
	}
	if l, ok := c.Generic("disk").(*diskList); ok {
		cfg.Disks = l.disks
	}
	cfg.Root = c.String("root")
	if cfg.Root != "" && len(cfg.Disks) == 0 {
		return usagef("--root %s needs a --disk", cfg.Root)
	}
	on := true
	if o, ok := c.Generic("rng").(*onOff); ok {
		on = o.on
	}
	if !on {
		if c.IsSet("rng-rate") {
			return usagef("--rng-rate needs the rng device (--rng=off leaves it out)")
		}
		return nil
	}
	cfg.RNG = &microvm.RNGConfig{}
	if r := c.String("rng-rate"); r != "" {
		v, err := parseBytes(strings.TrimSuffix(r, "/s"))
		if err != nil || v == 0 || v > rng.MaxRate {
			return usagef("--rng-rate %q: want a rate between 1 byte/s and 1G/s", r)
		}
		cfg.RNG.Rate = v
	}
	return nil
}
