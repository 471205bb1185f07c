package namedvm

import (
	"fmt"
	"strconv"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/vms"
)

// RestoreRequest is a snapshot that `microvm restore --name` runs as a
// named VM, as plain data: what the command line chose, checked.
type RestoreRequest struct {
	// Name is the VM's name (vms.CheckName).
	Name string
	// Dir is the snapshot's directory, as the user named it (the record
	// keeps it so).
	Dir string
	// Host are the host resources the command line gives the restored
	// machine (microvm.Restore's host: disks, shares, networks, the vsock
	// CID, the metrics socket, prefaulting); the VM's process adds its
	// console, log and the vsock socket in its state directory.
	Host microvm.Config
	// Detach starts the VM's process in the background (StartDetached)
	// and returns once the VM runs, and its agent answers when the
	// snapshot's VM had one (within Options.BootTimeout).
	Detach bool
}

// Restore is the process of the named VM req restores (restore --name):
// the snapshot read and checked against req.Host before the VM's record
// or a detached process exists (prepareRestore), then started detached
// when req.Detach asks and this is not already the detached process
// (startsDetached), else Run with o. Its errors are Run's and
// StartDetached's, a FailedError for a snapshot whose labels are bad, and
// microvm.CheckRestore's refusals.
func Restore(req RestoreRequest, o Options) error {
	l, err := prepareRestore(req)
	if err != nil {
		return err
	}
	if startsDetached(req, o) {
		wait := time.Duration(0)
		if l.Record.Agent {
			wait = o.BootTimeout
		}
		return StartDetached(req.Name, wait)
	}
	return Run(l, o)
}

// startsDetached says whether Restore starts req's VM in a detached
// process of its own rather than running it here: when req.Detach asks
// and this is not the detached process already. That process is known by
// DetachFDEnv (IsDetached) until it takes its ready descriptor, and by
// o.Ready after: TakeReady unsets DetachFDEnv, so a caller that filled
// o.Ready before calling Restore would otherwise start the command again
// from every detached process, each waiting on the next.
func startsDetached(req RestoreRequest, o Options) bool {
	return req.Detach && o.Ready == nil && !IsDetached()
}

// prepareRestore is req's Launch: the record from the snapshot's machine
// and labels (whether it runs the agent, on which port) and from req's
// host resources, a clone's own MACs when it has an agent to take them
// (agentapi.AdoptMACs, once it answers), and a Build that restores the
// snapshot with what the VM's process owns. It reads the snapshot and
// checks it against the host (microvm.CheckRestore) first.
func prepareRestore(req RestoreRequest) (Launch, error) {
	info, err := microvm.ReadSnapshot(req.Dir)
	if err != nil {
		return Launch{}, err
	}
	rec, host, err := restoreRecord(req, info)
	if err != nil {
		return Launch{}, err
	}
	vsock := info.Config.Vsock != nil
	// Refused before the VM's record or a detached process exists; the
	// socket's name stands in for its path, which the check does not open.
	own := microvm.Config{Vsock: &microvm.VsockConfig{UDSPath: vms.VsockSocket}}
	if err := microvm.CheckRestore(req.Dir, restoreHost(host, own, vsock)); err != nil {
		return Launch{}, err
	}
	build := func(own microvm.Config) (*microvm.Machine, error) {
		return microvm.Restore(req.Dir, restoreHost(host, own, vsock))
	}
	return Launch{Record: rec, Build: build}, nil
}

// restoreRecord is the record of the VM req restores from the snapshot
// info says, and req.Host with a clone's own MACs when the VM runs the
// agent (which takes them once it answers: Run).
func restoreRecord(req RestoreRequest, info microvm.SnapshotInfo) (vms.Record, microvm.Config, error) {
	cfg, host, dir := info.Config, req.Host, req.Dir
	rec := vms.Record{Name: req.Name, CPUs: cfg.CPUs, MemoryBytes: cfg.MemoryBytes, Kernel: cfg.Kernel,
		Initrd: cfg.Initrd, Restored: dir}
	rec.Agent, _ = strconv.ParseBool(info.Labels[LabelAgent])
	if rec.Agent {
		port, err := strconv.ParseUint(info.Labels[LabelAgentPort], 10, 32)
		if err != nil {
			return rec, host, FailedError{fmt.Errorf("snapshot %s: its agent port label %q: %w", dir, info.Labels[LabelAgentPort], err)}
		}
		rec.AgentPort = uint32(port)
	}
	if cfg.Vsock != nil {
		rec.VsockCID = cfg.Vsock.CID
	}
	if host.Vsock != nil && host.Vsock.CID != 0 {
		rec.VsockCID = host.Vsock.CID
	}
	for _, d := range host.Disks {
		rec.Disks = append(rec.Disks, d.Path)
	}
	if rec.Agent {
		// A clone of its own on the network: new MACs.
		var err error
		if host.Nets, err = agentvm.CloneNets(host.Nets, cfg.Nets); err != nil {
			return rec, host, err
		}
	}
	return rec, host, nil
}

// restoreHost is host with what the VM's process owns (own, as Run gives
// Launch.Build): its console, log and, when the snapshot's machine has a
// vsock device (vsock), the socket in its state directory with host's CID.
func restoreHost(host, own microvm.Config, vsock bool) microvm.Config {
	h := host
	h.Log, h.Console, h.ConsoleInput = own.Log, own.Console, own.ConsoleInput
	if vsock { // else the VM has no vsock socket to own
		v := microvm.VsockConfig{UDSPath: own.Vsock.UDSPath}
		if host.Vsock != nil {
			v.CID = host.Vsock.CID
		}
		h.Vsock = &v
	}
	return h
}
