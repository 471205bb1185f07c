package main

import (
	"os"
	"strings"
	"testing"
)

// A smaps_rollup of Linux 6.x, abridged.
const rollup = `55d7a0a00000-7ffd2b5fe000 ---p 00000000 00:00 0                          [rollup]
Rss:               16256 kB
Pss:                7123 kB
Pss_Dirty:          2700 kB
Pss_Anon:           2652 kB
Pss_File:           4471 kB
Pss_Shmem:             0 kB
Shared_Clean:      13400 kB
Shared_Dirty:          0 kB
Private_Clean:       120 kB
Private_Dirty:      2736 kB
Referenced:        16256 kB
Anonymous:          2652 kB
Swap:                  0 kB
`

func TestParseSmapsRollup(t *testing.T) {
	got, err := parseSmapsRollup(strings.NewReader(rollup))
	if err != nil {
		t.Fatal(err)
	}
	want := memUse{RSS: 16256 << 10, PSS: 7123 << 10, PSSAnon: 2652 << 10, PSSFile: 4471 << 10, PrivateDirty: 2736 << 10}
	if got != want {
		t.Errorf("parse:\n got %+v\nwant %+v", got, want)
	}
	for name, bad := range map[string]string{
		"empty":       "",
		"no Pss":      "Rss: 4 kB\n",
		"not kB":      "Rss: 4 MB\nPss: 4 kB\n",
		"not integer": "Rss: x kB\nPss: 4 kB\n",
	} {
		if _, err := parseSmapsRollup(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestReadMemUseSelf(t *testing.T) {
	u, err := readMemUse(os.Getpid())
	if err != nil {
		t.Skipf("no smaps_rollup here: %v", err)
	}
	if u.RSS <= 0 || u.PSS <= 0 || u.PSS > u.RSS {
		t.Errorf("this process: %+v; want 0 < PSS <= RSS", u)
	}
}

func TestMemUseAdd(t *testing.T) {
	a := memUse{RSS: 1, PSS: 2, PSSAnon: 3, PSSFile: 4, PSSShmem: 5, PrivateDirty: 6}
	a.add(a)
	if want := (memUse{RSS: 2, PSS: 4, PSSAnon: 6, PSSFile: 8, PSSShmem: 10, PrivateDirty: 12}); a != want {
		t.Errorf("add: got %+v, want %+v", a, want)
	}
}
