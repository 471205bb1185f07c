// Package snapshot is the on-disk format of a microvm snapshot: a paused
// VM's complete state (KVM's, each device's, guest memory) in a directory
// that is written whole or not at all, and that Open refuses whole when
// any part of it is missing, short, corrupt or of a newer format, so that
// nothing is ever half-restored. The package knows nothing of KVM or the
// devices: the caller hands it plain values (kvm.VCPUState, a device's
// state struct) and byte slices (guest memory).
//
// A snapshot is a directory (mode 0700, files 0600: guest memory holds the
// guest's secrets):
//
//	manifest.json  format name, version, creation time, the caller's
//	               metadata, and per part: name, file, kind, size, SHA-256
//	NAME.json      a state part (AddState): one JSON document
//	NAME.bin       a blob part (AddFile): opaque bytes
//	NAME.mem       a memory part (AddMemory): sparse, of the guest's size
//	NAME.diff      a memory diff part (AddMemoryDiff): bitmap, dirty pages
//
// Data flow, saving (vCPUs out of KVM_RUN, devices quiesced):
//
//	Create(DIR) -> .DIR.tmp-XXXX made beside DIR
//	  -> AddState(name, v): json.Marshal(v) -> NAME.json; SHA-256 of it
//	  -> AddFile(name, r): r to EOF -> NAME.bin; SHA-256 of it
//	  -> AddMemory(name, mem): NAME.mem truncated to len(mem); each 4 KiB
//	     page all zero -> left a hole, else added to the memory digest and
//	     gathered into a run, each run pwritten at its offset
//	  -> AddMemoryDiff(name, base, mem, dirty): NAME.diff = the dirty
//	     bitmap, then the dirty pages packed; SHA-256 of it; base's digest
//	  (each part's file fsynced as it is added)
//	  -> Commit: manifest.json written and fsynced, the directory fsynced,
//	     renamed to DIR (rename(2), atomic; onto an existing snapshot only
//	     with Overwrite, by renameat2 RENAME_EXCHANGE, then the old one is
//	     removed), DIR's parent fsynced
//	  -> or Abort (also after any failure): the temporary directory removed
//
// Data flow, restoring:
//
//	Open(DIR) -> os.OpenRoot(DIR): no part's file is opened outside it
//	  -> manifest.json: a regular file of at most 1 MiB; its format name
//	     (else ErrFormat), then its version (newer: ErrNewerVersion), then
//	     every field against its bound (ErrFormat)
//	  -> each part's file: a regular file of the manifest's size (missing
//	     or short: ErrTruncated); state parts read and checked against
//	     their SHA-256 (ErrCorrupt) and kept; other files kept open
//	  -> State(name, &v): json.Unmarshal of the checked bytes
//	  -> MapMemory(name): mmap MAP_PRIVATE of NAME.mem, nothing read
//	  -> ApplyDiff(mem, name, base) / MapMemoryChain(name, base, diff...):
//	     the diff's pages read into the mapping, its SHA-256 checked
//	  -> Verify (optional): every part read again and checked, memory too
//
// State parts are JSON (encoding/json), not gob. Both tolerate fields added
// or removed between versions (matched by name; unknown ones ignored,
// missing ones zero). JSON is chosen because a snapshot may come from an
// untrusted place and encoding/gob says it is not hardened against
// adversarial input, while encoding/json allocates in proportion to its
// input, which Open bounds; and because a JSON part can be read and
// compared with jq without Go. The price is size (a [1024]uint32 XSAVE
// area becomes a list of numbers, some 10 KiB) and speed, both small
// beside guest memory. Numbers are exact: uint64 fields round-trip through
// encoding/json (a tool reading them as float64 would not).
//
// Memory checksum. Hashing a multi-GiB memory on every restore would make
// restore time grow with memory, so Open does not: only Verify reads
// memory. The digest is over the memory's content, not the file's bytes:
// SHA-256 of a header (the format and the size), then the offset and
// bytes of each page that holds a non-zero byte, in order (memDigest).
// Zero pages are seen (compared with zeros) but never hashed or written,
// so saving costs a hash of the data, not of the whole memory; and the
// digest does not depend on where the file system keeps holes, which a
// copy (cp, tar, rsync) may fill or punch differently. Verify walks the
// file with SEEK_DATA/SEEK_HOLE and reads only its data.
//
// Memory diffs are a compact file (the bitmap of ceil(pages/64) little
// endian words, then the marked pages packed in ascending order), not a
// sparse file of the full size: a dirty page that is now zero must still
// be written over the base, which a hole cannot say without trusting the
// file system's hole map; the compact file survives any copy, costs
// disk space in proportion to the pages dirtied, and is read in one pass.
// It records the digest of its base snapshot's manifest (which names every
// part's checksum, so it identifies the base's content); ApplyDiff refuses
// any other base (ErrWrongBase) before touching memory. A chain base,
// diff1, diff2 is restored by MapMemoryChain, each diff against the one
// before it. The dirty bitmap is the caller's: KVM's dirty log
// (kvm.VM.DirtyLog) since the previous snapshot, plus the pages the VMM
// wrote itself (device models), which that log does not see.
//
// Trust. Everything read is bounded: the manifest (MaxManifestSize), the
// parts (MaxParts), names and files ([A-Za-z0-9._-], no "..", no leading
// dot, never the manifest), metadata, sizes (MaxStateSize, MaxMemorySize,
// a diff's size derived from its page count), and state parts in all.
// Files are opened through an os.Root (no path or symlink leaves the
// directory), non-blocking (a planted FIFO cannot hang Open), and must be
// regular. The checksums catch accidents, not attackers: whoever can
// write the snapshot can write a matching manifest. A mapped memory file
// must not shrink while mapped (a page past its end faults).
//
// Versions. Version is 1. A change that alters how a part is read needs a
// new version, which older readers refuse with ErrNewerVersion rather
// than misread; a field added for information only does not (a reader
// ignores manifest fields it does not know). Each state part's own
// compatibility is its owner's, within JSON's field-by-name rules.
//
// Crashes. A crash before Commit's rename leaves only the temporary
// directory (.DIR.tmp-*), which nothing reads; its owner removes it.
//
// Goroutines: none. A Writer is used by one goroutine. A Snapshot's
// methods may run concurrently, except Close.
package snapshot
