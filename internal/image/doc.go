// Package image keeps a store of OCI and Docker images converted into
// read-only ext4 root filesystems that a microVM boots from.
//
// Data flow, for Pull (Import differs only in where the image comes from):
//
//	ref "debian:12"
//	  -> name.ParseReference: index.docker.io/library/debian:12 (the stored name)
//	  -> remote.Get: a manifest, or an index from which Options.Platform's
//	     manifest is picked (pull.go; an index without it is an error that
//	     lists what it has)
//	  -> config digest = image ID; stored already? then only the name is
//	     added and nothing is downloaded (convert.go: Store.add)
//	  -> layers, each wrapped (verify.go) to count progress and check the
//	     blob against its digest and the uncompressed tar against its
//	     diff_id: a mismatch is ErrDigest
//	  -> mutate.Extract: one flattened tar stream, top layer first, with
//	     whiteouts and opaque directories applied and unsafe paths refused
//	  -> unpack (unpack.go): the stream written into tmp/<work>/rootfs
//	     through an os.Root, so nothing lands outside it; hard links and
//	     directory modes and times are applied last; device nodes and
//	     FIFOs are counted, not made; owners and xattrs are recorded, not
//	     applied
//	  -> resolveUser (user.go): the config's User against the staged
//	     /etc/passwd and /etc/group
//	  -> planFS (ext4.go): the ext4 size and inode count from the staged
//	     tree, and a debugfs script for owners, modes and xattrs
//	  -> mke2fs -d: tmp/<work>/out/rootfs.ext4; the staging tree removed
//	  -> debugfs -w -f script: owners, modes, xattrs set in the ext4
//	  -> rootfs.ext4 made 0444, image.json written, tmp/<work>/out renamed
//	     to images/<ID> and the name written to refs.json, under the
//	     store's lock (store.go)
//
// Import reads a docker save tarball through tarball.Image, an OCI
// archive by unpacking it into the work directory, and an OCI layout
// directory in place (import.go).
//
// Until the rename nothing is visible: a failed, cancelled or crashed pull
// leaves only its work directory, removed on the way out or, after a
// crash, by Open an hour later.
//
// Limitations: device nodes, FIFOs and sockets are not created (counted
// in Image.Skipped); a hard link whose target an upper layer deleted is
// lost, as mutate.Extract drops the target's content (also counted), and
// one whose target an upper layer replaced links to the new file; a
// path debugfs cannot parse (one holding a newline or carriage return)
// keeps the owner and mode it was staged with (counted in
// Image.MetaSkipped).
package image
