package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/atomicfile"
)

// Writer builds a snapshot in a temporary directory beside its target and
// moves it into place whole (Commit) or removes it (Abort). It is used by
// one goroutine.
//
// A part that fails to write (an I/O error) breaks the Writer: every later
// call but Abort returns that error. A refused argument (a bad name, a
// state too large) does not.
type Writer struct {
	dir       string // the target
	tmp       string // where parts are written until Commit
	overwrite bool
	meta      map[string]string
	parts     []Part
	state     int64 // bytes of state parts so far
	err       error // the failure that broke the Writer
	done      bool  // committed or aborted
	committed bool
	digest    string
}

// Option changes how Create's Writer behaves.
type Option func(*Writer)

// Overwrite lets Commit replace an existing snapshot at the target (one
// with a microvm manifest; nothing else is ever replaced). The swap is
// atomic (renameat2 RENAME_EXCHANGE), then the old snapshot is removed;
// VMs running from its memory keep their mappings.
func Overwrite() Option { return func(w *Writer) { w.overwrite = true } }

// Create starts a snapshot to be committed at dir. Its parent must exist.
// Unless Overwrite is given, a non-empty dir is refused now (ErrExists),
// before anything is written, and again, atomically, by Commit.
func Create(dir string, opts ...Option) (*Writer, error) {
	if dir == "" {
		return nil, errors.New("snapshot: create: empty directory name")
	}
	dir = filepath.Clean(dir)
	base := filepath.Base(dir)
	if base == "/" || base == "." || base == ".." {
		return nil, fmt.Errorf("snapshot: create %s: not a directory name to create", dir)
	}
	w := &Writer{dir: dir, meta: make(map[string]string)}
	for _, o := range opts {
		o(w)
	}
	if err := w.checkTarget(); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+base+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("snapshot: create %s: %w", dir, err)
	}
	w.tmp = tmp
	return w, nil
}

// checkTarget refuses a target that Commit would refuse: anything but a
// missing or empty directory, or (with Overwrite) a snapshot.
func (w *Writer) checkTarget() error {
	fi, err := os.Lstat(w.dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("snapshot: create %s: %w", w.dir, err)
	case !fi.IsDir():
		return fmt.Errorf("snapshot: create %s: %w: not a directory", w.dir, ErrExists)
	}
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return fmt.Errorf("snapshot: create %s: %w", w.dir, err)
	}
	if len(ents) == 0 {
		return nil
	}
	if !w.overwrite {
		return fmt.Errorf("snapshot: create %s: %w (snapshot.Overwrite replaces a snapshot)", w.dir, ErrExists)
	}
	return isSnapshotDir(w.dir)
}

// isSnapshotDir returns nil when dir holds a microvm manifest of any
// version: the only thing Overwrite replaces.
func isSnapshotDir(dir string) error {
	f, err := os.Open(filepath.Join(dir, ManifestFile))
	if err == nil {
		var head struct {
			Format string `json:"format"`
		}
		err = json.NewDecoder(io.LimitReader(f, MaxManifestSize)).Decode(&head)
		f.Close()
		if err == nil && head.Format != FormatName {
			err = fmt.Errorf("format %.64q", head.Format)
		}
	}
	if err != nil {
		return fmt.Errorf("snapshot: create %s: %w: not a snapshot, not replaced: %v", dir, ErrExists, err)
	}
	return nil
}

// SetMetadata records key=value in the manifest (Manifest.Metadata).
func (w *Writer) SetMetadata(key, value string) error {
	if err := w.usable(); err != nil {
		return err
	}
	if err := checkMeta(key, value); err != nil {
		return fmt.Errorf("snapshot %s: %w", w.dir, err)
	}
	if _, ok := w.meta[key]; !ok && len(w.meta) >= maxMetadata {
		return fmt.Errorf("snapshot %s: metadata %q: %w: more than %d entries", w.dir, key, ErrFormat, maxMetadata)
	}
	w.meta[key] = value
	return nil
}

// AddState adds a state part: v encoded as JSON (encoding/json rules: the
// exported fields; a later reader ignores fields it does not know and
// leaves missing ones zero). Snapshot.State decodes it.
func (w *Writer) AddState(name string, v any) error {
	if err := w.usable(); err != nil {
		return err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("snapshot %s: state %q: %w", w.dir, name, err)
	}
	if len(data) > MaxStateSize || w.state+int64(len(data)) > maxStateTotal {
		return fmt.Errorf("snapshot %s: state %q: %d bytes: more than %d in one part or %d in all", w.dir, name, len(data), MaxStateSize, maxStateTotal)
	}
	f, p, err := w.newPart(name, KindState, ".json")
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	p.Size, p.SHA256 = int64(len(data)), hex.EncodeToString(sum[:])
	_, err = f.Write(data)
	if err = w.finishPart(f, p, err); err == nil {
		w.state += p.Size
	}
	return err
}

// AddFile adds a blob part: r's bytes to EOF, opaque to this package
// (Snapshot.File reads them back).
func (w *Writer) AddFile(name string, r io.Reader) error {
	if err := w.usable(); err != nil {
		return err
	}
	f, p, err := w.newPart(name, KindBlob, ".bin")
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, MaxMemorySize+1))
	if err == nil && n > MaxMemorySize {
		err = fmt.Errorf("more than %d bytes", int64(MaxMemorySize))
	}
	p.Size, p.SHA256 = n, hex.EncodeToString(h.Sum(nil))
	return w.finishPart(f, p, err)
}

// usable returns why the Writer takes no more calls, if it does not.
func (w *Writer) usable() error {
	switch {
	case w.err != nil:
		return w.err
	case w.committed:
		return fmt.Errorf("snapshot %s: already committed", w.dir)
	case w.done:
		return fmt.Errorf("snapshot %s: aborted", w.dir)
	}
	return nil
}

// newPart checks name and creates its file in the temporary directory.
func (w *Writer) newPart(name string, kind Kind, ext string) (*os.File, Part, error) {
	p := Part{Name: name, File: name + ext, Kind: kind}
	if err := checkName(name, maxNameLen); err != nil {
		return nil, p, fmt.Errorf("snapshot %s: part name %w", w.dir, err)
	}
	if len(w.parts) >= MaxParts {
		return nil, p, fmt.Errorf("snapshot %s: part %q: more than %d parts", w.dir, name, MaxParts)
	}
	for _, q := range w.parts {
		if q.Name == name {
			return nil, p, fmt.Errorf("snapshot %s: part %q added twice", w.dir, name)
		}
	}
	f, err := os.OpenFile(filepath.Join(w.tmp, p.File), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, p, w.fail(fmt.Errorf("snapshot %s: part %q: %w", w.dir, name, err))
	}
	return f, p, nil
}

// finishPart syncs and closes a part's file and records p, or, when
// writing it failed (werr) or syncing does, removes the file and breaks
// the Writer.
func (w *Writer) finishPart(f *os.File, p Part, werr error) error {
	if werr == nil {
		werr = f.Sync()
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		os.Remove(f.Name())
		return w.fail(partErrorf(w.dir, &p, "write: %w", werr))
	}
	w.parts = append(w.parts, p)
	return nil
}

// fail breaks the Writer with err.
func (w *Writer) fail(err error) error {
	w.err = err
	return err
}

// Commit writes the manifest, syncs the temporary directory and renames
// it to the target, then syncs the target's parent. The rename is the
// commit point: before it nothing is at the target, after it all is. A
// target holding anything is refused (ErrExists) unless Overwrite was
// given and it is a snapshot. After a failed Commit, Abort removes what was
// written; after a successful one Abort does nothing.
func (w *Writer) Commit() error {
	if err := w.usable(); err != nil {
		return err
	}
	m := Manifest{
		Format:   FormatName,
		Version:  Version,
		Created:  time.Now().UTC(),
		Metadata: w.meta,
		Parts:    w.parts,
	}
	if len(m.Metadata) == 0 {
		m.Metadata = nil
	}
	data, err := json.MarshalIndent(&m, "", "\t")
	if err != nil {
		return fmt.Errorf("snapshot %s: manifest: %w", w.dir, err)
	}
	data = append(data, '\n')
	if len(data) > MaxManifestSize {
		return fmt.Errorf("snapshot %s: manifest: %w: %d bytes, more than %d (metadata too large?)", w.dir, ErrFormat, len(data), MaxManifestSize)
	}
	if err := writeSynced(filepath.Join(w.tmp, ManifestFile), data); err != nil {
		return w.fail(fmt.Errorf("snapshot %s: manifest: %w", w.dir, err))
	}
	if err := atomicfile.SyncDir(w.tmp); err != nil {
		return w.fail(fmt.Errorf("snapshot %s: sync: %w", w.dir, err))
	}
	if err := w.install(); err != nil {
		return w.fail(err)
	}
	sum := sha256.Sum256(data)
	w.digest = hex.EncodeToString(sum[:])
	w.committed, w.done = true, true
	if err := atomicfile.SyncDir(filepath.Dir(w.dir)); err != nil {
		return fmt.Errorf("snapshot %s: in place but not yet durable: sync parent: %w", w.dir, err)
	}
	return nil
}

// install renames the temporary directory to the target: rename(2) onto
// a missing or empty directory, RENAME_EXCHANGE onto a snapshot when
// overwriting (then the old one, now at w.tmp, is removed).
func (w *Writer) install() error {
	// unix.Rename, not os.Rename, which refuses any directory at the
	// target: rename(2) replaces an empty one and refuses the others.
	err := unix.Rename(w.tmp, w.dir)
	if err == nil {
		return nil
	}
	if !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.ENOTEMPTY) {
		if errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("snapshot: commit %s: %w: not a directory", w.dir, ErrExists)
		}
		return fmt.Errorf("snapshot: commit %s: %w", w.dir, err)
	}
	if !w.overwrite {
		return fmt.Errorf("snapshot: commit %s: %w (snapshot.Overwrite replaces a snapshot)", w.dir, ErrExists)
	}
	if err := isSnapshotDir(w.dir); err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, w.tmp, unix.AT_FDCWD, w.dir, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("snapshot: commit %s: exchange with the old snapshot: %w", w.dir, err)
	}
	if err := os.RemoveAll(w.tmp); err != nil {
		return fmt.Errorf("snapshot: commit %s: committed; removing the old snapshot (%s): %w", w.dir, w.tmp, err)
	}
	return nil
}

// Abort removes the temporary directory and everything written into it.
// It does nothing after a successful Commit or a previous Abort, so it can
// be deferred.
func (w *Writer) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	if err := os.RemoveAll(w.tmp); err != nil {
		return fmt.Errorf("snapshot %s: abort: %w", w.dir, err)
	}
	return nil
}

// Digest is the committed snapshot's Digest, what AddMemoryDiff takes as
// the base of the next snapshot; "" before Commit succeeds.
func (w *Writer) Digest() string { return w.digest }

// writeSynced creates path with data and syncs it.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
