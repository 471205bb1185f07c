package main

import (
	"io"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/vms"
)

// `microvm restore DIR`: the machine a snapshot holds (microvm snapshot,
// docs/snapshot.md), run from where it was saved, as `microvm run` runs a
// booted one: in the foreground, the console on stdin and stdout and the
// exit status the guest's end; or, with --name, as a named VM (with
// --detach, in the background). The flags name the host resources the new
// process owns; the machine itself (CPUs, memory, devices and their
// settings) is the snapshot's. A snapshot is its writer's word: the disks,
// shared directories, TAP devices, namespaces, vsock socket and
// non-loopback ports its machine had are refused (microvm.
// ErrSnapshotHostResource, exit status 2) unless the flags give them
// again, before anything is made.

// restoreCommand is `microvm restore`.
func restoreCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	opts := []clibase.Opt{
		clibase.Uint64Opt("vsock-cid", "the restored guest's vsock CID (default: the snapshot's); a clone beside its original needs its own"),
		clibase.StringOpt("vsock-uds", "", "host Unix socket of the vsock device, which a restore needs where the snapshot's VM had one (never the snapshot's own); a named VM's is in its state directory"),
		clibase.StringOpt("metrics-socket", "", "serve Prometheus metrics on this Unix socket"),
		clibase.StringOpt("name", "", "run it as the named VM NAME (microvm ls, stop, exec --vm); default: in the foreground, unnamed"),
		clibase.BoolOpt("detach", "with --name: return once the VM runs (and its agent answers, when the snapshot's VM ran one); the VM goes on in the background", "d"),
		clibase.DurationOpt("boot-timeout", 30*time.Second, "with --detach: how long to wait for the restored agent to answer"),
		clibase.BoolOpt("prefault", "read the snapshot's guest memory in at restore rather than as the guest touches it", ""),
	}
	return &cli.Command{
		Name:  "restore",
		Usage: "run a VM from a snapshot (microvm snapshot): it goes on where it was saved",
		UsageText: "microvm restore [--name NAME [--detach]] [--prefault] [--vsock-cid N] [--vsock-uds PATH] [--disk PATH]... [--net NET]... [--publish SPEC]... [--share tag=T,path=DIR[,readonly]]... " +
			"[--metrics-socket PATH] [--seccomp=off] [--log-level LEVEL] DIR",
		OnUsageError: onUsageError,
		Flags: append(cliFlags(opts, []clibase.Opt{clibase.SeccompFlag()}, clibase.LogFlags()), &cli.StringSliceFlag{Name: "disk",
			Usage: "disk image path, one per disk of the snapshot's machine in order, which a restore needs (never the snapshot's own; each checked against the size and modification time the snapshot saw)"},
			&cli.StringSliceFlag{Name: "net",
				Usage: "network device in place of the snapshot's, one per device in order, which a restore needs where the snapshot's VM had a TAP or a port published beyond loopback (never the snapshot's own): user[,mac=M] or tap=NAME[,netns=PATH][,mac=M] (a mac= other than the snapshot's is the guest's only once its agent takes it: with --name, microvm has it do so; without mac=, --name gives a snapshot of an agent VM new MACs, others keep the snapshot's)"},
			&cli.StringSliceFlag{Name: "publish",
				Usage: "with --net user: forward host port [IP:]PORT to the guest's GUESTPORT ([IP:]PORT:GUESTPORT[/udp]), as run's --publish"},
			&cli.StringSliceFlag{Name: "share",
				Usage: "host directory for each shared directory of the snapshot's machine, in order, which a restore needs (never the snapshot's own): tag=T,path=DIR[,readonly] as run's --share, T the snapshot's tag; readonly when this or the snapshot says so"}),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return clibase.Usagef("restore: want one snapshot directory")
			}
			name := c.String("name")
			switch {
			case c.Bool("detach") && name == "":
				return clibase.Usagef("--detach needs --name (the detached VM is reached by its name)")
			case name != "" && clibase.IsSet(c, "vsock-uds"):
				return clibase.Usagef("--vsock-uds: a named VM's vsock socket is in its state directory (%s)", vms.VsockSocket)
			}
			if name != "" {
				if err := vms.CheckName(name); err != nil {
					return clibase.UsageError{Err: err}
				}
			}
			log, err := clibase.SetupLog(c, stderr)
			if err != nil {
				return err
			}
			dir := c.Args().First()
			host := microvm.Config{MetricsSocket: c.String("metrics-socket"), PrefaultMemory: c.Bool("prefault")}
			if c.IsSet("vsock-cid") || c.IsSet("vsock-uds") {
				host.Vsock = &microvm.VsockConfig{CID: c.Uint64("vsock-cid"), UDSPath: c.String("vsock-uds")}
			}
			for _, p := range c.StringSlice("disk") {
				host.Disks = append(host.Disks, microvm.DiskConfig{Path: p})
			}
			for _, v := range c.StringSlice("share") {
				sc, err := microvm.ParseShare(v)
				if err != nil {
					return clibase.UsageError{Err: err}
				}
				host.Shares = append(host.Shares, sc)
			}
			if host.Nets, err = restoreNets(c.StringSlice("net"), c.StringSlice("publish")); err != nil {
				return err
			}
			if name != "" {
				return restoreNamed(c, name, dir, host, stdin, stdout, log)
			}
			host.Log, host.Console, host.ConsoleInput = log, stdout, stdin
			m, err := microvm.Restore(dir, host)
			if err != nil {
				return err
			}
			return clibase.RunBuilt(m, log, func() error { return clibase.Confine(c, clibase.VMMPolicy(m.Config()), log) })
		},
	}
}

// restoreNamed is `microvm restore --name NAME DIR`: the snapshot's
// machine as a named VM (namedvm.Restore), which has an agent when the
// snapshot's named VM had one (its labels say so). A restored VM has no
// setup to fail (run --docker's ran before the snapshot), so nothing is
// said on stderr.
func restoreNamed(c *cli.Context, name, dir string, host microvm.Config, stdin io.Reader, stdout io.Writer, log *logrus.Logger) error {
	// Asked before namedOptions takes the ready descriptor, which ends
	// what IsDetached sees: the detached process runs the VM, it does
	// not start another.
	detached := namedvm.IsDetached()
	req := namedvm.RestoreRequest{Name: name, Dir: dir, Host: host, Detach: c.Bool("detach") && !detached}
	return namedExit(namedvm.Restore(req, namedOptions(c, detached, false, stdin, stdout, log)), io.Discard)
}

// restoreNets parses restore's --net values (each run's ParseNet) and
// --publish values, which go to the first user-mode device; nil without
// --net, which keeps the snapshot's devices.
func restoreNets(nets, publish []string) ([]microvm.NetConfig, error) {
	var out []microvm.NetConfig
	for _, v := range nets {
		n, err := microvm.ParseNet(v)
		if err != nil {
			return nil, clibase.UsageError{Err: err}
		}
		out = append(out, n)
	}
	if len(publish) == 0 {
		return out, nil
	}
	i := slices.IndexFunc(out, func(n microvm.NetConfig) bool { return n.User })
	if i < 0 {
		return nil, clibase.Usagef("--publish needs --net user")
	}
	for _, v := range publish {
		p, err := virtionet.ParsePublish(v)
		if err != nil {
			return nil, clibase.Usagef("--%v", err)
		}
		out[i].Publish = append(out[i].Publish, p)
	}
	return out, nil
}
