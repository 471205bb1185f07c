package image

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// WriteDirExt4 writes an ext4 image of size bytes holding the tree under
// dir (e2fsprogs' mkfs.ext4 -d: files keep their owners, modes and times;
// the root directory is root's) to out.tmp and renames it to out once
// mkfs.ext4 succeeded, so out is whole or absent. `microvm mkfs` and the
// containerd shim's root file systems use it.
func WriteDirExt4(ctx context.Context, out, dir string, size uint64, label string) error {
	tool, err := findTool("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("mkfs: %w", err)
	}
	tmp := out + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("mkfs: %w", err)
	}
	err = f.Truncate(int64(size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs: %w", err)
	}
	// -F: the target is a regular file; -q: only errors; root_owner: files
	// keep their owners from dir, the root directory is root's.
	args := []string{"-q", "-F", "-t", "ext4", "-E", "root_owner=0:0", "-d", dir}
	if label != "" {
		args = append(args, "-L", label)
	}
	args = append(args, tmp)
	var msg strings.Builder
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stdout, cmd.Stderr = &msg, &msg
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs: %s %s: %v\n%s", tool, strings.Join(args, " "), err, strings.TrimSpace(msg.String()))
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs: %w", err)
	}
	return nil
}

// DirExt4Size is a size for WriteDirExt4 that holds the tree under dir
// with room to spare: each file rounded up to whole blocks, an inode per
// entry, 25% and 16 MiB on top (the journal and the metadata mkfs.ext4
// adds), rounded up to 1 MiB.
func DirExt4Size(dir string) (uint64, error) {
	var blocks, inodes uint64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		if d.Type().IsRegular() || d.Type()&fs.ModeSymlink != 0 {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			blocks += (uint64(fi.Size()) + blockSize - 1) / blockSize
		} else if d.IsDir() {
			blocks++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("mkfs: size of %s: %w", dir, err)
	}
	size := blocks*blockSize + inodes*inodeSize
	size += size/4 + 16<<20
	return (size + 1<<20 - 1) &^ (1<<20 - 1), nil
}
