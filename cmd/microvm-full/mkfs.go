package main

import (
	"context"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/image"
)

// mkfsCommand builds an ext4 image from a directory with e2fsprogs'
// mkfs.ext4 -d, for --disk and --root.
func mkfsCommand() *cli.Command {
	return &cli.Command{
		Name:         "mkfs",
		Usage:        mkfsUsage,
		UsageText:    "microvm mkfs -o IMAGE --size SIZE DIR",
		OnUsageError: onUsageError,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "o", Aliases: []string{"output"}, Usage: "the image to write (replaced if it exists)"},
			&cli.StringFlag{Name: "size", Usage: "image size: a number with an optional K/M/G/T suffix, a bare number means MiB (a multiple of 4K)"},
			&cli.StringFlag{Name: "label", Usage: "file system label"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return clibase.Usagef("mkfs: want one directory (microvm mkfs -o IMAGE --size SIZE DIR)")
			}
			out, dir := c.String("o"), c.Args().First()
			if out == "" || c.String("size") == "" {
				return clibase.Usagef("mkfs: -o IMAGE and --size SIZE are required")
			}
			size, err := microvm.ParseSize(c.String("size"))
			if err != nil {
				return clibase.Usagef("--size: %v", err)
			}
			if size == 0 || size%4096 != 0 {
				return clibase.Usagef("--size %s: want a non-zero multiple of 4K", c.String("size"))
			}
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				return clibase.Usagef("mkfs: %s is not a directory", dir)
			}
			return mkfs(out, dir, size, c.String("label"))
		},
	}
}

// mkfs writes the image (internal/image does it for the containerd shim
// too).
func mkfs(out, dir string, size uint64, label string) error {
	return image.WriteDirExt4(context.Background(), out, dir, size, label)
}
