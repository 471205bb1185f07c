package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/internal/clibase"
)

// initramfsCommand writes the image that exec boots, for a VM started
// with `microvm run` (and reached with `microvm agent`).
func initramfsCommand() *cli.Command {
	return &cli.Command{
		Name:         "initramfs",
		Usage:        initramfsUsage,
		UsageText:    "microvm initramfs -o OUT [--agent PATH] [--busybox PATH] [--add SRC:DST]...",
		OnUsageError: onUsageError,
		Flags: concatFlags([]cli.Flag{
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "the file to write (through OUT.tmp, renamed when complete) (required)"},
		}, cliFlags(clibase.ImageFlags())),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return clibase.Usagef("initramfs: unexpected argument %q", c.Args().First())
			}
			out := c.String("output")
			if out == "" {
				return clibase.Usagef("initramfs: -o OUT is required")
			}
			img, err := readImageFlags(c)
			if err != nil {
				return err
			}
			if st, err := os.Stat(filepath.Dir(out)); err != nil {
				return fmt.Errorf("initramfs: -o %s: %w", out, err)
			} else if !st.IsDir() {
				return fmt.Errorf("initramfs: -o %s: %s is not a directory", out, filepath.Dir(out))
			}
			if st, err := os.Stat(out); err == nil && st.IsDir() {
				return fmt.Errorf("initramfs: -o %s: is a directory", out)
			}
			if err := agentimage.WriteFile(out, img); err != nil {
				return fmt.Errorf("initramfs: %w", err)
			}
			return nil
		},
	}
}

func readImageFlags(c *cli.Context) (agentimage.Options, error) {
	o := agentimage.Options{Agent: c.String("agent"), Busybox: c.String("busybox")}
	for _, a := range listValues(c, "add") {
		f, err := agentimage.ParseAdd(a)
		if err != nil {
			return o, clibase.UsageError{Err: err}
		}
		o.Files = append(o.Files, f)
	}
	if o.Agent == "" {
		o.Agent = filepath.Join(clibase.BinDir(), "microvm-agent")
	}
	return o, nil
}

// listValues is a clibase.ListFlag's values (nil when the flag is not defined).
func listValues(c *cli.Context, name string) []string {
	if l, ok := c.Generic(name).(*clibase.ListFlag); ok {
		return l.Vals
	}
	return nil
}
