package microvm

// The network device kind (virtio-net): NetConfig and its checks, the ip=
// a user-mode network adds to the kernel command line, how New builds the
// devices (on a TAP, or on a user-mode network: usernet.go), their
// counters (NetMetrics, the microvm_net_* families) and their
// command-line flags (--net, --publish).

import (
	"fmt"
	"net"
	"strings"

	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/devices/virtionet/usernet/netpolicy"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/virtio"
)

// netDevices is the network devices' part of deviceSet.
type netDevices struct {
	nets    []*virtionet.Device // Config.Nets, in order
	netMMIO []*virtio.MMIO
}

// MaxNets bounds Config.Nets: the virtio-mmio slots are shared with the
// other devices (docs/machine.md).
const MaxNets = 4

// NetConfig adds a virtio-net device on a host TAP interface or on a
// user-mode network (docs/net.md).
type NetConfig struct {
	// TAP is the host interface. microvm attaches to it, creating it when
	// it does not exist and microvm has CAP_NET_ADMIN; the host side's
	// address and link state are the caller's to set.
	TAP string
	// NetNS is the network namespace the TAP is in or is created in (a
	// path such as /var/run/netns/NAME; "" is microvm's own): how a
	// container runtime puts the VM on a pod's network (docs/net.md).
	NetNS string
	// User, instead of a TAP, puts the device on a user-mode network
	// (devices/virtionet/usernet): DHCP, DNS and NAT through microvm's
	// own sockets, no privilege needed. The kernel command line gets
	// ip=...:ethN:dhcp, so a Linux guest with IP_PNP (the project
	// kernel) has the address before /init. At most one device has it.
	// The lean CLI (bin/microvm) hands such runs to microvm-full.
	User bool
	// Publish forwards host ports to the guest (User only).
	Publish []virtionet.Publish
	// HostLoopback (User only; --net user,host-loopback) lets the guest
	// reach the host's 127.0.0.1 at 192.168.127.254, and the host's own
	// addresses: off, a service on the host that trusts local clients is
	// out of the guest's reach (docs/net.md, "What the guest reaches").
	HostLoopback bool
	// Egress (User only; --net user,egress=SPEC, netpolicy.ParseEgress)
	// limits the guest's other destinations; the zero value allows all
	// but the blocked ranges (loopback, link-local and cloud metadata,
	// multicast).
	Egress netpolicy.Egress
	// MAC is the guest's address; nil picks a random locally
	// administered one.
	MAC net.HardwareAddr
}

// HasUserNet reports whether a device is on a user-mode network.
func (c *Config) HasUserNet() bool {
	for _, n := range c.Nets {
		if n.User {
			return true
		}
	}
	return false
}

// NetMetrics are one network device's counters.
type NetMetrics struct {
	Name      string // "eth0", "eth1", ...: what a Linux guest calls it
	TAP       string // the host TAP interface (NetConfig.TAP); "" on a user-mode network
	User      bool   // on a user-mode network (NetConfig.User)
	Transport virtio.TransportStats
	virtionet.Stats
}

// netSyntax is --net's value.
const netSyntax = "user[,host-loopback][,egress=SPEC][,mac=M] or tap=NAME[,netns=PATH][,mac=M]"

// ParseNet parses a --net value: user[,host-loopback][,egress=SPEC][,mac=M]
// or tap=NAME[,netns=PATH][,mac=M]. SPEC is netpolicy.ParseEgress's, its
// rules joined with "+" since "," joins the options.
func ParseNet(s string) (NetConfig, error) {
	var nc NetConfig
	egress := false
	for i, kv := range strings.Split(s, ",") {
		if kv == "user" && i == 0 {
			nc.User = true
			continue
		}
		if kv == "host-loopback" {
			if nc.HostLoopback {
				return nc, fmt.Errorf("%w: --net %q: host-loopback given twice", ErrConfig, s)
			}
			nc.HostLoopback = true
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return nc, fmt.Errorf("%w: --net %q: want %s", ErrConfig, s, netSyntax)
		}
		switch k {
		case "egress":
			if egress {
				return nc, fmt.Errorf("%w: --net %q: egress given twice (join its rules with +)", ErrConfig, s)
			}
			e, err := netpolicy.ParseEgress(v)
			if err != nil {
				return nc, fmt.Errorf("%w: --net %q: %w", ErrConfig, s, err)
			}
			nc.Egress, egress = e, true
		case "tap":
			if nc.TAP != "" {
				return nc, fmt.Errorf("%w: --net %q: tap given twice", ErrConfig, s)
			}
			if len(v) > 15 || strings.ContainsAny(v, "/ \t") {
				return nc, fmt.Errorf("%w: --net %q: TAP name %q: want at most 15 bytes, no '/' or spaces", ErrConfig, s, v)
			}
			nc.TAP = v
		case "netns":
			if nc.NetNS != "" {
				return nc, fmt.Errorf("%w: --net %q: netns given twice", ErrConfig, s)
			}
			nc.NetNS = v
		case "mac":
			if nc.MAC != nil {
				return nc, fmt.Errorf("%w: --net %q: mac given twice", ErrConfig, s)
			}
			m, err := virtionet.ParseMAC(v)
			if err != nil {
				return nc, fmt.Errorf("%w: --net %q: %w", ErrConfig, s, err)
			}
			nc.MAC = m
		default:
			return nc, fmt.Errorf("%w: --net %q: unknown key %q (want tap, netns, mac, egress or host-loopback)", ErrConfig, s, k)
		}
	}
	switch {
	case nc.User && nc.TAP != "":
		return nc, fmt.Errorf("%w: --net %q: user or tap=NAME, not both", ErrConfig, s)
	case !nc.User && nc.TAP == "":
		return nc, fmt.Errorf("%w: --net %q: want user or tap=NAME", ErrConfig, s)
	case nc.User && nc.NetNS != "":
		return nc, fmt.Errorf("%w: --net %q: netns needs a TAP (tap=NAME)", ErrConfig, s)
	case !nc.User && (nc.HostLoopback || egress):
		return nc, fmt.Errorf("%w: --net %q: host-loopback and egress are --net user's (a TAP's traffic is the host's firewall's to filter)", ErrConfig, s)
	}
	return nc, nil
}

// userNetCmdline is the kernel's ip= parameter for user-mode network
// device i: DHCP on ethN alone.
func userNetCmdline(i int) string { return fmt.Sprintf("ip=:::::eth%d:dhcp", i) }

var netKind = deviceKind{
	validate: func(c *Config) error {
		if len(c.Nets) > MaxNets {
			return fmt.Errorf("%w: %d network devices; at most %d", ErrConfig, len(c.Nets), MaxNets)
		}
		users := 0
		for _, n := range c.Nets {
			switch {
			case n.User && n.TAP != "":
				return fmt.Errorf("%w: net: a TAP (%s) or a user-mode network, not both", ErrConfig, n.TAP)
			case n.User && n.NetNS != "":
				return fmt.Errorf("%w: net: a network namespace (%s) needs a TAP, not a user-mode network", ErrConfig, n.NetNS)
			case n.User:
				users++
			case n.TAP == "":
				return fmt.Errorf("%w: net: no TAP interface named and not a user-mode network", ErrConfig)
			case len(n.TAP) >= 16:
				return fmt.Errorf("%w: net: TAP name %q is longer than 15 bytes", ErrConfig, n.TAP)
			case len(n.Publish) > 0:
				return fmt.Errorf("%w: net %s: --publish needs a user-mode network (--net user), not a TAP", ErrConfig, n.TAP)
			case n.HostLoopback || n.Egress.Restrict || len(n.Egress.Allow) > 0:
				return fmt.Errorf("%w: net %s: host-loopback and egress need a user-mode network (--net user), not a TAP", ErrConfig, n.TAP)
			}
			if !n.Egress.Restrict && len(n.Egress.Allow) > 0 {
				return fmt.Errorf("%w: net: egress rules without Restrict: set it, the rules are then the only destinations", ErrConfig)
			}
			if _, err := netpolicy.ParseEgress(n.Egress.String()); err != nil {
				return fmt.Errorf("%w: net: %w", ErrConfig, err)
			}
			if n.MAC != nil && (len(n.MAC) != 6 || n.MAC[0]&1 != 0) {
				return fmt.Errorf("%w: net: MAC %v is not a 6-byte unicast address", ErrConfig, n.MAC)
			}
			for _, p := range n.Publish {
				if p.HostPort == 0 || p.GuestPort == 0 || (p.Proto != "tcp" && p.Proto != "udp") || net.ParseIP(p.HostIP) == nil {
					return fmt.Errorf("%w: net: publish %+v: want tcp or udp, a host IP and two ports", ErrConfig, p)
				}
			}
		}
		if users > 1 {
			return fmt.Errorf("%w: %d devices on user-mode networks; at most one", ErrConfig, users)
		}
		return nil
	},
	cmdline: func(c *Config) []string {
		for i, n := range c.Nets {
			if n.User {
				return []string{userNetCmdline(i)}
			}
		}
		return nil
	},
	add: func(m *Machine) error {
		for i, nc := range m.cfg.Nets {
			// A restore may give the device a MAC other than the one the
			// guest saw (a clone's own: MACChanges).
			cfg := virtionet.Config{TAP: nc.TAP, NetNS: nc.NetNS, MAC: nc.MAC, NewMAC: m.snap != nil,
				Log: m.log.WithField("device", fmt.Sprintf("net%d", i))}
			var dev *virtionet.Device
			var err error
			if nc.User {
				dev, err = m.userNet(cfg, nc)
			} else {
				dev, err = virtionet.New(cfg)
			}
			if err != nil {
				return err
			}
			m.nets = append(m.nets, dev)
			t, err := m.addVirtio(dev, dev.Close)
			if err != nil {
				return err
			}
			m.netMMIO = append(m.netMMIO, t)
		}
		return nil
	},
	metrics: func(m *Machine, out *DeviceMetrics) {
		for i, n := range m.nets {
			out.Nets = append(out.Nets, NetMetrics{Name: fmt.Sprintf("eth%d", i), TAP: m.cfg.Nets[i].TAP, User: m.cfg.Nets[i].User,
				Transport: m.netMMIO[i].Stats(), Stats: n.Stats()})
		}
	},
	transports: func(d *DeviceMetrics) []transport {
		var ts []transport
		for _, n := range d.Nets {
			ts = append(ts, transport{name: n.Name, stats: n.Transport,
				kicks: []queueCount{{"rx", n.RxKicks}, {"tx", n.TxKicks}},
				full:  []queueCount{{"rx", n.RxStalls}}})
		}
		return ts
	},
	families: func(w *promtext.Writer, d *DeviceMetrics) {
		ns := d.Nets
		name := func(n NetMetrics) string { return n.Name }
		c := func(family, help string, f func(NetMetrics) uint64) { counter(w, family, help, ns, name, f) }
		c("microvm_net_tx_frames_total", "Frames the guest sent to the TAP.", func(n NetMetrics) uint64 { return n.TxFrames })
		c("microvm_net_rx_frames_total", "Frames from the TAP delivered to the guest.", func(n NetMetrics) uint64 { return n.RxFrames })
		c("microvm_net_tx_bytes_total", "Bytes of the frames counted in microvm_net_tx_frames_total (virtio-net headers excluded).", func(n NetMetrics) uint64 { return n.TxBytes })
		c("microvm_net_rx_bytes_total", "Bytes of the frames counted in microvm_net_rx_frames_total (virtio-net headers excluded).", func(n NetMetrics) uint64 { return n.RxBytes })
		c("microvm_net_tx_errors_total", "Guest TX chains with a bad header or length: dropped (guest errors).", func(n NetMetrics) uint64 { return n.TxErrors })
		c("microvm_net_tx_dropped_total", "Frames the TAP refused with an error other than EAGAIN.", func(n NetMetrics) uint64 { return n.TxDropped })
		c("microvm_net_tx_stalls_total", "Writes that found the TAP full (retried when it drains, not dropped).", func(n NetMetrics) uint64 { return n.TxStalls })
		c("microvm_net_rx_dropped_total", "TAP frames too large for any buffer the guest posted: dropped.", func(n NetMetrics) uint64 { return n.RxDropped })
		c("microvm_net_rx_errors_total", "TAP reads that failed or returned a runt.", func(n NetMetrics) uint64 { return n.RxErrors })
	},
	flags: []Flag{
		{Name: "net", Synopsis: "[--net user[,host-loopback][,egress=SPEC]|tap=NAME[,netns=PATH][,mac=M]]...",
			Usage: fmt.Sprintf("add a virtio-net device: user: on a user-mode network (NAT, DHCP, DNS; no root; guest %s; host-loopback: the host's 127.0.0.1 at %s, off by default; egress=SPEC limits the guest's destinations, SPEC %s; loopback, link-local and cloud metadata addresses are never reached); tap=NAME: on host TAP NAME (attached, or created with CAP_NET_ADMIN), in the network namespace at PATH if given; guest MAC M or a random one; repeatable, at most %d", usernetGuestIP, usernetHostIP, netpolicy.EgressSyntax, MaxNets),
			Set: func(c *Config, v string) error {
				n, err := ParseNet(v)
				if err != nil {
					return err
				}
				if len(c.Nets) == MaxNets {
					return fmt.Errorf("%w: --net: at most %d devices", ErrConfig, MaxNets)
				}
				c.Nets = append(c.Nets, n)
				return nil
			}},
		{Name: "publish", Synopsis: "[--publish [IP:]PORT:GUESTPORT[/udp]]...",
			Usage: "forward host port PORT (on IP, default 127.0.0.1) to the guest's GUESTPORT on the --net user device; tcp unless /udp; repeatable",
			Set: func(c *Config, v string) error {
				p, err := virtionet.ParsePublish(v)
				if err != nil {
					return fmt.Errorf("%w: --%w", ErrConfig, err)
				}
				c.pendingPublish = append(c.pendingPublish, p)
				return nil
			}},
	},
	finish: func(c *Config, _ func(string) bool) error {
		if len(c.pendingPublish) == 0 {
			return nil
		}
		for i := range c.Nets {
			if c.Nets[i].User {
				c.Nets[i].Publish = append(c.Nets[i].Publish, c.pendingPublish...)
				c.pendingPublish = nil
				return nil
			}
		}
		return fmt.Errorf("%w: --publish needs --net user", ErrConfig)
	},
}

// The user-mode network's addresses as the flags' help shows them
// (devices/virtionet/usernet, which the lean build does not link).
const (
	usernetGuestIP = "192.168.127.2"
	usernetHostIP  = "192.168.127.254"
)

// NetStats returns the counters of virtio-net device i (Config.Nets[i]).
func (m *Machine) NetStats(i int) virtionet.Stats {
	if i < 0 || i >= len(m.nets) {
		return virtionet.Stats{}
	}
	return m.nets[i].Stats()
}

// NetMAC returns the guest MAC address of virtio-net device i.
func (m *Machine) NetMAC(i int) net.HardwareAddr {
	if i < 0 || i >= len(m.nets) {
		return nil
	}
	return m.nets[i].MAC()
}
