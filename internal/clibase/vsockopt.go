package clibase

import (
	"strings"

	"github.com/microvm/microvm/vsock"
)

// VsockOptFlag is --vsock-opt, shared by `run` and `vhost-user-vsock`: the
// vsock device's data-path optimisations (vsock.Options), each switchable so
// it can be measured on and off (docs/notes/performance.md).
func VsockOptFlag() Opt {
	return StringOpt("vsock-opt", "",
		"vsock data-path optimisations, a comma list of KEY=VALUE changing the defaults: "+
			"kick-suppress=on|off, direct-enqueue=on|off, batch=on|off, short-read=on|off, sndbuf=on|off, ready-gate=on|off, irq-coalesce=on|off, "+
			"dgram=on|off (experimental datagrams, off by default: host sockets PATH.dgram and PATH_<port>.dgram) "+
			"(e.g. kick-suppress=off,batch=off)")
}

// vsockOptKeys are the keys --vsock-opt knows, in the order help lists them.
var vsockOptKeys = []string{"kick-suppress", "direct-enqueue", "batch", "short-read", "sndbuf", "ready-gate", "irq-coalesce", "dgram"}

// VsockOpt is what --vsock-opt selects: the data-path optimisations, and
// whether the device offers datagrams (vsock.Config.Dgram; a feature, not an
// optimisation, so it lives outside vsock.Options).
type VsockOpt struct {
	vsock.Options
	Dgram bool
}

// ParseVsockOpt reads a --vsock-opt value: KEY=VALUE pairs separated by
// commas, each changing one field of vsock.DefaultOptions (or, for dgram,
// turning datagrams on). An empty value is the defaults. Unknown keys,
// repeated keys and bad values are usage errors naming the pair.
func ParseVsockOpt(s string) (VsockOpt, error) {
	o := VsockOpt{Options: vsock.DefaultOptions}
	if strings.TrimSpace(s) == "" {
		return o, nil
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return o, Usagef("--vsock-opt %q: %q is not KEY=VALUE (keys: %s)", s, item, strings.Join(vsockOptKeys, ", "))
		}
		if seen[k] {
			return o, Usagef("--vsock-opt %q: %s given twice", s, k)
		}
		seen[k] = true
		var flag *bool
		switch k {
		case "kick-suppress":
			flag = &o.KickSuppress
		case "direct-enqueue":
			flag = &o.DirectEnqueue
		case "batch":
			flag = &o.BatchLock
		case "short-read":
			flag = &o.ShortReadDrains
		case "sndbuf":
			flag = &o.SendBuffer
		case "ready-gate":
			flag = &o.ReadinessGate
		case "irq-coalesce":
			flag = &o.IRQCoalesce
		case "dgram":
			flag = &o.Dgram
		default:
			return o, Usagef("--vsock-opt %q: unknown key %q (keys: %s)", s, k, strings.Join(vsockOptKeys, ", "))
		}
		switch v {
		case "on":
			*flag = true
		case "off":
			*flag = false
		default:
			return o, Usagef("--vsock-opt %q: %s=%s: want on or off", s, k, v)
		}
	}
	return o, nil
}
