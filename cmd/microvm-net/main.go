// Command microvm-net is the process of a user-mode network (`microvm
// ... --net user`): microvm starts it, with the network's end of a
// SOCK_SEQPACKET socketpair as fd 3 (the virtio-net device holds the
// other) and a status pipe as fd 4, and it runs
// devices/virtionet/usernet on them until the device's end closes.
//
//	microvm-net --guest-mac MAC [--publish SPEC]... [--host-loopback] [--egress SPEC]
//	            [--log-level LEVEL] [--seccomp=false]
//
// --host-loopback and --egress are the policy of --net user's options of
// the same names (devices/virtionet/usernet/netpolicy): without them the
// guest reaches neither the host's loopback nor the blocked ranges.
//
// It writes one line to fd 4: "ready" once the published ports are bound
// and its seccomp filter (internal/seccomp.UserNet) is in, or "error: ..."
// saying why not (a port in use, say), and exits 1. Its diagnostics go to
// stderr, one text line each, which microvm passes on to its own log.
//
// The network runs here, not in microvm, so that the VMM process neither
// links gVisor's netstack (its initialisers cost every microvm start-up
// 6 ms and 11 MiB: docs/benchmarks.md) nor opens IP sockets: the filter
// of a VMM on a user-mode network still allows none.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/devices/virtionet/usernet"
	"github.com/microvm/microvm/devices/virtionet/usernet/netpolicy"
	"github.com/microvm/microvm/internal/seccomp"
)

// The descriptors microvm passes.
const (
	socketFD = 3
	statusFD = 4
)

func main() {
	status := os.NewFile(statusFD, "status")
	err := run(os.Args[1:], status)
	if err != nil {
		if status != nil {
			fmt.Fprintf(status, "error: %v\n", err)
		}
		fmt.Fprintf(os.Stderr, "microvm-net: %v\n", err)
		os.Exit(1)
	}
}

type publishFlags []virtionet.Publish

func (p *publishFlags) String() string { return fmt.Sprint(*p) }
func (p *publishFlags) Set(v string) error {
	pub, err := virtionet.ParsePublish(v)
	if err != nil {
		return err
	}
	*p = append(*p, pub)
	return nil
}

func run(args []string, status *os.File) error {
	fs := flag.NewFlagSet("microvm-net", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	mac := fs.String("guest-mac", "", "the guest NIC's MAC: DHCP leases it "+usernet.GuestIP)
	var publish publishFlags
	fs.Var(&publish, "publish", "[IP:]PORT:GUESTPORT[/udp], repeatable")
	hostLoopback := fs.Bool("host-loopback", false, "let the guest reach the host's 127.0.0.1 at "+usernet.HostIP)
	egressSpec := fs.String("egress", "all", "where else the guest may connect: "+netpolicy.EgressSyntax)
	level := fs.String("log-level", "warn", "diagnostics on stderr")
	filter := fs.Bool("seccomp", true, "confine the process once the ports are bound")
	if err := fs.Parse(args); err != nil {
		return err
	}
	guestMAC, err := virtionet.ParseMAC(*mac)
	if err != nil {
		return fmt.Errorf("--guest-mac: %w", err)
	}
	egress, err := netpolicy.ParseEgress(*egressSpec)
	if err != nil {
		return fmt.Errorf("--egress: %w", err)
	}
	lvl, err := logrus.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := logrus.New()
	log.SetLevel(lvl)
	log.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true})
	// gvisor-tap-vsock writes to logrus's standard logger, its port
	// forwarder (inetaf/tcpproxy) to the standard library's: both become
	// debug lines.
	std := logrus.StandardLogger()
	std.SetOutput(io.Discard)
	std.AddHook(debugHook{log})
	stdlog.SetFlags(0)
	stdlog.SetOutput(debugWriter{log})

	// Go's resolver reads resolv.conf, nsswitch.conf and hosts on its
	// first lookup; after the filter it may not open them again.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, _ = net.DefaultResolver.LookupHost(ctx, "localhost")
	cancel()

	n, err := usernet.NewOnSocket(usernet.Config{GuestMAC: guestMAC, Publish: publish,
		HostLoopback: *hostLoopback, Egress: egress, Log: log}, socketFD)
	if err != nil {
		return err
	}
	defer n.Close()
	if *filter {
		if err := seccomp.Install(seccomp.UserNet(), seccomp.Options{Prefix: "microvm-net", Hint: "microvm-net --seccomp=false runs without it"}); err != nil {
			return err
		}
	}
	if status != nil {
		fmt.Fprintln(status, "ready")
		status.Close()
	}
	<-n.Done() // the device's end closed: microvm closed the machine, or ended
	return nil
}

// debugHook passes another logger's entries on as debug lines.
type debugHook struct{ to logrus.FieldLogger }

func (debugHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h debugHook) Fire(e *logrus.Entry) error {
	h.to.WithFields(e.Data).Debug(e.Message)
	return nil
}

// debugWriter turns the standard library logger's lines into debug lines.
type debugWriter struct{ to logrus.FieldLogger }

func (w debugWriter) Write(p []byte) (int, error) {
	w.to.Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}
