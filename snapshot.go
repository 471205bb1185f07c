package microvm

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/microvm/microvm/internal/snapshot"
)

// Snapshots (issue 22; docs/snapshot.md). A snapshot directory holds the
// machine floor's state and memory (internal/vmm, SaveSnapshot) and this
// package's part, "config": the Config the machine was built with, less
// what names host resources of the running process (console, log), with
// each network device's MAC as the guest saw it and each disk's size and
// modification time, so a restore rebuilds the same devices in the same
// slots and refuses disks that changed since.

// snapshotConfigPart is the name of the Config part.
const snapshotConfigPart = "config"

// savedConfig is the "config" part of a snapshot.
type savedConfig struct {
	Config Config
	// Disks are the disks' sizes and modification times at the save,
	// in Config.Disks order.
	Disks []diskIdentity
}

// diskIdentity is what a restore checks of a disk image.
type diskIdentity struct {
	Size    int64
	ModTime time.Time
}

// SnapshotOptions are the choices of Machine.Snapshot.
type SnapshotOptions struct {
	// Overwrite replaces an existing snapshot at the directory (never
	// anything else), atomically.
	Overwrite bool
	// Stop ends the machine once the snapshot is written: Run returns
	// ExitSnapshot. Otherwise the machine goes on as it was (paused if it
	// was paused).
	Stop bool
	// Diff writes guest memory as a diff: only the pages written since
	// the machine's last snapshot (or its restore), which becomes the
	// diff's base. It needs Config.TrackDirtyPages. Restoring a diff
	// opens its base from where the base was written (recorded in the
	// diff), and that base's, down to a full snapshot: keep them there.
	Diff bool
	// Labels are the caller's notes on the snapshot (at most 64; keys of
	// 1 to 122 bytes, values of at most 4096), kept in its manifest and
	// read back by ReadSnapshot: a named VM keeps there whether its
	// guest runs the agent.
	Labels map[string]string
}

// ErrSnapshotExists: Snapshot's directory holds something already, and
// Overwrite was not given (or it is not a snapshot, never replaced).
var ErrSnapshotExists = snapshot.ErrExists

// labelPrefix marks SnapshotOptions.Labels among the manifest's metadata.
const labelPrefix = "label/"

// metaBase is the manifest metadata naming a diff snapshot's base
// directory (absolute).
const metaBase = "microvm/base"

// maxDiffChain bounds how many diffs a restore follows down to a full
// snapshot.
const maxDiffChain = 64

// snapshotRef names a snapshot a diff can be taken against.
type snapshotRef struct {
	dir    string // absolute
	digest string // snapshot.Snapshot.Digest
}

// maxLabels bounds SnapshotOptions.Labels.
const maxLabels = 64

// SnapshotInfo is what a snapshot says of itself, read without restoring
// it: the saved machine's Config (with no console, input or log), when
// it was written, and the labels its maker gave.
type SnapshotInfo struct {
	Config  Config
	Created time.Time
	Labels  map[string]string
	// Base is a diff snapshot's base directory; "" for a full snapshot.
	Base string
}

// ReadSnapshot checks the snapshot in dir as Restore does (its manifest
// and every state part; not guest memory) and returns what it says of
// itself.
func ReadSnapshot(dir string) (SnapshotInfo, error) {
	s, err := snapshot.Open(dir)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer s.Close()
	var saved savedConfig
	if err := s.State(snapshotConfigPart, &saved); err != nil {
		return SnapshotInfo{}, err
	}
	man := s.Manifest()
	info := SnapshotInfo{Config: saved.Config, Created: man.Created, Base: man.Metadata[metaBase]}
	for k, v := range man.Metadata {
		if name, ok := strings.CutPrefix(k, labelPrefix); ok {
			if info.Labels == nil {
				info.Labels = map[string]string{}
			}
			info.Labels[name] = v
		}
	}
	return info, nil
}

// Snapshot saves the running machine into dir, which must not exist (or
// be a snapshot, with Overwrite): it pauses the vCPUs (if Pause has not),
// quiesces the devices, writes KVM's, the devices' and this machine's
// state and guest memory, and resumes. A vsock device's connections end
// (the guest is told with a transport reset event, as after a restore).
// The directory is written whole or not at all.
func (m *Machine) Snapshot(ctx context.Context, dir string, o SnapshotOptions) (err error) {
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	wasPaused := m.Paused()
	if !wasPaused {
		if err := m.Pause(ctx); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	var opts []snapshot.Option
	if o.Overwrite {
		opts = append(opts, snapshot.Overwrite())
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		m.resumeAfterSnapshot(wasPaused)
		return fmt.Errorf("snapshot: %w", err)
	}
	base := ""
	if o.Diff {
		switch b := m.diffBase; {
		case !m.cfg.TrackDirtyPages:
			err = fmt.Errorf("%w: a diff snapshot needs Config.TrackDirtyPages (--track-dirty-pages)", ErrConfig)
		case b == nil:
			err = fmt.Errorf("%w: a diff snapshot needs a base: this machine has taken no snapshot since it started (or its last one failed)", ErrConfig)
		case b.dir == abs:
			err = fmt.Errorf("%w: a diff snapshot cannot replace its own base %s", ErrConfig, abs)
		}
		if err != nil {
			m.resumeAfterSnapshot(wasPaused)
			return fmt.Errorf("snapshot %s: %w", dir, err)
		}
		base = m.diffBase.digest
	}
	w, err := snapshot.Create(dir, opts...)
	if err != nil {
		m.resumeAfterSnapshot(wasPaused)
		return err
	}
	defer func() {
		if err != nil {
			_ = w.Abort()
		}
	}()
	if len(o.Labels) > maxLabels {
		err = fmt.Errorf("snapshot: %d labels, more than %d", len(o.Labels), maxLabels)
	}
	for k, v := range o.Labels {
		if err == nil {
			err = w.SetMetadata(labelPrefix+k, v)
		}
	}
	var saved *savedConfig
	if err == nil {
		saved, err = m.savedConfig()
	}
	if err == nil {
		err = w.AddState(snapshotConfigPart, saved)
	}
	if err == nil && o.Diff {
		err = w.SetMetadata(metaBase, m.diffBase.dir)
	}
	if err == nil {
		err = m.vm.SaveSnapshot(w, base)
		// The dirty logs restarted: the next diff is against this
		// snapshot, or, if it fails, against none.
		m.diffBase = nil
	}
	if err == nil {
		err = w.Commit()
	}
	if err == nil && m.cfg.TrackDirtyPages {
		m.diffBase = &snapshotRef{dir: abs, digest: w.Digest()}
	}
	if o.Stop && err == nil {
		m.vm.StopSnapshotted()
		return nil
	}
	if rerr := m.vm.ResumeDevices(); rerr != nil && err == nil {
		err = rerr
	}
	m.resumeAfterSnapshot(wasPaused)
	return err
}

// resumeAfterSnapshot lets the vCPUs go on unless the caller had paused
// them.
func (m *Machine) resumeAfterSnapshot(wasPaused bool) {
	if !wasPaused {
		_ = m.Resume()
	}
}

// savedConfig is the machine's Config as a snapshot keeps it.
func (m *Machine) savedConfig() (*savedConfig, error) {
	c := m.cfg
	c.Console, c.ConsoleInput, c.Log = nil, nil, nil
	c.Nets = append([]NetConfig(nil), c.Nets...)
	for i := range c.Nets {
		c.Nets[i].MAC = m.NetMAC(i)
	}
	s := &savedConfig{Config: c}
	for _, d := range c.Disks {
		st, err := os.Stat(d.Path)
		if err != nil {
			return nil, fmt.Errorf("snapshot: disk %s: %w", d.Path, err)
		}
		s.Disks = append(s.Disks, diskIdentity{Size: st.Size(), ModTime: st.ModTime()})
	}
	return s, nil
}

// Restore builds a machine from the snapshot in dir, ready to Run from
// where the snapshot was taken. host gives what the new process owns:
// Console, ConsoleInput, Log and MetricsSocket always; Vsock's CID and
// UDSPath when set (each when not zero), Disks, Nets and Shares when set, each then with as many
// entries as the snapshot's machine had (paths and host names only: a
// device's kind and settings are the snapshot's; a network device's MAC
// may be new, which MACChanges then lists). The snapshot is
// refused whole (ErrConfig, or the errors of internal/snapshot) when it
// is truncated, corrupt or newer than this microvm, when this host's KVM
// lacks a CPU feature its guest uses, or when a disk changed since.
func Restore(dir string, host Config) (*Machine, error) {
	s, err := snapshot.Open(dir)
	if err != nil {
		return nil, err
	}
	var saved savedConfig
	if err := s.State(snapshotConfigPart, &saved); err != nil {
		s.Close()
		return nil, err
	}
	cfg, err := saved.restoreConfig(host)
	if err == nil {
		cfg, err = cfg.withDefaults()
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	m := &Machine{cfg: cfg, log: cfg.Log, snap: s}
	for i, n := range cfg.Nets {
		if old := saved.Config.Nets[i].MAC; old != nil && !bytes.Equal(old, n.MAC) {
			m.macChanges = append(m.macChanges, MACChange{Net: i, Old: old, New: n.MAC})
		}
	}
	if m.bases, err = openBases(s); err != nil {
		m.Close()
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	if err := m.build(); err != nil {
		m.Close()
		return nil, err
	}
	if cfg.TrackDirtyPages {
		if abs, err := filepath.Abs(dir); err == nil {
			m.diffBase = &snapshotRef{dir: abs, digest: s.Digest()}
		}
	}
	return m, nil
}

// MACChange is a network device of a restored machine whose MAC the
// restore changed (Restore given Config.Nets[i].MAC): a clone's own
// address.
type MACChange struct {
	Net int              // the device's index in Config.Nets
	Old net.HardwareAddr // the snapshot's: the address the guest's driver still uses
	New net.HardwareAddr // the device's, which the guest should take
}

// MACChanges lists the network devices whose MAC the restore changed; nil
// for a booted machine, or one restored with the snapshot's MACs. Linux
// reads a virtio-net device's MAC only when its driver probes, so the
// guest goes on using Old until told: with the agent,
// agentapi.Client.SetMAC(ctx, c.Old, c.New) for each, which moves the
// interface and announces it (the CLI does so for every clone it
// restores).
func (m *Machine) MACChanges() []MACChange { return slices.Clone(m.macChanges) }

// openBases opens the snapshots a diff snapshot's memory applies onto,
// following each one's base down to a full snapshot, and returns them
// oldest first (nil for a full snapshot). Whether each diff was taken
// against the base found (its digest) is checked as it is applied.
func openBases(s *snapshot.Snapshot) ([]*snapshot.Snapshot, error) {
	var chain []*snapshot.Snapshot
	fail := func(err error) ([]*snapshot.Snapshot, error) {
		for _, b := range chain {
			b.Close()
		}
		return nil, err
	}
	for cur := s; cur.Manifest().Metadata[metaBase] != ""; {
		if len(chain) == maxDiffChain {
			return fail(fmt.Errorf("%w: more than %d diffs down to a full snapshot", ErrConfig, maxDiffChain))
		}
		dir := cur.Manifest().Metadata[metaBase]
		b, err := snapshot.Open(dir)
		if err != nil {
			return fail(fmt.Errorf("the base of diff snapshot %s: %w", cur.Dir(), err))
		}
		chain = append(chain, b)
		cur = b
	}
	slices.Reverse(chain)
	return chain, nil
}

// restoreConfig is the saved Config with host's resources in it, after
// checking that the disks are the ones saved.
func (s *savedConfig) restoreConfig(host Config) (Config, error) {
	c := s.Config
	c.Console, c.ConsoleInput, c.Log, c.MetricsSocket = host.Console, host.ConsoleInput, host.Log, host.MetricsSocket
	c.PrefaultMemory = host.PrefaultMemory
	if host.Vsock != nil {
		if c.Vsock == nil {
			return c, fmt.Errorf("%w: a vsock device given, but the snapshot's machine has none", ErrConfig)
		}
		v := *c.Vsock
		if host.Vsock.CID != 0 {
			v.CID = host.Vsock.CID
		}
		if host.Vsock.UDSPath != "" {
			v.UDSPath = host.Vsock.UDSPath
		}
		c.Vsock = &v
	}
	if host.Disks != nil {
		if len(host.Disks) != len(c.Disks) {
			return c, fmt.Errorf("%w: %d disks given; the snapshot's machine has %d", ErrConfig, len(host.Disks), len(c.Disks))
		}
		c.Disks = append([]DiskConfig(nil), c.Disks...)
		for i := range c.Disks {
			c.Disks[i].Path = host.Disks[i].Path
		}
	}
	if host.Nets != nil {
		if len(host.Nets) != len(c.Nets) {
			return c, fmt.Errorf("%w: %d network devices given; the snapshot's machine has %d", ErrConfig, len(host.Nets), len(c.Nets))
		}
		nets := append([]NetConfig(nil), host.Nets...)
		for i := range nets {
			if nets[i].MAC == nil {
				nets[i].MAC = c.Nets[i].MAC
			}
		}
		c.Nets = nets
	}
	if host.Shares != nil {
		if len(host.Shares) != len(c.Shares) {
			return c, fmt.Errorf("%w: %d shared directories given; the snapshot's machine has %d", ErrConfig, len(host.Shares), len(c.Shares))
		}
		c.Shares = append([]ShareConfig(nil), c.Shares...)
		for i := range c.Shares {
			c.Shares[i].Path = host.Shares[i].Path
		}
	}
	if len(s.Disks) != len(c.Disks) {
		return c, fmt.Errorf("%w: the snapshot describes %d disks but configures %d", ErrConfig, len(s.Disks), len(c.Disks))
	}
	for i, d := range c.Disks {
		st, err := os.Stat(d.Path)
		if err != nil {
			return c, fmt.Errorf("%w: disk %s: %w", ErrConfig, d.Path, err)
		}
		if want := s.Disks[i]; st.Size() != want.Size || !st.ModTime().Equal(want.ModTime) {
			return c, fmt.Errorf("%w: disk %s changed since the snapshot (%d bytes, modified %s; the snapshot saw %d bytes, modified %s)",
				ErrConfig, d.Path, st.Size(), st.ModTime().Format(time.RFC3339Nano), want.Size, want.ModTime.Format(time.RFC3339Nano))
		}
	}
	return c, nil
}
