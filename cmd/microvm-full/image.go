package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/images"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/namedvm"
)

// imageCommand is `microvm image pull|import|ls|rm`: OCI and Docker images
// turned into read-only ext4 root file systems, kept by digest under
// $MICROVM_STATE_DIR/images (internal/image).
func imageCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "image",
		Usage:        imageUsage,
		OnUsageError: onUsageError,
		Subcommands: []*cli.Command{
			{
				Name:         "pull",
				Usage:        "fetch an image from its registry and make its root file system",
				UsageText:    "microvm image pull [--platform OS/ARCH] [--quiet] REF",
				OnUsageError: onUsageError,
				Flags:        imagePullFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return clibase.Usagef("image pull: want one image reference (microvm image pull REF)")
					}
					log, err := clibase.SetupLog(c, stderr)
					if err != nil {
						return err
					}
					_ = log
					ctx, stop := clibase.Interruptible(context.Background())
					defer stop()
					lim, err := readImageLimits(c.String)
					if err != nil {
						return err
					}
					s, err := images.Open("")
					if err != nil {
						return clibase.Failure{Err: err}
					}
					img, err := pullImage(ctx, s, c.Args().First(), c.String("platform"), lim, stderr, c.Bool("quiet"))
					if err != nil {
						return clibase.Failure{Err: err}
					}
					fmt.Fprintf(stdout, "%s %s\n", shortID(img.ID), strings.Join(images.Familiar(img.Refs), " "))
					return nil
				},
			},
			{
				Name:         "import",
				Usage:        "store an image from a docker save tarball, an OCI archive or an OCI layout directory",
				UsageText:    "microvm image import [--name REF] [--platform OS/ARCH] FILE|DIR\nmicrovm image import --rootfs --name REF FILE",
				OnUsageError: onUsageError,
				Flags: append(imagePullFlags(),
					&cli.StringFlag{Name: "name", Usage: "the name to store it under (default: the tag the archive names)"},
					&cli.BoolFlag{Name: "rootfs", Usage: "FILE is a root file system tarball, plain or gzipped (mmdebstrap, docker export): a one-layer image, as docker import makes; needs --name"}),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return clibase.Usagef("image import: want one file or directory (microvm image import [--name REF] FILE|DIR)")
					}
					if c.Bool("rootfs") && c.String("name") == "" {
						return clibase.Usagef("image import --rootfs: a root file system tarball names no image: give --name REF")
					}
					if _, err := clibase.SetupLog(c, stderr); err != nil {
						return err
					}
					lim, err := readImageLimits(c.String)
					if err != nil {
						return err
					}
					ctx, stop := clibase.Interruptible(context.Background())
					defer stop()
					s, err := images.Open("")
					if err != nil {
						return clibase.Failure{Err: err}
					}
					o, done := imageOptions(c.String("platform"), lim, stderr, c.Bool("quiet"), "image import "+c.Args().First())
					var img *image.Image
					if c.Bool("rootfs") {
						img, err = s.ImportRootfsWith(ctx, c.Args().First(), c.String("name"), images.Config{}, o)
					} else {
						img, err = s.ImportWith(ctx, c.Args().First(), c.String("name"), o)
					}
					done()
					if err != nil {
						return clibase.Failure{Err: limitHint(fmt.Errorf("image %w", err))} // "import PATH: ..."
					}
					fmt.Fprintf(stdout, "%s %s\n", shortID(img.ID), strings.Join(images.Familiar(img.Refs), " "))
					return nil
				},
			},
			{
				Name:         "ls",
				Usage:        "list the stored images",
				UsageText:    "microvm image ls [--json]",
				OnUsageError: onUsageError,
				Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "one JSON array of the images, for machines"}},
				Action: func(c *cli.Context) error {
					if c.NArg() > 0 {
						return clibase.Usagef("image ls takes no arguments")
					}
					s, err := images.Open("")
					if err != nil {
						return clibase.Failure{Err: err}
					}
					list, err := s.List()
					if err != nil {
						return clibase.Failure{Err: err}
					}
					return printImages(stdout, list, c.Bool("json"))
				},
			},
			{
				Name:         "rm",
				Usage:        "remove images by name or ID (VMs running one keep it until they end)",
				UsageText:    "microvm image rm REF...",
				OnUsageError: onUsageError,
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return clibase.Usagef("image rm: want at least one name or ID")
					}
					s, err := images.Open("")
					if err != nil {
						return clibase.Failure{Err: err}
					}
					var errs []error
					for _, ref := range c.Args().Slice() {
						if err := s.Remove(ref); err != nil {
							errs = append(errs, fmt.Errorf("image rm: %w", err))
						}
					}
					if err := errors.Join(errs...); err != nil {
						return clibase.Failure{Err: err}
					}
					return nil
				},
			},
		},
	}
}

func imagePullFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "platform", Value: "linux/amd64", Usage: "the platform to take from a multi-platform image"},
		&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress bar"},
	}, append(imageLimitFlags(), cliFlags(clibase.LogFlags())...)...)
}

// imageLimits are the flags and environment variables that raise the
// store's limits on what one image may unpack to (image.Options): an
// image is made by whoever publishes it, and its digests bound nothing.
// Each refusal names the one to raise. The defaults are the store's.
var imageLimits = []struct {
	limit, flag, env, usage string
	def                     int64
	size                    bool
}{
	{image.LimitBytes, "max-size", "MICROVM_IMAGE_MAX_SIZE", "the most an image may unpack to: its layers' uncompressed tar stream, and its files at their full size", image.DefaultMaxBytes, true},
	{image.LimitEntries, "max-entries", "MICROVM_IMAGE_MAX_ENTRIES", "the most tar entries (files, directories, links) an image's layers may hold", image.DefaultMaxEntries, false},
	{image.LimitMetaBytes, "max-meta", "MICROVM_IMAGE_MAX_META", "the most names and xattrs held in memory while an image is unpacked", image.DefaultMaxMetaBytes, true},
}

func imageLimitFlags() []cli.Flag {
	var out []cli.Flag
	for _, l := range imageLimits {
		def := strconv.FormatInt(l.def, 10)
		if l.size {
			def = microvm.FormatSize(uint64(l.def))
		}
		out = append(out, &cli.StringFlag{Name: l.flag, EnvVars: []string{l.env},
			Usage: l.usage + " (default " + def + "; off for none)"})
	}
	return out
}

// imageLimitValues are the limits given, 0 where none is (the store's
// default), -1 for off.
type imageLimitValues map[string]int64

// readImageLimits reads the limit flags through get: c.String, which
// falls back to the environment, or envFlag where there are no flags
// (an image pulled for exec --image and run --image).
func readImageLimits(get func(flag string) string) (imageLimitValues, error) {
	out := imageLimitValues{}
	for _, l := range imageLimits {
		v := strings.TrimSpace(get(l.flag))
		if v == "" {
			continue
		}
		if v == "off" {
			out[l.limit] = -1
			continue
		}
		var n uint64
		var err error
		if l.size {
			n, err = microvm.ParseBytes(v)
		} else {
			n, err = strconv.ParseUint(v, 10, 63)
		}
		if err != nil || n == 0 || n > math.MaxInt64 {
			want := "number"
			if l.size {
				want = "SIZE (e.g. 128G)"
			}
			return nil, clibase.Usagef("--%s (or $%s) %q: want a positive %s, or off", l.flag, l.env, v, want)
		}
		out[l.limit] = int64(n)
	}
	return out, nil
}

// envFlag is a limit flag's value from its environment variable alone.
func envFlag(flag string) string {
	for _, l := range imageLimits {
		if l.flag == flag {
			return os.Getenv(l.env)
		}
	}
	return ""
}

// limitHint adds to an image refused for a limit the flag and variable
// that raise it, so that its one line says how to allow it.
func limitHint(err error) error {
	var le *image.LimitError
	if !errors.As(err, &le) {
		return err
	}
	for _, l := range imageLimits {
		if l.limit == le.Limit {
			return fmt.Errorf("%w; nothing was stored: --%s or $%s raises the limit", err, l.flag, l.env)
		}
	}
	return err
}

// shortID is the image ID as ls shows it.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// pullImage pulls ref into s with a progress bar on a terminal.
func pullImage(ctx context.Context, s *images.Store, ref, platform string, lim imageLimitValues, stderr io.Writer, quiet bool) (*image.Image, error) {
	o, done := imageOptions(platform, lim, stderr, quiet, "image pull "+ref)
	img, err := s.PullWith(ctx, ref, o)
	done()
	if err != nil {
		return nil, limitHint(fmt.Errorf("image %w", err)) // the store's error starts "pull REF: "
	}
	return img, nil
}

// findImage is the image --image names (images.Store.Find): from the
// CLI's store, else pulled from its registry, as docker run does, with
// the limits of the environment (there are no limit flags).
func findImage(ctx context.Context, ref string, stderr io.Writer, quiet bool) (*image.Image, error) {
	s, err := images.Open("")
	if err != nil {
		return nil, err
	}
	return s.Find(ctx, ref, func(ctx context.Context, ref string) (*image.Image, error) {
		lim, err := readImageLimits(envFlag)
		if err != nil {
			return nil, err
		}
		return pullImage(ctx, s, ref, "", lim, stderr, quiet)
	})
}

// imageOptions are the store's options with a progress callback that, on a
// terminal and without --quiet, shows the phase and a bar after a second.
// done ends the progress line.
func imageOptions(platform string, lim imageLimitValues, stderr io.Writer, quiet bool, what string) (image.Options, func()) {
	var phase atomic.Value
	phase.Store("")
	var doneB, totalB atomic.Int64
	o := image.Options{Platform: platform, Progress: func(p image.Progress) {
		phase.Store(p.Phase)
		doneB.Store(p.Done)
		totalB.Store(p.Total)
	}}
	o.MaxBytes, o.MaxEntries, o.MaxMetaBytes = lim[image.LimitBytes], lim[image.LimitEntries], lim[image.LimitMetaBytes]
	stop := startProgressDetail(stderr, quiet, what, func() string {
		return progressBar(phase.Load().(string), doneB.Load(), totalB.Load())
	})
	return o, stop
}

// phaseWords say what a phase of the store is doing.
var phaseWords = map[string]string{
	image.PhaseDownload: "downloading",
	image.PhaseRead:     "reading layers",
	image.PhaseConvert:  "making the ext4 root file system",
}

// progressBar formats one phase's progress: "downloading 12.0/48.0 MiB
// [#####.....] 25%", or the phase alone when its total is unknown.
func progressBar(phase string, done, total int64) string {
	if phase == "" {
		return ""
	}
	if w, ok := phaseWords[phase]; ok {
		phase = w
	}
	if total <= 0 || phase == phaseWords[image.PhaseConvert] {
		return phase
	}
	done = min(done, total)
	const width = 20
	n := int(done * width / total)
	return fmt.Sprintf("%s %.1f/%.1f MiB [%s%s] %d%%", phase, float64(done)/(1<<20), float64(total)/(1<<20),
		strings.Repeat("#", n), strings.Repeat(".", width-n), done*100/total)
}

// printImages is `microvm image ls`.
func printImages(w io.Writer, list []image.Image, asJSON bool) error {
	if asJSON {
		if list == nil {
			list = []image.Image{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSIZE\tCREATED")
	for _, img := range list {
		refs := images.Familiar(img.Refs)
		if len(refs) == 0 {
			refs = []string{"<none>"}
		}
		for _, r := range refs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\n", r, shortID(img.ID), microvm.FormatSize(uint64(img.Size)),
				time.Since(img.Created).Round(time.Second))
		}
	}
	return tw.Flush()
}

// applyImage is namedvm.ImageProcess (docker run's rules for an image's
// command) with its one refusal as a usage error: the command line must
// give the command.
func applyImage(cfg image.Config, args, envFlags []string, workdir string) (namedvm.Process, error) {
	p, err := namedvm.ImageProcess(cfg, args, envFlags, workdir)
	if errors.Is(err, namedvm.ErrNoCommand) {
		return p, clibase.UsageError{Err: fmt.Errorf("%w: give a command (-- CMD [ARG...])", err)}
	}
	return p, err
}

// envFlags reads --env values: K=V sets K; a bare K passes microvm's own
// $K when it is set, and nothing when not, as docker run -e K does. A
// secret (a CI runner's registration, a token) so reaches the guest's
// command without standing on a command line, which every local user can
// read in /proc; a process's environment only its owner can.
func envFlags(vals []string) ([]string, error) {
	var env []string
	for _, e := range vals {
		k, _, hasValue := strings.Cut(e, "=")
		if k == "" || strings.ContainsRune(k, 0) {
			return nil, clibase.Usagef("--env %q: want K=V, or K to pass microvm's own $K", e)
		}
		if hasValue {
			env = append(env, e)
		} else if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env, nil
}

// readRootImageFlags checks --image and --overlay-size against the other
// flags and returns the overlay size; with --image the agent image needs
// no busybox (the image has its own programs) unless --busybox asks.
func readRootImageFlags(c *cli.Context, agent *agentimage.Options, hasRoot bool) (uint64, error) {
	if c.String("image") == "" {
		if clibase.IsSet(c, "overlay-size") {
			return 0, clibase.Usagef("--overlay-size: only with --image")
		}
		return 0, nil
	}
	switch {
	case hasRoot:
		return 0, clibase.Usagef("--image and --root both name the root file system: give one")
	case clibase.IsSet(c, "initrd"):
		return 0, clibase.Usagef("--image boots the agent's initramfs: --initrd cannot replace it")
	case clibase.IsSet(c, "add"):
		return 0, clibase.Usagef("--add puts files in the initramfs, which --image leaves for the image's root: copy them in with microvm cp, or build them into the image")
	}
	if !clibase.IsSet(c, "busybox") {
		agent.Busybox = ""
	}
	var size uint64
	if v := c.String("overlay-size"); v != "" {
		var err error
		if size, err = microvm.ParseSize(v); err != nil || size < 1<<20 {
			return 0, clibase.Usagef("--overlay-size %q: want a SIZE of at least 1M", v)
		}
	}
	return size, nil
}
