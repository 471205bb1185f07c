package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/devices/virtionet"
)

// netList collects --net values, one device per occurrence. It is a
// cli.Generic rather than a string slice because the value itself holds
// commas (tap=NAME,mac=M), which a slice flag would split.
type netList struct {
	nets []microvm.NetConfig
}

// Set parses one --net value: tap=NAME[,mac=M].
func (l *netList) Set(s string) error {
	nc, err := parseNet(s)
	if err != nil {
		return err
	}
	l.nets = append(l.nets, nc)
	return nil
}

// String shows the collected devices as they were given.
func (l *netList) String() string {
	var parts []string
	for _, n := range l.nets {
		p := "tap=" + n.TAP
		if n.MAC != nil {
			p += ",mac=" + n.MAC.String()
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

func parseNet(s string) (microvm.NetConfig, error) {
	var nc microvm.NetConfig
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return nc, fmt.Errorf("--net %q: want tap=NAME[,mac=M]", s)
		}
		switch k {
		case "tap":
			if nc.TAP != "" {
				return nc, fmt.Errorf("--net %q: tap given twice", s)
			}
			if len(v) > 15 || strings.ContainsAny(v, "/ \t") {
				return nc, fmt.Errorf("--net %q: TAP name %q: want at most 15 bytes, no '/' or spaces", s, v)
			}
			nc.TAP = v
		case "mac":
			if nc.MAC != nil {
				return nc, fmt.Errorf("--net %q: mac given twice", s)
			}
			m, err := virtionet.ParseMAC(v)
			if err != nil {
				return nc, fmt.Errorf("--net %q: %w", s, err)
			}
			nc.MAC = m
		default:
			return nc, fmt.Errorf("--net %q: unknown key %q (want tap or mac)", s, k)
		}
	}
	if nc.TAP == "" {
		return nc, fmt.Errorf("--net %q: tap=NAME is required", s)
	}
	return nc, nil
}

func netFlag() cli.Flag {
	return &cli.GenericFlag{
		Name:  "net",
		Value: &netList{},
		Usage: fmt.Sprintf("add a virtio-net device on host TAP NAME (attached, or created with CAP_NET_ADMIN), guest MAC M or a random one; repeatable, at most %d: tap=NAME[,mac=M]", microvm.MaxNets),
	}
}

// readNets returns the --net devices in command-line order.
func readNets(c *cli.Context) ([]microvm.NetConfig, error) {
	l, _ := c.Generic("net").(*netList)
	if l == nil {
		return nil, nil
	}
	if len(l.nets) > microvm.MaxNets {
		return nil, usagef("--net: %d devices; at most %d", len(l.nets), microvm.MaxNets)
	}
	return l.nets, nil
}
