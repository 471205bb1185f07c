package main

import (
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/execvm"
)

// checkWarmStart refuses what --snapshot cannot do yet, as usage errors,
// then has execvm compute the machine's key and look at dir
// (execvm.CheckWarmStart; docs/snapshot.md, "Warm start").
func (o *execOpts) checkWarmStart(dir string) (*execvm.WarmStart, error) {
	for _, d := range o.devices.Disks {
		if !d.ReadOnly && !d.CopyOnWrite {
			return nil, clibase.Usagef("--snapshot: disk %s takes writes, which would reach the image every clone starts from: give it readonly or cow", d.Path)
		}
	}
	switch d := o.devices; {
	case len(d.Shares) > 0:
		return nil, clibase.Usagef("--snapshot: not with shared directories (--share) yet: a restored guest's open files there are lost")
	case o.root != "":
		return nil, clibase.Usagef("--snapshot: not with --chroot")
	}
	return execvm.CheckWarmStart(dir, o.machineConfig("", nil), o.image)
}
