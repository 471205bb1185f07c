package dockervm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/image"
)

// DefaultDiskSize is the data disk's size when --docker-disk names none:
// the file is sparse, so the host pays only for what Docker writes.
const DefaultDiskSize = 8 << 30

// DiskSerial is the data disk's virtio-blk serial, by which the guest
// finds it (/sys/block/vdX/serial) whatever other disks the VM has; it is
// also the file system's label.
const DiskSerial = "microvm-docker"

// Disk is Docker's data disk on the host: an ext4 image file that the
// guest mounts at /var/lib/docker.
type Disk struct {
	Path string
}

// CreateDisk makes an empty sparse ext4 image of size bytes at path, which
// must not exist: the data root of one VM, not a cache shared with others.
func CreateDisk(ctx context.Context, path string, size uint64) (Disk, error) {
	if _, err := os.Lstat(path); err == nil {
		return Disk{}, fmt.Errorf("docker disk: %s: %w", path, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Disk{}, fmt.Errorf("docker disk: %w", err)
	}
	empty, err := os.MkdirTemp(filepath.Dir(path), ".docker-empty-*")
	if err != nil {
		return Disk{}, fmt.Errorf("docker disk: %w", err)
	}
	defer os.RemoveAll(empty)
	if err := image.WriteDirExt4(ctx, path, empty, size, DiskSerial); err != nil {
		return Disk{}, fmt.Errorf("docker disk: %w", err)
	}
	return Disk{Path: path}, nil
}

// Config is the disk as a machine's Config.Disks entry, with the serial
// the guest finds it by.
func (d Disk) Config() microvm.DiskConfig {
	return microvm.DiskConfig{Path: d.Path, Serial: DiskSerial}
}

// Arg is the disk as the value of `microvm run --disk`, whose syntax
// splits at commas: the path must have none (the caller picks it, in its
// state directory).
func (d Disk) Arg() string {
	return "path=" + d.Path + ",serial=" + DiskSerial
}

// Remove deletes the disk's file, once the VM that used it is gone; a file
// that is already gone is fine.
func (d Disk) Remove() error {
	if err := os.Remove(d.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("docker disk: %w", err)
	}
	return nil
}
