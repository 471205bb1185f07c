package image

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/microvm/microvm/internal/atomicfile"
)

// source is an image on its way into the store.
type source struct {
	img v1.Image
	// compressed: the layer blobs' digests and sizes are known (registry,
	// OCI layout); they are verified and progress counts their bytes.
	compressed bool
	phase      string      // progress phase of reading the layers
	digest     string      // manifest digest, "" when there is none
	platform   v1.Platform // the platform asked for
}

// add stores src under names: when its ID is stored already it only
// gains the names; otherwise it is converted in a work directory (w, or a
// new one) and the result renamed into images/. Whatever fails, nothing is
// left visible and the work directory is removed.
func (s *Store) add(ctx context.Context, src source, names []string, w *workDir, o *Options) (*Image, error) {
	h, err := src.img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("image config digest: %w", err)
	}
	if h.Algorithm != "sha256" || !validID(h.Hex) {
		return nil, fmt.Errorf("image config digest %s: not sha256", h)
	}
	id := h.Hex
	cf, err := src.img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	plat, err := configPlatform(cf, src.platform)
	if err != nil {
		return nil, err
	}
	if im, ok, err := s.nameExisting(id, names); ok || err != nil {
		return im, err
	}
	if w == nil {
		if w, err = newWorkDir(s.path(tmpDir)); err != nil {
			return nil, err
		}
		defer w.remove()
	}
	meta := &Image{
		ID:       id,
		Digest:   src.digest,
		Platform: plat,
		Config: Config{
			Env:        cf.Config.Env,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
		},
	}
	out := w.join("out")
	if err := convert(ctx, src, w, out, meta, o); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.commit(id, out, names)
}

// convert turns src into out/rootfs.ext4 and out/image.json:
// mutate.Extract flattens the layers (verified by checkLayers as they are
// read) into one tar stream, unpack writes it to a staging directory,
// the image's user is resolved there, planFS sizes the ext4 and writes the
// debugfs script, mke2fs -d copies the tree, the staging directory goes,
// debugfs sets owners, modes and xattrs, and the file is made read-only.
func convert(ctx context.Context, src source, w *workDir, out string, meta *Image, o *Options) error {
	stagingDir := w.join("rootfs")
	if err := os.Mkdir(stagingDir, 0o755); err != nil {
		return fmt.Errorf("staging directory: %w", err)
	}
	defer removeTree(stagingDir)

	rep := newReporter(o.Progress, src.phase, 0)
	defer rep.close()
	img, total, err := checkLayers(src.img, src.compressed, rep)
	if err != nil {
		return err
	}
	rep.start(total)
	rc := mutate.Extract(img)
	st, err := unpack(ctx, rc, stagingDir, o)
	rc.Close()
	rep.close()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("unpack layers: %w", cerr)
		}
		return fmt.Errorf("unpack layers: %w", err)
	}
	meta.Skipped = st.skipped
	if st.skipped > 0 {
		o.logf("image: %d entries (device nodes, FIFOs, ...) not created", st.skipped)
	}

	root, err := os.OpenRoot(stagingDir)
	if err != nil {
		return fmt.Errorf("staging directory: %w", err)
	}
	meta.Config.UID, meta.Config.GID, err = resolveUser(root, meta.Config.User)
	root.Close()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}

	plan, err := planFS(st, w, o)
	if err != nil {
		return err
	}
	meta.MetaSkipped = plan.metaSkipped
	meta.ContentBytes = plan.contentBytes

	step := func(n int64) {
		if o.Progress != nil {
			o.Progress(Progress{Phase: PhaseConvert, Done: n, Total: 2})
		}
	}
	step(0)
	if err := os.Mkdir(out, 0o755); err != nil {
		return fmt.Errorf("image directory: %w", err)
	}
	rootfs := filepath.Join(out, rootfsName)
	if err := mkfs(ctx, plan, stagingDir, rootfs, o); err != nil {
		return err
	}
	if err := removeTree(stagingDir); err != nil {
		return fmt.Errorf("remove staging directory: %w", err)
	}
	step(1)
	if err := applyMeta(ctx, w, rootfs); err != nil {
		return err
	}
	step(2)

	if err := os.Chmod(rootfs, 0o444); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	f, err := os.Open(rootfs)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	fi, err := f.Stat()
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	meta.Size = fi.Size()
	meta.Created = time.Now().UTC().Truncate(time.Second)

	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", metaName, err)
	}
	if err := atomicfile.Write(filepath.Join(out, metaName), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", metaName, err)
	}
	return nil
}

// parsePlatform reads Options.Platform.
func parsePlatform(s string) (v1.Platform, error) {
	if s == "" {
		s = DefaultPlatform
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" {
		return v1.Platform{}, fmt.Errorf("platform %q: want os/arch[/variant], e.g. %s", s, DefaultPlatform)
	}
	return normalPlatform(*p), nil
}

// normalPlatform fills in the variant a platform implies (arm64 is v8).
func normalPlatform(p v1.Platform) v1.Platform {
	p.OS = strings.ToLower(p.OS)
	p.Architecture = strings.ToLower(p.Architecture)
	if p.Architecture == "arm64" && p.Variant == "" {
		p.Variant = "v8"
	}
	return p
}

// matches says whether an image for have runs as want.
func matches(have, want v1.Platform) bool {
	h, w := normalPlatform(have), normalPlatform(want)
	return h.OS == w.OS && h.Architecture == w.Architecture && (w.Variant == "" || h.Variant == w.Variant)
}

// configPlatform is the image's platform from its config, which must be
// the one asked for. A config that does not say is taken to be for it.
func configPlatform(cf *v1.ConfigFile, want v1.Platform) (string, error) {
	if cf.OS == "" && cf.Architecture == "" {
		return platformString(want), nil
	}
	have := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
	if !matches(have, want) {
		return "", fmt.Errorf("image is for %s, not %s", platformString(have), platformString(want))
	}
	return platformString(have), nil
}

func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
