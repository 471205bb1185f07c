package main

import (
	"debug/elf"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// kmodIndex maps module names (as modinfo and depends= spell them: '-'
// becomes '_') to their .ko files under a kernel's /lib/modules/VERSION.
type kmodIndex map[string]string

// indexModules finds every .ko file under dir.
func indexModules(dir string) (kmodIndex, error) {
	idx := kmodIndex{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			idx[modName(filepath.Base(p))] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kernel modules in %s: %w", dir, err)
	}
	if len(idx) == 0 {
		return nil, fmt.Errorf("no kernel modules (.ko) in %s (compressed modules are not supported)", dir)
	}
	return idx, nil
}

func modName(file string) string {
	return strings.ReplaceAll(strings.TrimSuffix(file, ".ko"), "-", "_")
}

// moduleDepends reads the depends= entry of a module's .modinfo section:
// the modules it needs loaded first.
func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("%s: no .modinfo section", path)
	}
	b, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf("%s: .modinfo: %w", path, err)
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "depends="); ok {
			var deps []string
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					deps = append(deps, modName(d))
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}

// loadOrder returns the files of the named modules and everything they
// depend on, each after its dependencies, each once.
func (idx kmodIndex) loadOrder(names []string) ([]string, error) {
	var order []string
	state := map[string]int{} // 1: visiting, 2: done
	var visit func(name string, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("module %s: dependency cycle", name)
		case 2:
			return nil
		}
		p, ok := idx[name]
		if !ok {
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) not found", name, from)
			}
			return fmt.Errorf("module %s not found", name)
		}
		state[name] = 1
		deps, err := moduleDepends(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, p)
		return nil
	}
	for _, n := range names {
		if err := visit(modName(n), ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}
