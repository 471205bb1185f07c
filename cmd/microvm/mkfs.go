//go:build !microvm_lean

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm"
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
				return usagef("mkfs: want one directory (microvm mkfs -o IMAGE --size SIZE DIR)")
			}
			out, dir := c.String("o"), c.Args().First()
			if out == "" || c.String("size") == "" {
				return usagef("mkfs: -o IMAGE and --size SIZE are required")
			}
			size, err := microvm.ParseSize(c.String("size"))
			if err != nil {
				return usagef("--size: %v", err)
			}
			if size == 0 || size%4096 != 0 {
				return usagef("--size %s: want a non-zero multiple of 4K", c.String("size"))
			}
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				return usagef("mkfs: %s is not a directory", dir)
			}
			return mkfs(out, dir, size, c.String("label"))
		},
	}
}

// mkfs writes the image to out.tmp and renames it into place once
// mkfs.ext4 succeeded.
func mkfs(out, dir string, size uint64, label string) error {
	tool, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
			if _, serr := os.Stat(p); serr == nil {
				tool, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("mkfs: mkfs.ext4 not found (install e2fsprogs)")
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
	cmd := exec.Command(tool, args...)
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
