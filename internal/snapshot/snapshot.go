package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Snapshot is a snapshot opened for restoring: its manifest checked, each
// part's file open and of the size the manifest gives, the state parts
// read and checked against their SHA-256. Its methods may be called from
// any goroutine, concurrently, except Close.
type Snapshot struct {
	dir    string
	root   *os.Root // the directory: no part's file is opened outside it
	m      Manifest
	digest string
	parts  map[string]*openPart
}

// openPart is a part and what Open kept of it.
type openPart struct {
	Part
	f    *os.File // blob, memory and memory-diff parts: the file Open checked
	data []byte   // state parts: the bytes Open checked
}

// Open opens the snapshot at dir and refuses it whole, with an error that
// names the part and file at fault, when the manifest is not a microvm
// snapshot's or breaks a bound (ErrFormat), is of a newer format
// (ErrNewerVersion), when a part's file is missing or short (ErrTruncated)
// or longer than the manifest says, or a state part's bytes do not match
// its checksum (ErrCorrupt). Memory is not read: its checksum is Verify's.
// The snapshot must not change while open; Close releases it.
func Open(dir string) (*Snapshot, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	s := &Snapshot{dir: dir, root: root, parts: make(map[string]*openPart)}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	data, err := s.readManifest()
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	s.m = *m
	sum := sha256.Sum256(data)
	s.digest = hex.EncodeToString(sum[:])
	for i := range s.m.Parts {
		op := &openPart{Part: s.m.Parts[i]}
		s.parts[op.Name] = op
		if err := s.openPart(op); err != nil {
			return nil, err
		}
	}
	ok = true
	return s, nil
}

// readManifest reads manifest.json, at most MaxManifestSize bytes of it.
func (s *Snapshot) readManifest() ([]byte, error) {
	f, fi, err := openRegular(s.root, ManifestFile)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("snapshot %s: %w: no %s (not a snapshot, or one never committed): %w", s.dir, ErrFormat, ManifestFile, err)
		}
		return nil, fmt.Errorf("snapshot %s: %w", s.dir, err)
	}
	defer f.Close()
	if fi.Size() > MaxManifestSize {
		return nil, fmt.Errorf("snapshot %s: %w: %s of %d bytes, more than %d", s.dir, ErrFormat, ManifestFile, fi.Size(), MaxManifestSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxManifestSize+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %s: %w", s.dir, ManifestFile, err)
	}
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("snapshot %s: %w: %s of more than %d bytes", s.dir, ErrFormat, ManifestFile, MaxManifestSize)
	}
	return data, nil
}

// openPart opens a part's file and checks its size; a state part is read
// whole and checked against its SHA-256.
func (s *Snapshot) openPart(op *openPart) error {
	f, err := s.openChecked(&op.Part)
	if err != nil {
		return err
	}
	if op.Kind != KindState {
		op.f = f
		return nil
	}
	defer f.Close()
	data := make([]byte, op.Size)
	if _, err := f.ReadAt(data, 0); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: %w", ErrTruncated, err)
		}
		return partErrorf(s.dir, &op.Part, "read: %w", err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != op.SHA256 {
		return partErrorf(s.dir, &op.Part, "%w: content does not match its SHA-256", ErrCorrupt)
	}
	op.data = data
	return nil
}

// openChecked opens p's file inside the snapshot directory and checks
// that it is a regular file of p.Size bytes.
func (s *Snapshot) openChecked(p *Part) (*os.File, error) {
	f, fi, err := openRegular(s.root, p.File)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, partErrorf(s.dir, p, "%w: missing: %w", ErrTruncated, err)
		}
		return nil, partErrorf(s.dir, p, "%w", err)
	}
	if n := fi.Size(); n != p.Size {
		f.Close()
		e := ErrTruncated
		if n > p.Size {
			e = ErrCorrupt
		}
		return nil, partErrorf(s.dir, p, "%w: file has %d bytes, the manifest says %d", e, n, p.Size)
	}
	return f, nil
}

// openRegular opens name in root for reading, refusing anything but a
// regular file. O_NONBLOCK keeps a FIFO planted in the directory from
// blocking the open; it changes nothing for a regular file.
func openRegular(root *os.Root, name string) (*os.File, fs.FileInfo, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s is not a regular file (%v)", ErrFormat, name, fi.Mode().Type())
	}
	return f, fi, nil
}

// Close releases the snapshot's files. Mappings from MapMemory stay valid.
func (s *Snapshot) Close() error {
	var errs []error
	for _, op := range s.parts {
		if op.f != nil {
			errs = append(errs, op.f.Close())
			op.f = nil
		}
	}
	if s.root != nil {
		errs = append(errs, s.root.Close())
		s.root = nil
	}
	return errors.Join(errs...)
}

// Dir is the directory the snapshot was opened from.
func (s *Snapshot) Dir() string { return s.dir }

// Digest is the hex SHA-256 of the snapshot's manifest, which names every
// part's checksum: it identifies the snapshot's content, and a memory diff
// taken against this snapshot records it (Writer.AddMemoryDiff).
func (s *Snapshot) Digest() string { return s.digest }

// Manifest returns a copy of the snapshot's manifest.
func (s *Snapshot) Manifest() Manifest {
	m := s.m
	m.Parts = append([]Part(nil), s.m.Parts...)
	if s.m.Metadata != nil {
		m.Metadata = make(map[string]string, len(s.m.Metadata))
		for k, v := range s.m.Metadata {
			m.Metadata[k] = v
		}
	}
	return m
}

// Part returns the manifest entry of the part called name.
func (s *Snapshot) Part(name string) (Part, bool) {
	op, ok := s.parts[name]
	if !ok {
		return Part{}, false
	}
	return op.Part, true
}

// lookup returns the part called name, which must be of kind k.
func (s *Snapshot) lookup(name string, k Kind) (*openPart, error) {
	op, ok := s.parts[name]
	if !ok {
		return nil, fmt.Errorf("snapshot %s: part %q: %w", s.dir, name, ErrNoPart)
	}
	if op.Kind != k {
		return nil, partErrorf(s.dir, &op.Part, "%w of kind %s: it is a %s part", ErrNoPart, k, op.Kind)
	}
	return op, nil
}

// State decodes the state part called name into v (encoding/json: fields
// v lacks are ignored, fields the part lacks left as they are). Its bytes
// were checked by Open.
func (s *Snapshot) State(name string, v any) error {
	op, err := s.lookup(name, KindState)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(op.data, v); err != nil {
		return partErrorf(s.dir, &op.Part, "decode: %w", err)
	}
	return nil
}

// File returns a reader of the blob part called name. It checks the
// SHA-256 as it goes: at the end it returns ErrCorrupt instead of io.EOF
// when the bytes do not match, so a caller must read to io.EOF before
// trusting any of them.
func (s *Snapshot) File(name string) (io.ReadCloser, error) {
	op, err := s.lookup(name, KindBlob)
	if err != nil {
		return nil, err
	}
	return &blobReader{r: io.NewSectionReader(op.f, 0, op.Size), h: sha256.New(), s: s, p: &op.Part}, nil
}

// blobReader reads a blob part and checks its SHA-256 at the end.
type blobReader struct {
	r *io.SectionReader
	h hash.Hash
	s *Snapshot
	p *Part
}

func (b *blobReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.h.Write(p[:n])
	if err == io.EOF && hex.EncodeToString(b.h.Sum(nil)) != b.p.SHA256 {
		return n, partErrorf(b.s.dir, b.p, "%w: content does not match its SHA-256", ErrCorrupt)
	}
	return n, err
}

// Close does nothing: the file is the Snapshot's.
func (b *blobReader) Close() error { return nil }

// Verify reads every part again, from the directory, memory included, and
// checks each against its checksum. It reports every part at fault
// (errors.Join). Its cost grows with the data in the snapshot (holes are
// skipped), which is why Open leaves memory to it.
func (s *Snapshot) Verify() error {
	var errs []error
	for i := range s.m.Parts {
		if err := s.verifyPart(&s.m.Parts[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// verifyPart opens p's file afresh and checks its checksum.
func (s *Snapshot) verifyPart(p *Part) error {
	f, err := s.openChecked(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var sum string
	switch p.Kind {
	case KindMemory:
		if sum, err = digestSparse(f, p.Size); err != nil {
			return partErrorf(s.dir, p, "read: %w", err)
		}
	default:
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(f, 0, p.Size)); err != nil {
			return partErrorf(s.dir, p, "read: %w", err)
		}
		sum = hex.EncodeToString(h.Sum(nil))
	}
	if sum != p.SHA256 {
		return partErrorf(s.dir, p, "%w: content does not match its SHA-256", ErrCorrupt)
	}
	if p.Kind == KindMemoryDiff {
		if _, err := readBitmap(f, p); err != nil {
			return partErrorf(s.dir, p, "%w", err)
		}
	}
	return nil
}
