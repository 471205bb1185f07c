// Package initramfs writes Linux initramfs images: cpio archives in the
// "newc" format (magic "070701"), optionally gzip-compressed, as the kernel's
// init/initramfs.c unpacks them and as documented in the kernel's
// Documentation/driver-api/early-userspace/buffer-format.rst.
//
// Each entry is a 110-byte ASCII header (the magic and thirteen 8-digit
// hexadecimal fields), the NUL-terminated path name padded so that header plus
// name end on a 4-byte boundary, then the file data padded to a 4-byte
// boundary. The archive ends with an entry named "TRAILER!!!".
//
// The Writer emits directories, regular files, symbolic links and device
// nodes with deterministic metadata (mtime 0, owner root, inode numbers
// counting from 1), so the same inputs always produce the same bytes. It does
// not write hard links. The kernel creates entries in archive order without
// creating missing parents, so the Writer refuses an entry whose parent
// directory has not been written before it, and refuses duplicate paths.
//
// Writer methods must not be called concurrently.
package initramfs
