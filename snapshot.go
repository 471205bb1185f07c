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

// Snapshots (docs/snapshot.md). A snapshot directory holds the
// machine floor's state and memory (internal/vmm, SaveSnapshot) and this
// package's part, "config": the Config the machine was built with, less
// what names host resources of the running process (console, log), with
// each network device's MAC as the guest saw it and each disk's size and
// modification time, so a restore rebuilds the same devices in the same
// slots and refuses disks that changed since. The host resources it
// names (disk and share paths, TAP, namespace, sockets, published
// addresses) are kept to describe the machine, never used: a restore
// takes each from its caller (restoreConfig).

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
// where the snapshot was taken. The machine (CPUs, memory, devices and
// their settings) is the snapshot's; host gives what the new process owns,
// which Restore never takes from the snapshot, whose file is the word of
// whoever wrote it: Console, ConsoleInput, Log and MetricsSocket always;
// Vsock's CID (the snapshot's when zero) and UDSPath; Disks and Shares,
// with as many entries as the snapshot's machine had (paths only: a
// device's kind and settings are the snapshot's; a share is read-only
// when either says so); Nets, one per device, each a device of host's
// choosing or, with only a MAC set, the snapshot's device with a new
// address (a network device's MAC may be new, which MACChanges then
// lists). A snapshot whose machine had a disk, a shared directory, a TAP
// or network namespace, a vsock socket or a port published beyond
// loopback that host does not give is refused with
// ErrSnapshotHostResource before anything is built; only its user-mode
// network devices and their loopback ports are kept without host's word.
// The snapshot is refused whole (ErrConfig, or the errors of
// internal/snapshot) when it is truncated, corrupt or newer than this
// microvm, when this host's KVM lacks a CPU feature its guest uses, or
// when a disk changed since.
func Restore(dir string, host Config) (*Machine, error) {
	s, saved, cfg, err := openRestore(dir, host)
	if err != nil {
		return nil, err
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

// CheckRestore reports what Restore(dir, host) would refuse before it
// builds anything: the snapshot as ReadSnapshot checks it, and its
// configuration with host's resources (ErrSnapshotHostResource, a
// changed disk). A caller that makes state of its own before it restores
// (a named VM's record, a detached process) asks first, so that a refusal
// leaves nothing behind.
func CheckRestore(dir string, host Config) error {
	s, _, _, err := openRestore(dir, host)
	if err == nil {
		s.Close()
	}
	return err
}

// openRestore opens the snapshot in dir and returns it with its saved
// Config and the Config to restore it with (restoreConfig, defaults
// applied); the snapshot is closed when it fails.
func openRestore(dir string, host Config) (*snapshot.Snapshot, *savedConfig, Config, error) {
	s, err := snapshot.Open(dir)
	if err != nil {
		return nil, nil, Config{}, err
	}
	var saved savedConfig
	if err := s.State(snapshotConfigPart, &saved); err != nil {
		s.Close()
		return nil, nil, Config{}, err
	}
	cfg, err := saved.restoreConfig(host)
	if err == nil {
		cfg, err = cfg.withDefaults()
	}
	if err != nil {
		s.Close()
		return nil, nil, Config{}, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	return s, &saved, cfg, nil
}

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

// ErrSnapshotHostResource: the snapshot's machine had a host resource
// that Restore's host Config does not give again: a disk image, a shared
// directory, a TAP device or network namespace, a vsock socket, or a port
// published on an address other than loopback. A snapshot is the word of
// whoever wrote it, so Restore takes none of these from it (the CLI
// names the flag that gives each; exit status 2, as for ErrConfig, which
// it wraps).
var ErrSnapshotHostResource = fmt.Errorf("%w: a host resource the snapshot names is not given again", ErrConfig)

// restoreConfig is the saved Config with host's resources in it, after
// checking that the disks are the ones saved. A host resource the saved
// Config names is refused (ErrSnapshotHostResource) unless host gives it
// again; the file may narrow what host gives (a share it saved read-only
// stays so), never widen it.
func (s *savedConfig) restoreConfig(host Config) (Config, error) {
	c := s.Config
	c.Console, c.ConsoleInput, c.Log, c.MetricsSocket = host.Console, host.ConsoleInput, host.Log, host.MetricsSocket
	c.PrefaultMemory = host.PrefaultMemory
	var err error
	if c.Vsock, err = restoreVsock(c.Vsock, host.Vsock); err != nil {
		return c, err
	}
	if c.Disks, err = restoreDisks(c.Disks, host.Disks); err != nil {
		return c, err
	}
	if c.Nets, err = restoreNets(c.Nets, host.Nets); err != nil {
		return c, err
	}
	if c.Shares, err = restoreShares(c.Shares, host.Shares); err != nil {
		return c, err
	}
	if len(s.Disks) != len(c.Disks) {
		return c, fmt.Errorf("%w: the snapshot describes %d disks but configures %d", ErrConfig, len(s.Disks), len(c.Disks))
	}
	// The disks are the caller's; size and modification time only catch
	// an image that changed under a snapshot that remembers its blocks
	// (the guest's page cache, a cow overlay), they prove nothing.
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

// restoreVsock is the restored vsock device: the snapshot's, with host's
// CID when given and host's socket path only. A snapshot's socket path
// would have the restore bind a socket there (replacing a stale one) and
// dial PATH_<port> for the guest.
func restoreVsock(saved, host *VsockConfig) (*VsockConfig, error) {
	if saved == nil {
		if host != nil {
			return nil, fmt.Errorf("%w: a vsock device given, but the snapshot's machine has none", ErrConfig)
		}
		return nil, nil
	}
	v := *saved
	v.UDSPath = ""
	if host != nil {
		if host.CID != 0 {
			v.CID = host.CID
		}
		v.UDSPath = host.UDSPath
	}
	if saved.UDSPath != "" && v.UDSPath == "" {
		return nil, fmt.Errorf("%w: its vsock device had the host socket %q: give one (--vsock-uds PATH)", ErrSnapshotHostResource, saved.UDSPath)
	}
	return &v, nil
}

// restoreDisks is the restored disks: the snapshot's, each on the image
// host gives. A snapshot's path would open any image its writer names
// (read-write unless it says readonly), and its size and modification
// time are anyone's to read.
func restoreDisks(saved, host []DiskConfig) ([]DiskConfig, error) {
	if len(saved) > 0 && host == nil {
		return nil, fmt.Errorf("%w: its machine had %d disks (the first %q): give each image (--disk PATH, in order)", ErrSnapshotHostResource, len(saved), saved[0].Path)
	}
	if len(host) != len(saved) {
		return nil, fmt.Errorf("%w: %d disks given; the snapshot's machine has %d", ErrConfig, len(host), len(saved))
	}
	disks := slices.Clone(saved)
	for i := range disks {
		disks[i].Path = host[i].Path
	}
	return disks, nil
}

// restoreNets is the restored network devices. An entry of host is the
// device as given (with the snapshot's MAC unless it gives one), or, when
// it gives a MAC only, the snapshot's device with that MAC; a nil host
// keeps the snapshot's devices. A snapshot's device is kept only on a
// user-mode network whose ports are published on loopback: a TAP or a
// namespace names the host's network, a port on another address reaches
// the guest from beyond the host. It is rebuilt from the fields that name
// no host resource, so what a newer Config adds to NetConfig is the
// caller's to give.
func restoreNets(saved, host []NetConfig) ([]NetConfig, error) {
	if host != nil && len(host) != len(saved) {
		return nil, fmt.Errorf("%w: %d network devices given; the snapshot's machine has %d", ErrConfig, len(host), len(saved))
	}
	var nets []NetConfig
	for i, s := range saved {
		var h NetConfig
		if host != nil {
			h = host[i]
		}
		if h.TAP != "" || h.NetNS != "" || h.User || h.Publish != nil {
			if h.MAC == nil {
				h.MAC = s.MAC
			}
			nets = append(nets, h)
			continue
		}
		if err := savedNetHostResource(i, s); err != nil {
			return nil, err
		}
		n := NetConfig{User: true, Publish: slices.Clone(s.Publish), MAC: s.MAC}
		if h.MAC != nil {
			n.MAC = h.MAC
		}
		nets = append(nets, n)
	}
	return nets, nil
}

// savedNetHostResource refuses a snapshot's network device i that names a
// host resource (restoreNets).
func savedNetHostResource(i int, n NetConfig) error {
	switch {
	case n.TAP != "" || n.NetNS != "":
		return fmt.Errorf("%w: its network device %d was on TAP %q in namespace %q: give each device (--net tap=NAME[,netns=PATH] or --net user, in order)",
			ErrSnapshotHostResource, i, n.TAP, n.NetNS)
	case !n.User:
		return fmt.Errorf("%w: its network device %d names no network: give each device (--net, in order)", ErrSnapshotHostResource, i)
	}
	for _, p := range n.Publish {
		if ip := net.ParseIP(p.HostIP); ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("%w: its network device %d published port %d on host address %q: give each device (--net user, in order, with --publish)",
				ErrSnapshotHostResource, i, p.HostPort, p.HostIP)
		}
	}
	return nil
}

// restoreShares is the restored shared directories: the snapshot's tags,
// each on the directory host gives (read-only when either says so). A
// snapshot's path would share any directory its writer names, / included.
func restoreShares(saved, host []ShareConfig) ([]ShareConfig, error) {
	if len(saved) > 0 && host == nil {
		return nil, fmt.Errorf("%w: its machine shared %d directories (tag %q was %q): give each (--share tag=T,path=DIR, in order)",
			ErrSnapshotHostResource, len(saved), saved[0].Tag, saved[0].Path)
	}
	if len(host) != len(saved) {
		return nil, fmt.Errorf("%w: %d shared directories given; the snapshot's machine has %d", ErrConfig, len(host), len(saved))
	}
	shares := slices.Clone(saved)
	for i, h := range host {
		if h.Tag != "" && h.Tag != saved[i].Tag {
			return nil, fmt.Errorf("%w: shared directory %d: tag %q given; the snapshot's guest knows it as %q", ErrConfig, i, h.Tag, saved[i].Tag)
		}
		shares[i].Path = h.Path
		shares[i].ReadOnly = saved[i].ReadOnly || h.ReadOnly
	}
	return shares, nil
}
