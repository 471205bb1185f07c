package containerdshim

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/dirtar"
)

// guestDir is where the agent keeps a container's files in the guest (its
// tmpfs /run; the agent removes the directory when the container's init
// exits, and it goes with the VM otherwise).
func guestDir(id string) string { return "/run/microvm-agent/containers/" + id }

// putTree copies the host tree (or file) src into the guest directory dst
// as a tar archive streamed through the agent's PutTree.
func putTree(ctx context.Context, c *agentapi.Client, src, dst string) error {
	pr, pw := io.Pipe()
	go func() {
		_, err := dirtar.Write(pw, src)
		pw.CloseWithError(err)
	}()
	_, err := c.PutTree(ctx, dst, pr)
	pr.CloseWithError(io.ErrClosedPipe) // ends the writer if PutTree stopped early
	if err != nil {
		return fmt.Errorf("copy %s into the guest: %w", src, err)
	}
	return nil
}

// copyBinds copies into the guest the source of each bind mount of s that
// binds has no guest path for yet (the shared directory's volumes have:
// bindVolumes), that is CRI's /etc/hosts, /etc/resolv.conf, /etc/hostname
// and /dev/shm and file volumes, below guestDir(id)/mounts, and adds the
// guest path to bind for each to binds, by the mount's index. The copy is
// taken once, at Create: docs/containerd.md says what that means.
func copyBinds(ctx context.Context, c *agentapi.Client, id string, s *specs.Spec, binds map[int]string) error {
	for i, m := range s.Mounts {
		if _, done := binds[i]; done || !isBind(m) {
			continue
		}
		fi, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("%w: mount %s: source: %w", errdefs.ErrInvalidArgument, m.Destination, err)
		}
		dst := path.Join(guestDir(id), "mounts", strconv.Itoa(i))
		if err := putTree(ctx, c, m.Source, dst); err != nil {
			return fmt.Errorf("mount %s: %w", m.Destination, err)
		}
		if !fi.IsDir() {
			dst = path.Join(dst, filepath.Base(m.Source)) // dirtar names a file by its base name
		}
		binds[i] = dst
	}
	return nil
}
